// Grammar mask benchmark: the time of one full token mask (GrammarMatcher::apply) at every step
// of a JSON document constrained by a JSON schema, for each vocabulary given.
//
//   cmake --build build --target kite-bench-grammar
//   build/bench/kite-bench-grammar [-v] [tokenizer (HF folder or .gguf) ...]   (-v: every step)
//
// Defaults: the llama-target test model (4096 tokens), llama.cpp's llama-spm (32000) and qwen2
// (151936) vocabularies from ../shared/testdata. The document is fed one token at a time, each
// the longest token the grammar allows that continues the text (so every kind of position is
// measured: keys, numbers, free text with non-ASCII characters, closing brackets). "cold" is
// the first pass with a fresh transition cache, "warm" a second pass over the same document
// (the cache of a long-running sequence). Times are per apply(), thread CPU time (the machine may
// be shared): median, p90, max.
#include "src/runtime/grammar/grammar.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <string>
#include <vector>

#include "formats/weight_source.h"
#include "src/runtime/tokenizer.h"

namespace {

using Clock = std::chrono::steady_clock;

// CPU time of this thread in ms: on a shared machine wall time mostly measures the scheduler.
double thread_ms() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

const char* kSchema = R"({
  "$defs": {
    "tag": {"type": "object", "properties": {"name": {"type": "string"}, "weight": {"type": "number"}},
            "required": ["name"]},
    "node": {"type": "object", "properties": {"id": {"type": "integer"},
             "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}}, "required": ["id"]}
  },
  "type": "object",
  "properties": {
    "id": {"type": "integer"},
    "name": {"type": "string", "maxLength": 40},
    "color": {"enum": ["red", "green", "blue"]},
    "active": {"type": "boolean"},
    "score": {"type": ["number", "null"]},
    "tags": {"type": "array", "items": {"$ref": "#/$defs/tag"}},
    "notes": {"type": "string"},
    "tree": {"$ref": "#/$defs/node"}
  },
  "required": ["id", "name", "tags"]
})";

const char* kDocument =
    R"({"id": 12345, "name": "Widget number one", "color": "green", "active": true, "score": 0.75, )"
    R"("tags": [{"name": "alpha", "weight": 1.5}, {"name": "beta"}], )"
    R"("notes": "The naïve café near 東京 station serves coffee — quickly, with \"style\".", )"
    R"("tree": {"id": 1, "children": [{"id": 2}, {"id": 3, "children": []}]}})";

struct Stats {
  double median, p90, max;
};

Stats stats(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v[v.size() * 9 / 10], v.back()};
}

// Feeds kDocument token by token; returns apply() times in ms.
std::vector<double> run_pass(const kite::GrammarMatcher& proto, const kite::TokenIndex& idx, bool verbose) {
  kite::GrammarMatcher m = proto;
  std::vector<float> logits(static_cast<size_t>(idx.n_vocab()));
  std::vector<double> times;
  const std::string doc = kDocument;
  size_t pos = 0;
  while (pos < doc.size()) {
    std::fill(logits.begin(), logits.end(), 0.0f);
    const double t0 = thread_ms();
    m.apply(logits);
    times.push_back(thread_ms() - t0);
    kite::TokenId best = kite::kNoToken;
    size_t best_len = 0;
    for (kite::TokenId id = 0; id < idx.n_vocab(); ++id) {
      const std::string_view b = idx.bytes(id);
      if (logits[id] == 0.0f && idx.is_text(id) && b.size() > best_len && doc.compare(pos, b.size(), b) == 0)
        best = id, best_len = b.size();
    }
    if (best == kite::kNoToken) {
      std::printf("  stuck at byte %zu of the document\n", pos);
      break;
    }
    if (verbose) std::printf("  %7.3f ms  before '%s'\n", times.back(), std::string(idx.bytes(best)).c_str());
    if (!m.accept(best).ok()) break;
    pos += best_len;
  }
  return times;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> paths;
  bool verbose = false;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "-v") {
      verbose = true;
    } else {
      paths.emplace_back(argv[i]);
    }
  }
  if (paths.empty())
    paths = {"../shared/testdata/models/llama-target", "../shared/testdata/vocab/ggml-vocab-llama-spm.gguf",
             "../shared/testdata/vocab/ggml-vocab-qwen2.gguf"};
  auto grammar = kite::Grammar::from_json_schema(kSchema);
  if (!grammar.ok()) {
    std::fprintf(stderr, "schema: %s\n", grammar.error().message.c_str());
    return 1;
  }
  std::printf("grammar mask benchmark: JSON schema document of %zu bytes, one thread\n", std::string(kDocument).size());
  for (const auto& path : paths) {
    auto src = kite::WeightSource::open(path);
    if (!src.ok()) {
      std::fprintf(stderr, "%s: %s\n", path.c_str(), src.error().message.c_str());
      return 1;
    }
    auto tok = kite::Tokenizer::load(src.value()->metadata());
    if (!tok.ok()) {
      std::fprintf(stderr, "%s: %s\n", path.c_str(), tok.error().message.c_str());
      return 1;
    }
    const auto t0 = Clock::now();
    auto idx = kite::TokenIndex::build(*tok.value());
    const double build_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    std::printf("\n%s\n  vocab %d, trie nodes %zu, index build %.1f ms\n", path.c_str(), idx->n_vocab(), idx->n_nodes(),
                build_ms);
    const kite::GrammarMatcher proto(grammar.value(), idx);
    const auto cold = run_pass(proto, *idx, verbose);
    const auto warm = run_pass(proto, *idx, false);
    const Stats c = stats(cold), w = stats(warm);
    std::printf("  %zu steps; apply() ms  cold: median %.3f p90 %.3f max %.3f   warm: median %.3f p90 %.3f max %.3f\n",
                cold.size(), c.median, c.p90, c.max, w.median, w.p90, w.max);
  }
  return 0;
}

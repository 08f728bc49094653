// Perplexity on real models: transformers' definition against reference.json, and llama.cpp's
// definition against llama-perplexity's numbers in peer-reference.json, for every GGUF file.
#include <doctest/doctest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "src/model/model.h"
#include "src/runtime/perplexity.h"
#include "src/runtime/tokenizer.h"
#include "tests/testdata.h"

using namespace kite;
using namespace kite::test;

namespace {

struct Loaded {
  std::shared_ptr<const Model> model;
  std::shared_ptr<const Tokenizer> tok;
  std::unique_ptr<Context> ctx;
};

Loaded load(const std::string& path, int64_t n_ctx) {
  auto src = WeightSource::open(path);
  REQUIRE_MESSAGE(src.ok(), (src.ok() ? std::string() : src.error().message));
  auto tok = Tokenizer::load((*src)->metadata());
  REQUIRE_MESSAGE(tok.ok(), (tok.ok() ? std::string() : tok.error().message));
  auto model = Model::from_source(std::move(*src));
  REQUIRE_MESSAGE(model.ok(), (model.ok() ? std::string() : model.error().message));
  ContextOptions opts;
  opts.n_ctx = n_ctx;
  auto ctx = Context::create(*model, opts);
  REQUIRE_MESSAGE(ctx.ok(), (ctx.ok() ? std::string() : ctx.error().message));
  return {*model, *tok, std::move(*ctx)};
}

// The held-out text of the testdata README, as reference.json's definition cuts it.
std::vector<TokenId> heldout_ids(const Tokenizer& tok) {
  EncodeOptions eo;
  eo.add_special = false;
  return tok.encode(read_file(testdata("heldout.txt")), eo);
}

}  // namespace

TEST_CASE("perplexity: transformers' definition matches reference.json within 0.5%") {
  for (const char* name : {"llama-target", "llama-draft", "qwen2-tiny", "qwen3-tiny"}) {
    const std::string dir = testdata(std::string("models/") + name);
    const auto ref = nlohmann::json::parse(read_file(dir + "/reference.json"))["perplexity"];
    Loaded l = load(dir, 256);
    const auto ids = heldout_ids(*l.tok);
    // chunk c = [BOS] + test_ids[255c : 255c+255], c = 0..31; every prediction scored.
    const int n_chunks = ref["chunks"].get<int>();
    REQUIRE(ids.size() >= static_cast<size_t>(255 * n_chunks));
    const auto first = ref["first_test_ids"].get<std::vector<int>>();
    for (size_t i = 0; i < first.size(); ++i) REQUIRE_MESSAGE(ids[i] == first[i], "heldout token ", i);
    std::vector<std::vector<TokenId>> chunks;
    for (int c = 0; c < n_chunks; ++c) {
      std::vector<TokenId> chunk = {l.tok->bos()};
      chunk.insert(chunk.end(), ids.begin() + 255 * c, ids.begin() + 255 * c + 255);
      chunks.push_back(std::move(chunk));
    }
    auto all = perplexity_chunks(*l.ctx, chunks, 0);
    REQUIRE_MESSAGE(all.ok(), (all.ok() ? std::string() : all.error().message));
    const double want = ref["ppl_all"].get<double>();
    MESSAGE(std::string(name), ": ppl_all ", all->ppl, " (transformers ", want, ")");
    CHECK(std::fabs(all->ppl / want - 1) < 0.005);
  }
}

namespace {

// Every file a reference lists (peer-reference.json's shape: file -> {ppl_ctx256, ...}) in `dir`.
void check_llama_cpp_ppl(const std::string& reference, const std::string& dir) {
  const auto peer = nlohmann::json::parse(read_file(reference));
  const std::string heldout = read_file(testdata("heldout.txt"));
  for (const auto& [file, ref] : peer.items()) {
    Loaded l = load(dir + "/" + file, 256);
    EncodeOptions eo;
    eo.add_special = false;
    std::vector<TokenId> tokens = l.tok->encode(heldout, eo);
    tokens.insert(tokens.begin(), l.tok->bos());
    auto r = perplexity_llama_cpp(*l.ctx, tokens, l.tok->bos(), 256);
    REQUIRE_MESSAGE(r.ok(), (r.ok() ? std::string() : r.error().message));
    const double want = ref["ppl_ctx256"].get<double>();
    MESSAGE(file, ": ", r->ppl, " (llama.cpp ", want, ", ", 100 * (r->ppl / want - 1), "%)");
    CHECK_MESSAGE(std::fabs(r->ppl / want - 1) < 0.005, file);
  }
}

}  // namespace

TEST_CASE("perplexity: every GGUF file within 0.5% of llama.cpp's ppl_ctx256") {
  check_llama_cpp_ppl(testdata("gguf/peer-reference.json"), testdata("gguf"));
}

// The codebook types (IQ1_S..IQ3_S), all in one llama.cpp-quantized file (tests/data/README.md).
TEST_CASE("perplexity: the IQ codebook mix within 0.5% of llama.cpp's ppl_ctx256") {
  const std::string dir = std::string(KITE_SOURCE_DIR) + "/tests/data";
  check_llama_cpp_ppl(dir + "/iq-mix-reference.json", dir);
}

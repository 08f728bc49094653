// kite embed -m MODEL [--pooling mean|last|cls] [--no-normalize] [--json] [-f FILE] [TEXT...]
//
// One embedding per TEXT argument, or per line of FILE (or of stdin when there are neither):
// the final hidden state after the final norm, pooled over the tokens (BOS included) and
// L2-normalized unless --no-normalize. Prints one JSON array per input and line, or with --json
// one document {"model", "pooling", "dim", "data": [[...], ...]}.
#include <charconv>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "src/runtime/embed.h"
#include "tools/commands.h"
#include "tools/common.h"

namespace kite::tools {
namespace {

struct EmbedArgs {
  ModelArgs model;
  std::vector<std::string> texts;
  std::string file;
  std::string pooling = "mean";
  bool no_normalize = false;
  bool json = false;
};

// The shortest text that reads back as the same float.
void append_float(std::string* out, float v) {
  char buf[32];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  out->append(buf, r.ptr);
}

std::string json_array(const std::vector<float>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += ',';
    append_float(&s, v[i]);
  }
  return s + "]";
}

// Lines of a stream: one input each (a final newline does not start another input; "\r\n" ends
// a line too).
std::vector<std::string> read_lines(std::istream& in) {
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(line);
  }
  return lines;
}

std::string model_name(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  const size_t slash = p.find_last_of('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

int run_embed(const EmbedArgs& a) {
  auto pooling = parse_pooling(a.pooling);
  if (!pooling) {
    std::fprintf(stderr, "kite embed: --pooling: %s\n", pooling.error().message.c_str());
    return kExitUsage;
  }
  if (!a.texts.empty() && !a.file.empty()) {
    std::fprintf(stderr, "kite embed: give TEXT arguments or -f FILE, not both\n");
    return kExitUsage;
  }
  std::vector<std::string> inputs = a.texts;
  if (!a.file.empty()) {
    std::ifstream f(a.file, std::ios::binary);
    if (!f) {
      std::fprintf(stderr, "kite embed: cannot read %s\n", a.file.c_str());
      return kExitFailure;
    }
    inputs = read_lines(f);
  } else if (a.texts.empty()) {
    inputs = read_lines(std::cin);
  }
  if (inputs.empty()) {
    std::fprintf(stderr, "kite embed: no input (give TEXT arguments, -f FILE or lines on stdin)\n");
    return kExitUsage;
  }
  auto loaded = load_model(a.model);
  if (!loaded) {
    std::fprintf(stderr, "kite embed: %s\n", loaded.error().message.c_str());
    return kExitFailure;
  }
  Loaded& l = *loaded;
  EmbedOptions opts;
  opts.pooling = *pooling;
  opts.normalize = !a.no_normalize;
  std::string doc;
  if (a.json) {
    const std::string name =
        nlohmann::json(model_name(a.model.model)).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    doc = "{\"model\":" + name + ",\"pooling\":\"" + pooling_name(*pooling) +
          "\",\"normalize\":" + (opts.normalize ? "true" : "false") +
          ",\"dim\":" + std::to_string(l.model->hparams().n_embd) + ",\"data\":[";
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    const std::vector<TokenId> ids = l.tokenizer->encode(inputs[i]);  // BOS as the model adds it
    auto v = embed(*l.ctx, ids, opts);
    if (!v) {
      std::fprintf(stderr, "kite embed: input %zu: %s\n", i + 1, v.error().message.c_str());
      return kExitFailure;
    }
    if (a.json) {
      if (i) doc += ',';
      doc += json_array(*v);
    } else {
      std::printf("%s\n", json_array(*v).c_str());
    }
  }
  if (a.json) std::printf("%s]}\n", doc.c_str());
  return kExitOk;
}

}  // namespace

void register_embed(CLI::App& app, Action* run) {
  auto* cmd = app.add_subcommand("embed", "Embeddings of texts: pooled final hidden states, one JSON array per input");
  auto a = std::make_shared<EmbedArgs>();
  add_model_flags(cmd, &a->model);
  cmd->add_option("text", a->texts, "Texts to embed, one input each (default: lines of -f FILE or stdin)");
  cmd->add_option("-f,--file", a->file, "Embed each line of this file");
  cmd->add_option("--pooling", a->pooling, "mean (over all tokens, BOS included), last or cls (first token)");
  cmd->add_flag("--no-normalize", a->no_normalize, "Do not L2-normalize the vectors");
  cmd->add_flag("--json", a->json, "Print one JSON document {model, pooling, normalize, dim, data}");
  cmd->callback([run, a] { *run = [a] { return run_embed(*a); }; });
}

}  // namespace kite::tools

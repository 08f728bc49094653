// kite perplexity -m MODEL -f FILE [-c N] — perplexity by llama.cpp's definition, so the numbers
// compare with llama-perplexity's.
#include <fstream>
#include <iostream>
#include <sstream>

#include "src/runtime/perplexity.h"
#include "tools/commands.h"
#include "tools/common.h"

namespace kite::tools {
namespace {

struct PplArgs {
  ModelArgs model;
  std::string file;
  bool json = false;
};

int run_perplexity(const PplArgs& a) {
  std::ifstream f(a.file, std::ios::binary);
  if (!f) {
    std::cerr << "kite perplexity: cannot read " << a.file << "\n";
    return kExitFailure;
  }
  std::ostringstream ss;
  ss << f.rdbuf();
  auto loaded = load_model(a.model);
  if (!loaded) {
    std::cerr << "kite perplexity: " << loaded.error().message << "\n";
    return kExitFailure;
  }
  Loaded& l = *loaded;
  const int64_t n_ctx = l.ctx->kv().n_ctx();  // (-c 0: the model's training context)
  EncodeOptions eo;
  eo.add_special = false;
  std::vector<TokenId> tokens = l.tokenizer->encode(ss.str(), eo);
  if (l.tokenizer->bos() != kNoToken) tokens.insert(tokens.begin(), l.tokenizer->bos());
  Progress progress("perplexity");
  const auto t0 = std::chrono::steady_clock::now();
  auto r = perplexity_llama_cpp(*l.ctx, tokens, l.tokenizer->bos(), n_ctx,
                                [&](int64_t done, int64_t total) { progress.update(done, total); });
  progress.finish();
  if (!r) {
    std::cerr << "kite perplexity: " << r.error().message << "\n";
    return kExitFailure;
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (a.json) {
    std::printf("{\"ppl\": %.6f, \"nll\": %.6f, \"chunks\": %lld, \"scored\": %lld, \"tokens\": %zu, \"ctx\": %lld}\n",
                r->ppl, r->nll, static_cast<long long>(r->chunks), static_cast<long long>(r->scored), tokens.size(),
                static_cast<long long>(n_ctx));
  } else {
    std::printf("perplexity: %.4f (%lld chunks of %lld tokens, %lld predictions scored)\n", r->ppl,
                static_cast<long long>(r->chunks), static_cast<long long>(n_ctx), static_cast<long long>(r->scored));
  }
  std::fprintf(stderr, "kite perplexity: %zu tokens in %.2f s (%.1f t/s)\n", static_cast<size_t>(r->chunks * n_ctx),
               secs, r->chunks * n_ctx / secs);
  return kExitOk;
}

}  // namespace

void register_perplexity(CLI::App& app, Action* run) {
  auto* cmd = app.add_subcommand("perplexity", "Perplexity of a text file (llama.cpp's definition)");
  auto a = std::make_shared<PplArgs>();
  a->model.ctx = 512;
  add_model_flags(cmd, &a->model);
  cmd->add_option("-f,--file", a->file, "The text file")->required();
  cmd->add_flag("--json", a->json, "Print the result as JSON");
  cmd->callback([run, a] { *run = [a] { return run_perplexity(*a); }; });
}

}  // namespace kite::tools

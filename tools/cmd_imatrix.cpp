// kite imatrix -m MODEL -f TEXT [-f TEXT ...] [-o OUT] [--chunks N] [-c CTX] [--process-output]
//   Importance matrix for `kite quantize --imatrix`: runs the model over calibration text in
//   chunks of CTX tokens and writes, per weight, the sums of squared activations of each input
//   column in llama.cpp's imatrix GGUF format (src/runtime/imatrix.h).
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "formats/weight_source.h"
#include "src/runtime/imatrix.h"
#include "tools/commands.h"
#include "tools/common.h"

namespace kite::tools {
namespace {

struct ImatrixArgs {
  std::string model;
  std::vector<std::string> files;
  std::string output = "imatrix.gguf";
  int64_t chunks = 0;
  int64_t ctx = 512;
  int threads = 0;
  bool process_output = false;
};

int run_imatrix(const ImatrixArgs& a) {
  auto src = WeightSource::open(a.model);
  if (!src) {
    std::cerr << "kite imatrix: " << src.error().message << "\n";
    return kExitFailure;
  }
  auto tok = Tokenizer::load((*src)->metadata());
  if (!tok) {
    std::cerr << "kite imatrix: " << tok.error().message << "\n";
    return kExitFailure;
  }
  // The text of every file, tokenized on its own, BOS once at the start (as llama-imatrix).
  std::vector<TokenId> tokens;
  if ((*tok)->bos() != kNoToken) tokens.push_back((*tok)->bos());
  EncodeOptions eo;
  eo.add_special = false;
  for (const auto& path : a.files) {
    std::ifstream f(path, std::ios::binary);
    if (!f) {
      std::cerr << "kite imatrix: cannot read " << path << "\n";
      return kExitFailure;
    }
    std::ostringstream ss;
    ss << f.rdbuf();
    std::vector<TokenId> ids = (*tok)->encode(ss.str(), eo);
    tokens.insert(tokens.end(), ids.begin(), ids.end());
  }
  auto model = Model::from_source(std::move(*src));
  if (!model) {
    std::cerr << "kite imatrix: " << model.error().message << "\n";
    return kExitFailure;
  }
  ImatrixOptions opt;
  opt.n_ctx = a.ctx;
  opt.max_chunks = a.chunks;
  opt.n_threads = a.threads;
  opt.include_output = a.process_output;
  for (const auto& f : a.files) opt.dataset += (opt.dataset.empty() ? "" : ",") + f;
  const int64_t available = static_cast<int64_t>(tokens.size()) / std::max<int64_t>(a.ctx, 1);
  std::fprintf(stderr, "kite imatrix: %zu tokens, %lld of %lld chunks of %lld\n", tokens.size(),
               static_cast<long long>(a.chunks > 0 ? std::min(a.chunks, available) : available),
               static_cast<long long>(available), static_cast<long long>(a.ctx));
  Progress progress("imatrix");
  const auto t0 = std::chrono::steady_clock::now();
  auto run = compute_imatrix(*model, tokens, (*tok)->bos(), opt,
                             [&](int64_t done, int64_t total) { progress.update(done, total); });
  progress.finish();
  if (!run) {
    std::cerr << "kite imatrix: " << run.error().message << "\n";
    return kExitFailure;
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (Status st = save_imatrix(run->imatrix, a.output); !st) {
    std::cerr << "kite imatrix: " << st.error().message << "\n";
    return kExitFailure;
  }
  std::printf("wrote %s: %zu weights, %u chunks of %u tokens, calibration perplexity %.4f (%.1f s)\n",
              a.output.c_str(), run->imatrix.entries.size(), run->imatrix.chunk_count, run->imatrix.chunk_size,
              run->ppl, secs);
  return kExitOk;
}

}  // namespace

void register_imatrix(CLI::App& app, Action* run) {
  auto* cmd = app.add_subcommand("imatrix", "Compute an importance matrix from calibration text (for quantize --imatrix)");
  auto a = std::make_shared<ImatrixArgs>();
  cmd->add_option("-m,--model", a->model, "Model: GGUF file (f16/bf16/f32 preferred) or Hugging Face folder")->required();
  cmd->add_option("-f,--file", a->files, "Calibration text file (repeatable)")->required();
  cmd->add_option("-o,--output", a->output, "Output imatrix GGUF file (default imatrix.gguf)");
  cmd->add_option("--chunks", a->chunks, "Chunks to process, spread evenly over the text (default: all whole chunks)")
      ->check(at_least(0));
  cmd->add_option("-c,--ctx", a->ctx, "Tokens per chunk (default 512)")->check(at_least(4));
  cmd->add_option("-t,--threads", a->threads, "Threads (default: all physical cores)")->check(at_least(0));
  cmd->add_flag("--process-output", a->process_output,
                "Also collect the output projection (output.weight, or token_embd.weight when tied)");
  cmd->callback([run, a] { *run = [a] { return run_imatrix(*a); }; });
}

}  // namespace kite::tools

// kite run -m MODEL -p PROMPT [-n N] [--temp T --seed S ...] — one-shot generation to stdout.
#include <chrono>
#include <iostream>

#include "tools/commands.h"
#include "tools/common.h"

namespace kite::tools {
namespace {

struct RunArgs {
  ModelArgs model;
  SamplerParams sampling;
  std::string prompt;
  int n_predict = 128;
  bool ignore_eos = false;
  bool no_bos = false;
};

int run_run(const RunArgs& a) {
  auto loaded = load_model(a.model);
  if (!loaded) {
    std::cerr << "kite run: " << loaded.error().message << "\n";
    return kExitFailure;
  }
  Loaded& l = *loaded;
  EncodeOptions eo;
  eo.add_special = !a.no_bos;
  eo.parse_special = true;
  std::vector<TokenId> prompt = l.tokenizer->encode(a.prompt, eo);
  if (prompt.empty()) {
    std::cerr << "kite run: the prompt is empty and the model adds no BOS token; give a prompt\n";
    return kExitUsage;
  }
  const auto t0 = std::chrono::steady_clock::now();
  if (auto st = l.ctx->eval(prompt); !st) {
    std::cerr << "kite run: " << st.error().message << "\n";
    return kExitFailure;
  }
  const auto t1 = std::chrono::steady_clock::now();
  Sampler sampler(a.sampling);
  StreamDecoder dec(*l.tokenizer);
  // The prompt is echoed as the model sees it (so "once upon" continues visibly).
  for (TokenId id : prompt)
    if (!l.tokenizer->is_control(id)) std::cout << dec.push(id);
  std::cout << std::flush;
  int generated = 0;
  while (generated < a.n_predict) {
    const TokenId next = sampler.sample(l.ctx->logits(0));
    if (!a.ignore_eos && l.tokenizer->is_eog(next)) break;
    ++generated;
    std::cout << dec.push(next) << std::flush;
    if (generated == a.n_predict) break;
    if (auto st = l.ctx->eval(std::span<const TokenId>(&next, 1)); !st) {
      std::cout << dec.flush() << std::endl;
      std::cerr << "kite run: " << st.error().message << "\n";
      return kExitFailure;
    }
  }
  std::cout << dec.flush() << std::endl;
  const auto t2 = std::chrono::steady_clock::now();
  const double pp = std::chrono::duration<double>(t1 - t0).count();
  const double tg = std::chrono::duration<double>(t2 - t1).count();
  std::fprintf(stderr, "kite run: prompt %zu tokens in %.3f s (%.1f t/s), generated %d tokens in %.3f s (%.1f t/s)\n",
               prompt.size(), pp, prompt.size() / pp, generated, tg, generated > 0 ? generated / tg : 0.0);
  return kExitOk;
}

}  // namespace

void register_run(CLI::App& app, Action* run) {
  auto* cmd = app.add_subcommand("run", "Generate a continuation of a prompt (one shot, to stdout)");
  auto a = std::make_shared<RunArgs>();
  a->sampling.seed = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  add_model_flags(cmd, &a->model);
  add_sampling_flags(cmd, &a->sampling);
  cmd->add_option("-p,--prompt", a->prompt, "The prompt")->required();
  cmd->add_option("-n,--n-predict", a->n_predict, "Tokens to generate at most")->check(CLI::NonNegativeNumber);
  cmd->add_flag("--ignore-eos", a->ignore_eos, "Keep generating past end-of-generation tokens");
  cmd->add_flag("--no-bos", a->no_bos, "Do not add the model's BOS token");
  cmd->callback([run, a] { *run = [a] { return run_run(*a); }; });
}

}  // namespace kite::tools

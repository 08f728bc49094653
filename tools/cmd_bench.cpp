// kite bench — llama-bench style prompt processing (pp) and generation (tg) speed, with the
// achieved bandwidth of generation against this machine's measured read bandwidth.
//   kite bench -m MODEL [-p 512] [-n 128] [-r 3] [-t N]
//   kite bench --synthetic llama-8b --type q4_K_M [--write-gguf OUT.gguf] [--device cuda --bandwidth GBS]
//   kite bench -m MODEL --parallel 1,4,16 [--text FILE] [--spec ngram | --draft MODEL] [--temp T | --openai-sampling [--top-p P]] [--logprobs N] [--top-k-outputs N]
//   kite bench ... -p 512 -n 128 --and-parallel 1,16,64 [--parallel-prompt 128 --parallel-gen 32]: both
#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iostream>
#include <numeric>
#include <random>
#include <thread>

#include "backends/cpu/cpu_features.h"
#include "backends/cpu/threadpool.h"
#include "formats/quant/types.h"
#include "src/core/devices.h"
#include "src/core/profile.h"
#include "src/model/synthetic.h"
#include "src/runtime/scheduler.h"
#include "tools/commands.h"
#include "tools/common.h"

namespace kite::tools {
namespace {

struct BenchArgs {
  std::string model;
  std::string synthetic;
  std::string type = "f16";
  std::string write_gguf;
  int n_prompt = 512;
  int n_gen = 128;
  int depth = 0;  // tokens in the KV cache before each pp/tg test (llama-bench's -d)
  std::string kv_type = "f16";  // KV cache element type (llama-bench's -ctk/-ctv)
  int reps = 3;
  int threads = 0;
  std::string device = "cpu";  // where to compute (cpu, cuda)
  int32_t gpu_layers = -1;     // layers on `device` (-1: all)
  bool cpu_moe = false;        // --cpu-moe
  int32_t tensor_parallel = 1;  // ranks on `device`
  double bandwidth = 0;        // GB/s that tg's achieved GB/s is compared with (0: measure the host's for cpu)
  bool json = false;
  std::vector<int> parallel;  // batched mode: concurrent sequences per run (llama-batched-bench's -npl)
  std::vector<int> and_parallel;  // after pp/tg: the batched test at these counts, on the same model
  int parallel_prompt = 128;      // ... with prompts of this many tokens
  int parallel_gen = 32;          // ... generating this many each
  std::string text;           // batched mode: prompts cut from this text instead of random tokens
  float temperature = 0.f;    // batched mode: sampling temperature (0: greedy)
  int32_t top_k_outputs = 64; // batched mode: rows come back as their top k logits (0: whole rows)
  bool openai_sampling = false;  // batched mode: temperature 1 over the whole vocabulary
  float top_p = 1.f;             // ... within this nucleus
  int32_t logprobs = 0;          // batched mode: the top N logprobs of each token
  SpecArgs spec;              // batched mode: speculative decoding
  bool profile = false;       // after the timed runs, one more of each with every launch timed
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Multi-threaded streaming read of a buffer much larger than the caches: the bound decode cannot
// beat. Returns GB/s (1e9 bytes), best of three.
double measure_read_bandwidth(int n_threads) {
  const size_t bytes = size_t{1} << 30;
  std::vector<uint64_t> buf(bytes / 8);
  for (size_t i = 0; i < buf.size(); i += 512) buf[i] = i;  // touch every page
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    std::vector<uint64_t> sums(static_cast<size_t>(n_threads));
    std::vector<std::thread> ts;
    const auto t0 = std::chrono::steady_clock::now();
    for (int t = 0; t < n_threads; ++t)
      ts.emplace_back([&, t] {
        const size_t n = buf.size() / static_cast<size_t>(n_threads);
        const uint64_t* p = buf.data() + static_cast<size_t>(t) * n;
        uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        for (size_t i = 0; i + 4 <= n; i += 4) s0 += p[i], s1 += p[i + 1], s2 += p[i + 2], s3 += p[i + 3];
        sums[static_cast<size_t>(t)] = s0 + s1 + s2 + s3;
      });
    for (auto& t : ts) t.join();
    const double s = seconds_since(t0);
    if (std::accumulate(sums.begin(), sums.end(), uint64_t{0}) == 1) std::cerr << "";  // keep the reads
    best = std::max(best, static_cast<double>(bytes) / s / 1e9);
  }
  return best;
}

// What the backend chose by timing (the CPU: how decode matmuls read each weight type; CUDA: mmq
// or cuBLAS per matmul shape); ways it did not time (too few bytes, forced) are not listed. To
// stderr beside --json output.
void print_measured_choices(const std::string& device, FILE* out) {
  for (const std::string& line : measured_choices(device)) std::fprintf(out, "(measured: %s)\n", line.c_str());
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// --profile: `run` (a pp or tg test, or a batched run) once more with every launch of the
// context's backends timed (src/core/profile.h), then the table, titled `what`. `run` returns
// the steps it took. Profiling changes how some backends run (CUDA: no graphs), so the timed
// runs come first and this one's speed is not reported as theirs.
Status profile_run(Context& c, const std::string& what, FILE* out, const std::function<Result<int64_t>()>& run) {
  OpProfile profile;
  std::string how;
  for (size_t b = 0; b < c.n_backends(); ++b) {
    Result<std::string> h = c.backend(b).set_profile(&profile);
    if (!h) {
      for (size_t i = 0; i < b; ++i) (void)c.backend(i).set_profile(nullptr);
      return h.error();
    }
    const std::string said = std::string(c.backend(b).name()) + ": " + *h;
    if (how.find(said) == std::string::npos) how += (how.empty() ? "" : "; ") + said;  // (ranks: once)
  }
  const auto t0 = std::chrono::steady_clock::now();
  Result<int64_t> steps = run();
  const double wall = seconds_since(t0);
  for (size_t b = 0; b < c.n_backends(); ++b) (void)c.backend(b).set_profile(nullptr);
  if (!steps) return steps.error();
  std::fprintf(out, "\nprofile of %s (%s):\n%s", what.c_str(), how.c_str(),
               format_profile(profile, *steps, wall).c_str());
  std::fflush(out);
  return ok_status();
}

// Batched decoding through the scheduler (the path the server takes), llama-batched-bench style:
// B sequences with distinct random prompts of n_prompt tokens each generate n_gen tokens.
// Prefill and decode overlap in continuous batching, so the prompt phase ends when the last
// sequence has its first token; S_TG counts the tokens generated after that point.
// With --text, prompt i is n_prompt tokens of the text starting at a different place for each i.
int run_batched(const BenchArgs& a, const std::shared_ptr<const Model>& model, const std::vector<int32_t>& text,
                uint64_t decode_bytes, int threads) {
  auto spec = speculative_options(a.spec);
  if (!spec) {
    std::cerr << "kite bench: " << spec.error().message << "\n";
    return kExitUsage;
  }
  const bool speculating = spec->mode != SpecMode::kNone;
  std::printf("|    B |   PP |   TG | T_PP s | S_PP t/s | T_TG s | S_TG t/s | S_TG/B=1 |%s\n",
              speculating ? " drafted | accepted |" : "");
  std::printf("|-----:|-----:|-----:|-------:|---------:|-------:|---------:|---------:|%s\n",
              speculating ? "--------:|---------:|" : "");
  std::mt19937 rng(11);
  std::uniform_int_distribution<int32_t> tok(3, static_cast<int32_t>(model->hparams().n_vocab - 1));
  double single = 0;
  for (int b : a.parallel) {
    ContextOptions opts;
    opts.n_threads = a.threads;
    opts.device = a.device;
    opts.gpu_layers = a.gpu_layers;
    opts.cpu_moe = a.cpu_moe;
    opts.tensor_parallel = a.tensor_parallel;
    opts.n_ctx = a.n_prompt + a.n_gen + 1;
    opts.n_seqs = b;
    opts.prefix_cache = false;
    opts.kv_type = quant::find_traits(a.kv_type)->type;
    auto ctx = Context::create(model, opts);
    if (!ctx) {
      std::cerr << "kite bench: " << ctx.error().message << "\n";
      return kExitFailure;
    }
    report_placement(**ctx, a.device, "kite bench");
    ModelArgs margs;
    margs.threads = a.threads;
    margs.device = a.device;
    margs.gpu_layers = a.gpu_layers;
    margs.cpu_moe = a.cpu_moe;
    margs.ctx = opts.n_ctx;
    margs.no_prefix_cache = true;
    auto draft = load_draft(a.spec, margs, *model, b);
    if (!draft) {
      std::cerr << "kite bench: " << draft.error().message << "\n";
      return kExitFailure;
    }
    SchedulerOptions so;
    so.speculative = *spec;
    so.top_k_outputs = a.top_k_outputs;
    StepInfo rows;  // summed over the steps: how their rows came back
    int64_t steps = 0, top_steps = 0;
    so.on_step = [&](const StepInfo& i) {
      ++steps;
      top_steps += i.top_k > 0 ? 1 : 0;
      rows.device_draws += i.device_draws, rows.whole_rows += i.whole_rows, rows.fetched_rows += i.fetched_rows;
    };
    if (auto st = Scheduler::check_speculative(so, **ctx, draft->get()); !st) {
      std::cerr << "kite bench: " << st.error().message << "\n";
      return kExitUsage;
    }
    using Clock = std::chrono::steady_clock;
    std::vector<Clock::time_point> first(static_cast<size_t>(b)), events;
    std::vector<bool> started(static_cast<size_t>(b), false);
    // Submits the B requests to `sched` (the same prompts each time: rng restarts).
    const std::mt19937 rng_start = rng;
    auto submit_all = [&](Scheduler& sched) -> Status {
      rng = rng_start;
      events.clear();
      started.assign(static_cast<size_t>(b), false);
      for (int i = 0; i < b; ++i) {
        Request r;
        r.prompt.resize(static_cast<size_t>(std::max(1, a.n_prompt)));
        if (text.size() > r.prompt.size()) {
          const size_t span = text.size() - r.prompt.size();
          const size_t start = static_cast<size_t>(i) * 7919 % span;
          std::copy(text.begin() + static_cast<ptrdiff_t>(start),
                    text.begin() + static_cast<ptrdiff_t>(start + r.prompt.size()), r.prompt.begin());
        } else {
          for (auto& t : r.prompt) t = tok(rng);
        }
        r.params.sampling.temperature = a.temperature;
        if (a.openai_sampling) {  // (what the server samples with when a request sets nothing)
          r.params.sampling.temperature = 1.f;
          r.params.sampling.top_k = 0;
          r.params.sampling.top_p = a.top_p;
          r.params.sampling.min_p = 0.f;
        }
        r.params.sampling.n_logprobs = a.logprobs;
        r.params.sampling.seed = static_cast<uint64_t>(i) + 1;
        r.params.max_tokens = a.n_gen;
        r.params.ignore_eos = true;
        r.on_event = [&, i](const StreamEvent& e) {
          const auto now = Clock::now();
          if (!started[static_cast<size_t>(i)])
            first[static_cast<size_t>(i)] = now, started[static_cast<size_t>(i)] = true;
          if (e.token >= 0) events.push_back(now);
        };
        if (auto id = sched.submit(std::move(r)); !id) return id.error();
      }
      return ok_status();
    };
    Scheduler sched(**ctx, nullptr, so, draft->get());
    if (auto st = submit_all(sched); !st) {
      std::cerr << "kite bench: " << st.error().message << "\n";
      return kExitFailure;
    }
    const auto t0 = Clock::now();
    if (auto st = sched.run_until_idle(); !st) {
      std::cerr << "kite bench: " << st.error().message << "\n";
      return kExitFailure;
    }
    const auto t_end = Clock::now();
    const auto t_pp = *std::max_element(first.begin(), first.end());
    const int64_t after = std::count_if(events.begin(), events.end(), [&](auto t) { return t > t_pp; });
    const double tpp = std::chrono::duration<double>(t_pp - t0).count();
    const double ttg = std::chrono::duration<double>(t_end - t_pp).count();
    const double stg = ttg > 0 ? static_cast<double>(after) / ttg : 0;
    if (b == a.parallel.front()) single = stg / b;
    std::printf("| %4d | %4d | %4d | %6.2f | %8.1f | %6.2f | %8.1f | %7.2fx |", b, a.n_prompt, a.n_gen, tpp,
                static_cast<double>(b) * a.n_prompt / tpp, ttg, stg, single > 0 ? stg / single : 0);
    const SchedulerStats st = sched.stats();
    if (speculating)
      std::printf(" %7lld | %7.1f%% |", static_cast<long long>(st.drafted),
                  st.drafted > 0 ? 100.0 * static_cast<double>(st.accepted) / static_cast<double>(st.drafted) : 0.0);
    std::printf("\n");
    print_speculative_stats("kite bench", spec->mode, st);
    std::fprintf(stderr,
                 "kite bench: %lld of %lld steps brought back top-%d rows; %d drawn there, %d whole beside them, %d "
                 "fetched whole after\n",
                 static_cast<long long>(top_steps), static_cast<long long>(steps), a.top_k_outputs, rows.device_draws,
                 rows.whole_rows, rows.fetched_rows);
    std::fflush(stdout);
    if (a.profile) {  // the same requests again, every launch timed
      Scheduler again(**ctx, nullptr, so, draft->get());
      const Status st = profile_run(**ctx, std::to_string(b) + " sequences (prompts and generation)", stdout,
                                    [&]() -> Result<int64_t> {
                                      KITE_TRY(submit_all(again));
                                      const int64_t before = steps;
                                      KITE_TRY(again.run_until_idle());
                                      return steps - before;
                                    });
      if (!st) {
        std::cerr << "kite bench: --profile: " << st.error().message << "\n";
        return kExitFailure;
      }
    }
  }
  std::printf("(weights read per step: %.2f GB; %d threads; S_TG/B=1 is relative to the first B's per-sequence rate)\n",
              decode_bytes / 1e9, threads);
  return kExitOk;
}

// What a model weighs: every tensor, and what one decode step reads (all but a token embedding
// that is not also the output matrix; of a mixture of experts, the share of experts a token uses).
struct ModelSize {
  std::string name;
  uint64_t weight_bytes = 0, decode_bytes = 0, params = 0;
};

int run_single(const BenchArgs& a, const std::shared_ptr<const Model>& model, const ModelSize& size, int threads);

int run_bench(const BenchArgs& a) {
  std::unique_ptr<WeightSource> source;
  if (!a.synthetic.empty()) {
    auto plan = plan_synthetic(a.synthetic, a.type);
    if (!plan) {
      std::cerr << "kite bench: " << plan.error().message << "\n";
      return kExitUsage;
    }
    char gib[32];
    std::snprintf(gib, sizeof gib, "%.2f", static_cast<double>(plan->total_bytes) / double(1ull << 30));
    std::cerr << "kite bench: building " << plan->name << " (" << gib << " GiB)\n";
    const auto t0 = std::chrono::steady_clock::now();
    auto s = make_synthetic(a.synthetic, a.type);
    if (!s) {
      std::cerr << "kite bench: " << s.error().message << "\n";
      return kExitFailure;
    }
    char secs[32];
    std::snprintf(secs, sizeof secs, "%.1f", seconds_since(t0));
    std::cerr << "kite bench: built " << plan->name << " in " << secs << " s\n";
    source = std::move(*s);
  } else {
    auto s = WeightSource::open(a.model);
    if (!s) {
      std::cerr << "kite bench: " << s.error().message << "\n";
      return kExitFailure;
    }
    source = std::move(*s);
  }
  if (!a.write_gguf.empty()) {
    Progress progress("writing " + a.write_gguf);
    auto st = write_gguf(*source, a.write_gguf, [&](size_t d, size_t t) { progress.update(static_cast<int64_t>(d), static_cast<int64_t>(t)); });
    progress.finish();
    if (!st) {
      std::cerr << "kite bench: " << st.error().message << "\n";
      return kExitFailure;
    }
    std::cerr << "kite bench: wrote " << a.write_gguf << "\n";
    if (a.n_prompt == 0 && a.n_gen == 0) return kExitOk;
  }
  uint64_t weight_bytes = 0, decode_bytes = 0, params = 0;
  double expert_share = 1;
  if (auto hp = HParams::from(*source); hp && hp->n_expert > 0)
    expert_share = static_cast<double>(hp->n_expert_used) / static_cast<double>(hp->n_expert);
  for (const auto& t : source->tensors()) {
    weight_bytes += t.nbytes;
    params += static_cast<uint64_t>(t.n_elements());
    if (t.name == "token_embd.weight" && source->find_tensor("output.weight") != nullptr) continue;
    const bool expert = Model::is_expert_weight(t.name);
    decode_bytes += expert ? static_cast<uint64_t>(static_cast<double>(t.nbytes) * expert_share) : t.nbytes;
  }
  const std::string name = source->path();
  std::vector<int32_t> text;
  if (!a.text.empty()) {
    auto tk = Tokenizer::load(source->metadata());
    if (!tk) {
      std::cerr << "kite bench: " << tk.error().message << "\n";
      return kExitFailure;
    }
    std::ifstream f(a.text, std::ios::binary);
    const std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    text = (*tk)->encode(s);
  }
  auto model = Model::from_source(std::move(source));
  if (!model) {
    std::cerr << "kite bench: " << model.error().message << "\n";
    return kExitFailure;
  }
  const int threads = a.threads > 0 ? a.threads : cpu::ThreadPool::physical_cores();
  int rc = kExitOk;
  if (!a.parallel.empty()) {
    rc = run_batched(a, *model, text, decode_bytes, threads);
  } else {
    const ModelSize size{name, weight_bytes, decode_bytes, params};
    rc = run_single(a, *model, size, threads);
    if (rc == kExitOk && !a.and_parallel.empty()) {
      // The batched test on the same model (built once), with its own prompt and generation sizes.
      BenchArgs b = a;
      b.parallel = a.and_parallel;
      b.n_prompt = a.parallel_prompt;
      b.n_gen = a.parallel_gen;
      std::fflush(stdout);
      rc = run_batched(b, *model, text, decode_bytes, threads);
    }
  }
  if (rc == kExitOk) print_measured_choices(a.device, a.json ? stderr : stdout);
  return rc;
}

// --profile after the pp/tg results: each test once more, profiled (`pp` and `tg` run a test
// from the context at its depth).
int profile_single(const BenchArgs& a, Context& c, const std::function<Status()>& pp,
                   const std::function<Status()>& tg) {
  if (!a.profile) return kExitOk;
  FILE* out = a.json ? stderr : stdout;
  std::fflush(stdout);
  auto once = [&](int n, const std::function<Status()>& test) -> Result<int64_t> {
    c.kv().truncate(0, a.depth);
    KITE_TRY(test());
    return int64_t{n};
  };
  Status st = ok_status();
  if (a.n_prompt > 0) st = profile_run(c, "pp" + std::to_string(a.n_prompt), out, [&] { return once(1, pp); });
  if (st && a.n_gen > 0) st = profile_run(c, "tg" + std::to_string(a.n_gen), out, [&] { return once(a.n_gen, tg); });
  if (!st) {
    std::cerr << "kite bench: --profile: " << st.error().message << "\n";
    return kExitFailure;
  }
  return kExitOk;
}

// llama-bench style: pp (one batch of n_prompt tokens) and tg (n_gen tokens one at a time),
// each after `depth` tokens already in the KV cache (filled once, untimed; every run truncates
// back to them).
int run_single(const BenchArgs& a, const std::shared_ptr<const Model>& model, const ModelSize& size, int threads) {
  const std::string& name = size.name;
  const uint64_t weight_bytes = size.weight_bytes, decode_bytes = size.decode_bytes, params = size.params;
  ContextOptions opts;
  opts.n_threads = a.threads;
  opts.device = a.device;
  opts.gpu_layers = a.gpu_layers;
  opts.cpu_moe = a.cpu_moe;
  opts.tensor_parallel = a.tensor_parallel;
  opts.n_ctx = std::max(16, a.depth + std::max(a.n_prompt, a.n_gen));
  opts.kv_type = quant::find_traits(a.kv_type)->type;
  auto ctx = Context::create(model, opts);
  if (!ctx) {
    std::cerr << "kite bench: " << ctx.error().message << "\n";
    return kExitFailure;
  }
  report_placement(**ctx, a.device, "kite bench");
  // The host's read bandwidth bounds CPU decode; a GPU's is measured by its own tool
  // (kite-cuda-bandwidth) and passed in with --bandwidth.
  const double bw = a.bandwidth > 0                    ? a.bandwidth
                    : a.device == "cpu" && a.n_gen > 0 ? measure_read_bandwidth(threads)
                                                       : 0.0;
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> tok(3, static_cast<int32_t>(model->hparams().n_vocab - 1));
  std::vector<int32_t> prompt(static_cast<size_t>(a.n_prompt));
  for (auto& t : prompt) t = tok(rng);

  Context& c = **ctx;
  if (a.depth > 0) {
    std::vector<int32_t> fill(static_cast<size_t>(a.depth));
    for (auto& t : fill) t = tok(rng);
    std::cerr << "kite bench: filling the context with " << a.depth << " tokens\n";
    const auto t0 = std::chrono::steady_clock::now();
    if (auto st = c.eval(fill); !st) {
      std::cerr << "kite bench: " << st.error().message << "\n";
      return kExitFailure;
    }
    std::fprintf(stderr, "kite bench: filled in %.2f s\n", seconds_since(t0));
  }
  std::vector<double> pp, tg;
  auto fail = [](const Status& st) {
    std::cerr << "kite bench: " << st.error().message << "\n";
    return kExitFailure;
  };
  // The tests, from the context at its depth: one batch of the prompt; n_gen tokens one at a time.
  auto run_pp = [&]() -> Status { return c.eval(prompt, 0, false, static_cast<size_t>(a.n_prompt)); };
  auto run_tg = [&]() -> Status {
    int32_t next = 1;
    for (int i = 0; i < a.n_gen; ++i) {
      KITE_TRY(c.eval(std::span<const int32_t>(&next, 1)));
      next = tok(rng);
    }
    return ok_status();
  };
  // One warm-up of each (builds the graphs, faults in the weights), then the repetitions.
  for (int rep = -1; rep < a.reps; ++rep) {
    if (a.n_prompt > 0) {
      c.kv().truncate(0, a.depth);
      const auto t0 = std::chrono::steady_clock::now();
      if (auto st = run_pp(); !st) return fail(st);
      if (rep >= 0) pp.push_back(a.n_prompt / seconds_since(t0));
    }
    if (a.n_gen > 0) {
      c.kv().truncate(0, a.depth);
      const auto t0 = std::chrono::steady_clock::now();
      if (auto st = run_tg(); !st) return fail(st);
      if (rep >= 0) tg.push_back(a.n_gen / seconds_since(t0));
    }
  }
  const double pp_ts = pp.empty() ? 0 : median(pp), tg_ts = tg.empty() ? 0 : median(tg);
  // A generated token reads the weights and, at depth, the KV cache behind it (K and V rows of
  // every layer, in --kv-type).
  const double kv_bytes_per_pos =
      2.0 * static_cast<double>(model->hparams().n_layer) * static_cast<double>(c.kv().row_bytes());
  const double tg_bytes = static_cast<double>(decode_bytes) + kv_bytes_per_pos * (a.depth + a.n_gen / 2.0);
  const double tg_gbs = tg_ts * tg_bytes / 1e9;
  // The CPU kernels that ran (KITE_CPU_SIMD can force a lower level): figures differ by level.
  const char* kernels = cpu::simd_level_name(cpu::active_simd_level());
  if (a.json) {
    std::printf(
        "{\"model\": \"%s\", \"device\": \"%s\", \"cpu_kernels\": \"%s\", \"bytes\": %llu, \"decode_bytes\": %llu, "
        "\"params\": %llu, \"threads\": %d, \"depth\": %d, \"kv_type\": \"%s\", \"pp\": %d, \"pp_ts\": %.2f, "
        "\"tg\": %d, \"tg_ts\": %.2f, \"tg_gbs\": %.2f, \"read_gbs\": %.2f}\n",
        name.c_str(), a.device.c_str(), kernels, static_cast<unsigned long long>(weight_bytes),
        static_cast<unsigned long long>(decode_bytes), static_cast<unsigned long long>(params), threads, a.depth,
        a.kv_type.c_str(), a.n_prompt, pp_ts, a.n_gen, tg_ts, tg_gbs, bw);
    return profile_single(a, c, run_pp, run_tg);
  }
  std::printf("| model | size | params | threads | test | t/s | GB/s |\n|---|---:|---:|---:|---|---:|---:|\n");
  // The threads column names the device for GPU runs (both rows alike).
  const std::string where = a.device == "cpu" ? std::to_string(threads) : a.device;
  const std::string size_text = human_bytes(weight_bytes), params_text = human_count(params);
  // llama-bench's label, and the KV type where it is not the default.
  const std::string at_depth = (a.depth > 0 ? " @ d" + std::to_string(a.depth) : std::string()) +
                               (a.kv_type != "f16" ? " kv " + a.kv_type : std::string());
  if (!pp.empty())
    std::printf("| %s | %s | %s | %s | pp%d%s | %.2f | |\n", name.c_str(), size_text.c_str(), params_text.c_str(),
                where.c_str(), a.n_prompt, at_depth.c_str(), pp_ts);
  if (!tg.empty()) {
    char gbs[96];
    if (bw > 0) std::snprintf(gbs, sizeof gbs, "%.1f (%.0f%% of %.1f)", tg_gbs, 100 * tg_gbs / bw, bw);
    else std::snprintf(gbs, sizeof gbs, "%.1f", tg_gbs);
    std::printf("| %s | %s | %s | %s | tg%d%s | %.2f | %s |\n", name.c_str(), size_text.c_str(), params_text.c_str(),
                where.c_str(), a.n_gen, at_depth.c_str(), tg_ts, gbs);
  }
  if (bw > 0 && a.bandwidth > 0)
    std::printf("(median of %d; device %s; read bandwidth %.1f GB/s as given)\n", a.reps, a.device.c_str(), bw);
  else if (bw > 0)
    std::printf("(median of %d; cpu kernels %s; machine read bandwidth %.1f GB/s, %d thread%s)\n", a.reps, kernels,
                bw, threads, threads == 1 ? "" : "s");
  else if (a.device == "cpu") std::printf("(median of %d; device cpu, kernels %s)\n", a.reps, kernels);
  else std::printf("(median of %d; device %s)\n", a.reps, a.device.c_str());
  return profile_single(a, c, run_pp, run_tg);
}

}  // namespace

void register_bench(CLI::App& app, Action* run) {
  auto* cmd = app.add_subcommand("bench", "Prompt processing and generation speed (llama-bench style)");
  auto a = std::make_shared<BenchArgs>();
  auto* m = cmd->add_option("-m,--model", a->model, "A GGUF file or a Hugging Face folder");
  auto* s = cmd->add_option("--synthetic", a->synthetic,
                            "A random-weight model: tiny, llama-1b, llama-3b, llama-8b (Llama-3-8B's shape), qwen2-7b "
                            "(Qwen2.5-7B's), qwen3-8b (Qwen3-8B's)");
  m->excludes(s);
  cmd->add_option("--type", a->type,
                  "Weights of the synthetic model: a type for every matrix (f16, q4_0, q8_0, q4_K, ...) or a "
                  "llama.cpp mix with its per-tensor types (q4_K_M, q5_K_M, q3_K_M, ...)");
  cmd->add_option("--write-gguf", a->write_gguf, "Also write the model as this GGUF file");
  cmd->add_option("-p,--n-prompt", a->n_prompt, "Prompt tokens (pp test; 0: skip)")->check(at_least(0));
  cmd->add_option("-n,--n-gen", a->n_gen, "Generated tokens (tg test; 0: skip)")->check(at_least(0));
  cmd->add_option("-d,--n-depth", a->depth,
                  "Tokens already in the context before each pp/tg test (llama-bench's -d: speed at that depth; "
                  "tg's GB/s counts the KV cache read too)")
      ->check(at_least(0));
  cmd->add_option("--kv-type", a->kv_type, "KV cache element type: f16 (default), bf16, f32, q8_0")
      ->check(CLI::IsMember({"f16", "bf16", "f32", "q8_0"}));
  cmd->add_option("-r,--repetitions", a->reps, "Repetitions (the median is reported)")->check(at_least(1));
  cmd->add_option("-t,--threads", a->threads, "Threads (default: all physical cores)")->check(at_least(0));
  cmd->add_option("--device", a->device, "Where to compute: cpu, cuda (builds with KITE_CUDA) or vulkan (builds with KITE_VULKAN)");
  add_gpu_layers_flag(cmd, &a->gpu_layers);
  add_cpu_moe_flag(cmd, &a->cpu_moe);
  cmd->add_option("--tensor-parallel,--tp", a->tensor_parallel, "Split every layer over N ranks on --device")
      ->check(at_least(1));
  cmd->add_option("--bandwidth", a->bandwidth,
                  "GB/s to compare generation's achieved GB/s with (e.g. kite-cuda-bandwidth's figure for "
                  "--device cuda; default: the host's read bandwidth, measured, for --device cpu)")
      ->check(greater_than(0));
  cmd->add_flag("--json", a->json, "Print the pp/tg results as one JSON line (--and-parallel's table follows it)");
  cmd->add_option("--parallel", a->parallel,
                  "Batched mode: concurrent sequences through the scheduler, e.g. 1,4,16,64 (llama-batched-bench's -npl)")
      ->delimiter(',')
      ->check(at_least(1))
      ->excludes("--n-depth");
  auto* ap = cmd->add_option("--and-parallel", a->and_parallel,
                             "After the pp/tg test, the batched test at these sequence counts on the same model "
                             "(one load or synthetic build for both), e.g. 1,16,64")
                 ->delimiter(',')
                 ->check(at_least(1));
  ap->excludes("--parallel");
  cmd->add_option("--parallel-prompt", a->parallel_prompt,
                  "With --and-parallel: prompt tokens per sequence (default 128)")
      ->check(at_least(1));
  cmd->add_option("--parallel-gen", a->parallel_gen, "With --and-parallel: tokens generated per sequence (default 32)")
      ->check(at_least(1));
  cmd->add_option("--text", a->text, "Batched mode: prompts cut from this text file (default: random tokens)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--top-k-outputs", a->top_k_outputs,
                  "Batched mode: steps bring back each row's top N logits, reduced on the device, when sampling "
                  "needs no more (default 64; 0: whole rows, sampled on the host)")
      ->check(between(0, 128));
  cmd->add_option("--temp", a->temperature, "Batched mode: sampling temperature (default 0: greedy)")
      ->check(at_least(0));
  CLI::Option* openai = cmd->add_flag(
      "--openai-sampling", a->openai_sampling,
      "Batched mode: sample as the OpenAI API's defaults do (temperature 1 over the whole vocabulary; overrides --temp)");
  cmd->add_option("--top-p", a->top_p, "Batched mode, with --openai-sampling: the request's top_p (default 1)")
      ->check(between(0.0, 1.0))
      ->needs(openai);  // (alone it would be ignored: say so)
  cmd->add_option("--logprobs", a->logprobs,
                  "Batched mode: each token's top N logprobs, as the OpenAI API's logprobs/top_logprobs ask (default 0)")
      ->check(between(0, 20));
  add_speculative_flags(cmd, &a->spec);
  cmd->add_flag("--profile", a->profile,
                "After the timed runs, each test once more with every launch timed: a table of where a step's "
                "time goes (op, weight type and shape, ms a step, weights' GB/s). CUDA runs these launch by "
                "launch, without graphs");
  cmd->callback([run, a, cmd] {
    *run = [a, cmd] {
      if (a->model.empty() && a->synthetic.empty()) {
        std::cerr << "kite bench: give -m MODEL or --synthetic NAME\n";
        return kExitUsage;
      }
      return run_bench(*a);
    };
  });
}

}  // namespace kite::tools

// Host sampling cost of a batched decode step: what the scheduler spends after each step on
// the rows of logits it downloaded, one sequence after another.
//
//   cmake --build build --target kite-bench-sampling
//   build/bench/kite-bench-sampling [SEQUENCES [VOCAB [THREADS]]]
//   (defaults 64, 128256 (Llama-3's) and the scheduler's default sampling team: the cores, <= 8)
//
// Each sequence has its own row of F32 logits (so the rows come from memory, as after a step's
// download, not from cache) and its own Sampler; a step copies each row into the scheduler's
// scratch and samples it there (what Scheduler::emit_token did before rows were sampled in place
// and by a team). Printed per step, median of 15 after one warm-up: greedy, greedy without the
// copy, temperature 0.8 with top-k 40 and top-p 0.95, and the last two again on a ThreadTeam of
// THREADS as the scheduler runs them (wall time: the machine may be shared). On a GPU the step
// itself can take a few ms at 64 sequences of an 8B model: this is the budget to compare with.
// Then what replaces it when the rows come back as their top k logits (Op::kTopK,
// SchedulerOptions::top_k_outputs; k 1 for greedy steps, 64 else, and k 1 with a draw from each
// whole row for plain temperature sampling): the CPU backend's top_k op
// over the step's rows on THREADS threads (what a CPU step adds; a GPU runs it instead), and
// the host's sample_top() per row. Last, top-p 0.9 without top-k at temperature 1 (an OpenAI
// request that sets top_p) on sharper rows (the logits doubled: their top 64 hold most of the
// mass, as a trained model's often do), whole and from the top 64 with the log-sum-exp, where
// rows whose nucleus reaches past the 64 are sampled whole (on a GPU: fetched first).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>
#include <random>
#include <thread>
#include <vector>

#include "src/base/thread_team.h"
#include "src/core/backend.h"
#include "src/core/graph.h"
#include "src/core/planner.h"
#include "src/runtime/sampler.h"

namespace {

double cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
}

double wall_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

int main(int argc, char** argv) {
  using namespace kite;
  const size_t seqs = argc > 1 ? static_cast<size_t>(std::atoll(argv[1])) : 64;
  const size_t vocab = argc > 2 ? static_cast<size_t>(std::atoll(argv[2])) : 128256;
  const int threads = argc > 3 ? std::atoi(argv[3])
                               : static_cast<int>(std::min(8u, std::max(1u, std::thread::hardware_concurrency())));
  if (seqs == 0 || vocab == 0 || threads < 1) {
    std::fprintf(stderr, "usage: kite-bench-sampling [SEQUENCES [VOCAB [THREADS]]]\n");
    return 2;
  }
  std::vector<std::vector<float>> rows(seqs, std::vector<float>(vocab));
  std::mt19937 gen(7);
  std::normal_distribution<float> logit(0.f, 3.f);
  for (auto& r : rows)
    for (float& v : r) v = logit(gen);
  std::vector<std::vector<float>> sharp = rows;
  for (auto& r : sharp)
    for (float& v : r) v *= 2.f;
  SamplerParams greedy;
  greedy.temperature = 0.f;
  SamplerParams nucleus;
  nucleus.temperature = 0.8f;
  nucleus.top_k = 40;
  nucleus.top_p = 0.95f;
  SamplerParams plain;  // the OpenAI API's defaults: temperature 1 over the whole row
  plain.temperature = 1.f;
  plain.top_k = 0;
  plain.top_p = 1.f;
  plain.min_p = 0.f;
  SamplerParams top_p = plain;
  top_p.top_p = 0.9f;
  std::vector<Sampler> g, t, o, np;
  for (size_t i = 0; i < seqs; ++i) {
    top_p.seed = i + 1;
    np.emplace_back(top_p);
    g.emplace_back(greedy);
    nucleus.seed = i + 1;
    t.emplace_back(nucleus);
    plain.seed = i + 1;
    o.emplace_back(plain);
  }
  std::vector<float> scratch;
  std::printf("host sampling, %zu sequences x %zu-token vocabulary (%.1f MB of F32 logits a step)\n", seqs, vocab,
              static_cast<double>(seqs * vocab * 4) / 1e6);
  const std::string team = std::to_string(threads) + " threads";
  const std::string names[] = {"greedy (copy + argmax)", "greedy without the copy",
                               "temperature 0.8, top-k 40, top-p 0.95 (copy + sample)", "greedy, " + team,
                               "temperature 0.8, top-k 40, top-p 0.95, " + team,
                               "temperature 1, no filters (OpenAI's defaults), " + team,
                               "temperature 1, top-p 0.9, sharper rows, " + team};
  kite::ThreadTeam pool(threads);
  for (int mode = 0; mode < 7; ++mode) {
    for (auto* which : {&g, &t, &o, &np})  // (the same draws in every mode: the checks agree)
      for (Sampler& x : *which) x.reset();
    std::vector<double> ms;
    std::atomic<long> check{0};
    for (int rep = 0; rep < 16; ++rep) {
      const double t0 = mode >= 3 ? wall_ms() : cpu_ms();
      if (mode >= 3) {
        std::vector<Sampler>& which = mode == 3 ? g : mode == 4 ? t : mode == 5 ? o : np;
        const auto& in = mode == 6 ? sharp : rows;
        std::atomic<size_t> next{0};
        pool.run([&](int) {
          for (size_t i = next++; i < seqs; i = next++) check += which[i].sample(in[i]);
        });
      }
      for (size_t i = 0; i < seqs && mode < 3; ++i) {
        if (mode == 1) {
          check += g[i].sample(rows[i]);
          continue;
        }
        scratch.assign(rows[i].begin(), rows[i].end());
        check += (mode == 0 ? g[i] : t[i]).sample_in_place(scratch);
      }
      if (rep > 0) ms.push_back((mode >= 3 ? wall_ms() : cpu_ms()) - t0);
    }
    std::sort(ms.begin(), ms.end());
    const double med = ms[ms.size() / 2];
    std::printf("  %-56s %7.2f ms a step, %6.1f us a sequence  (check %ld)\n", names[mode].c_str(), med,
                med * 1e3 / static_cast<double>(seqs), check.load());
  }

  // The same rows reduced by the CPU backend's op to their best one (greedy steps) and to their
  // top 64, then sampled from those.
  BackendOptions bo;
  bo.n_threads = threads;
  auto cpu = create_backend("cpu", bo);
  if (!cpu) {
    std::fprintf(stderr, "kite-bench-sampling: %s\n", cpu.error().message.c_str());
    return 1;
  }
  auto check_ok = [](const Status& st) {
    if (st.ok()) return;
    std::fprintf(stderr, "kite-bench-sampling: %s\n", st.error().message.c_str());
    std::exit(1);
  };
  std::printf("rows reduced to their top k logits first (SchedulerOptions::top_k_outputs)\n");
  // (0: k 1 and a draw from each whole row at temperature 1; -64: the sharper rows' top 64 and
  // log-sum-exp, for top-p)
  for (const int32_t kk : {1, 64, 0, -64}) {
    const bool draw = kk == 0, nucleus = kk < 0;
    const int32_t k = std::abs(kk);
    const auto& in_rows = nucleus ? sharp : rows;
    Graph graph;
    Tensor* in = graph.input(DType::F32, {static_cast<int64_t>(vocab), static_cast<int64_t>(seqs)}, "logits");
    Tensor* words = draw ? graph.input(DType::I32, {4, static_cast<int64_t>(seqs)}, "draws") : nullptr;
    Tensor* top = graph.top_k(in, std::max(k, 1), nucleus, words);
    graph.build(top);
    const MemoryPlan plan = MemoryPlan::make(graph);
    auto arena = (*cpu)->alloc(plan.arena_bytes());
    if (!arena) return 1;
    plan.place(graph, static_cast<uint8_t*>((*arena)->base()));
    for (size_t i = 0; i < seqs; ++i) check_ok((*cpu)->upload(*in, in_rows[i].data(), vocab * 4, i * vocab * 4));
    if (draw) {  // the uniforms the samplers' RNGs give (their first draws)
      std::vector<int32_t> packed(4 * seqs);
      for (size_t i = 0; i < seqs; ++i) {
        o[i].reset();
        pack_draw(1.f, o[i].uniform(), &packed[4 * i]);
      }
      check_ok((*cpu)->upload(*words, packed.data(), packed.size() * 4));
    }
    std::vector<double> op_ms;
    for (int rep = 0; rep < 16; ++rep) {
      const double t0 = wall_ms();
      check_ok((*cpu)->compute(graph.nodes()));
      if (rep > 0) op_ms.push_back(wall_ms() - t0);
    }
    std::sort(op_ms.begin(), op_ms.end());
    const size_t w = static_cast<size_t>(top->ne[0]);
    const std::string what =
        "the CPU backend's top_k op, " +
        (draw ? std::string("k 1 + a draw") : "k " + std::to_string(k) + (nucleus ? " + log-sum-exp" : "")) + ", " + team;
    std::printf("  %-56s %7.2f ms a step, %6.1f us a sequence  (%.1f KB a step)\n", what.c_str(), op_ms[op_ms.size() / 2],
                op_ms[op_ms.size() / 2] * 1e3 / static_cast<double>(seqs), static_cast<double>(seqs * w * 4) / 1e3);
    const auto* out = static_cast<const float*>(top->data);
    if (draw) {  // the same tokens as the host's first draws (mode 5's first step)
      size_t differ = 0;
      for (size_t i = 0; i < seqs; ++i) {
        o[i].reset();
        differ += static_cast<int32_t>(out[i * w + 3]) != o[i].sample(rows[i]) ? 1 : 0;  // (k 1: best, its id, lse, drawn id, its logit)
      }
      std::printf("  %-56s %zu of %zu differ\n", "drawn tokens against the host's own draws", differ, seqs);
      continue;
    }
    std::vector<Sampler>& which = k == 1 ? g : nucleus ? np : t;
    for (Sampler& x : which) x.reset();
    std::vector<double> ms;
    long check = 0, whole = 0;
    for (int rep = 0; rep < 16; ++rep) {
      const double t0 = cpu_ms();
      for (size_t i = 0; i < seqs; ++i) {
        const std::span<const float> r(out + i * w, w);
        int32_t token = which[i].sample_top({r.first(static_cast<size_t>(k)), r.subspan(static_cast<size_t>(k), static_cast<size_t>(k)), r[w - 1]});
        if (token == Sampler::kNeedsRow) token = which[i].sample(in_rows[i]), ++whole;
        check += token;
      }
      if (rep > 0) ms.push_back(cpu_ms() - t0);
    }
    std::sort(ms.begin(), ms.end());
    const char* host = k == 1    ? "greedy from the best one (sample_top)"
                       : nucleus ? "temperature 1, top-p 0.9 from the top 64, 1 thread"
                                 : "temperature 0.8, top-k 40, top-p 0.95 from the top 64";
    std::printf("  %-56s %7.3f ms a step, %6.2f us a sequence  (check %ld", host, ms[ms.size() / 2],
                ms[ms.size() / 2] * 1e3 / static_cast<double>(seqs), check);
    if (nucleus) std::printf("; %.1f%% of the rows sampled whole", 100.0 * static_cast<double>(whole) / (16.0 * static_cast<double>(seqs)));
    std::printf(")\n");
  }
  return 0;
}

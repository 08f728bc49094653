// kite-bench-kernels: mul_mat throughput of the CPU backend at Llama-1B shapes, per weight type
// and SIMD level, and the machine's streaming read bandwidth. Not run in CI.
//
//   kite-bench-kernels [--threads N] [--levels scalar,avx2,avxvnni,avx512] [--types q4_0,q4_K,...]
//                      [--n 1,512] [--gemm-max N]  (small batches up to N rows use gemm8; 0: never)
//                      [--wgemm-max N]  (wgemm, weights read in place, up to N rows; 0: never)
//
// Decode (n=1) cycles through enough copies of the weights (>= 512 MiB) that they stream from
// DRAM as in a real model; prefill (n=512) reuses one copy.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backends/cpu/cpu_features.h"
#include "backends/cpu/matmul.h"
#include "formats/quant/types.h"
#include "src/core/backend.h"
#include "src/core/graph.h"
#include "src/core/planner.h"

namespace {

using namespace kite;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// CPU seconds used by the whole process (all threads): on a shared, oversubscribed machine the
// wall time overstates the cost, the CPU time does not.
double cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

__attribute__((target("avx2"))) uint64_t sum_words(const uint64_t* p, size_t n) {
  uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  for (size_t i = 0; i + 4 <= n; i += 4) s0 += p[i], s1 ^= p[i + 1], s2 += p[i + 2], s3 ^= p[i + 3];
  return s0 + s1 + s2 + s3;
}

double read_bandwidth(int threads) {
  const size_t bytes = size_t{1} << 30;
  std::vector<uint64_t> buf(bytes / 8);
  for (size_t i = 0; i < buf.size(); i += 512) buf[i] = i;  // touch every page
  std::memset(buf.data(), 1, bytes);
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    std::vector<std::thread> ts;
    std::vector<uint64_t> sums(static_cast<size_t>(threads));
    const auto t0 = Clock::now();
    for (int t = 0; t < threads; ++t)
      ts.emplace_back([&, t] {
        const size_t per = buf.size() / static_cast<size_t>(threads);
        sums[static_cast<size_t>(t)] = sum_words(buf.data() + per * static_cast<size_t>(t), per);
      });
    for (auto& t : ts) t.join();
    best = std::max(best, static_cast<double>(bytes) / seconds_since(t0) / 1e9);
    if (sums[0] == 42) std::printf(" ");
  }
  return best;
}

struct Shape {
  int64_t k, m;
};

void bench_type(Backend& be, int threads, DType t, Shape s, int64_t n, const char* level) {
  const size_t row = quant::row_size(t, s.k).value();
  const size_t wbytes = row * static_cast<size_t>(s.m);
  // Quantize 64 distinct rows once and tile them over the matrix.
  const int64_t uniq = 64;
  std::vector<float> wf(static_cast<size_t>(s.k * uniq));
  std::mt19937 g(1);
  std::normal_distribution<float> nd(0.f, 0.02f);
  for (float& v : wf) v = nd(g);
  std::vector<uint8_t> proto(row * uniq);
  const Status made = quant::can_randomize(t) ? quant::random_blocks(t, proto.data(), s.k * uniq, 1, 0.02f)
                                              : quant::quantize_rows(t, wf.data(), proto.data(), uniq, s.k);
  if (!made.ok()) std::abort();
  const size_t copies = n == 1 ? std::max<size_t>(1, (size_t{512} << 20) / wbytes) : 1;
  std::vector<std::unique_ptr<uint8_t[]>> ws;
  for (size_t c = 0; c < copies; ++c) {
    ws.emplace_back(new uint8_t[wbytes]);
    for (int64_t r = 0; r < s.m; ++r) std::memcpy(ws.back().get() + row * r, proto.data() + row * (r % uniq), row);
  }
  std::vector<float> x(static_cast<size_t>(s.k * n));
  for (float& v : x) v = nd(g) * 50.f;

  Graph gr;
  Tensor* w = gr.external(t, {s.k, s.m}, ws[0].get(), "w");
  Tensor* xi = gr.input(DType::F32, {s.k, n}, "x");
  Tensor* y = gr.mul_mat(w, xi);
  gr.build(y);
  const MemoryPlan plan = MemoryPlan::make(gr);
  auto buf = be.alloc(plan.arena_bytes() + 64);
  plan.place(gr, static_cast<uint8_t*>((*buf)->base()));
  (void)be.upload(*xi, x.data(), x.size() * 4);

  auto run = [&](size_t c) {
    w->data = ws[c % copies].get();
    (void)be.compute(gr.nodes());
  };
  for (size_t c = 0; c < std::min<size_t>(copies, 8); ++c) run(c);  // warm-up
  const double target = 1.0;
  size_t iters = 0;
  const auto t0 = Clock::now();
  const double c0 = cpu_seconds();
  double el = 0;
  while ((el = seconds_since(t0)) < target || iters < 3) run(iters++);
  const double per = el / static_cast<double>(iters);
  // CPU time per call divided by the threads: the wall time an unshared machine would see.
  const double per_cpu = (cpu_seconds() - c0) / static_cast<double>(iters) / threads;
  const double gbs = static_cast<double>(wbytes) / per / 1e9;
  const double gflops = 2.0 * static_cast<double>(s.k) * static_cast<double>(s.m) * static_cast<double>(n) / per / 1e9;
  const double gflops_cpu = gflops * per / per_cpu;
  std::printf("%-7s %-5s k=%-5lld m=%-5lld n=%-4lld wall %8.3f ms %7.2f GB/s %7.1f GFLOP/s | cpu-time %8.3f ms %7.2f GB/s %7.1f GFLOP/s",
              level, std::string(quant::find_traits(t)->name).c_str(), static_cast<long long>(s.k),
              static_cast<long long>(s.m), static_cast<long long>(n), per * 1e3, gbs, gflops, per_cpu * 1e3,
              gbs * per / per_cpu, gflops_cpu);
  std::printf("\n");
  std::fflush(stdout);
}

// Times the graph ending in `out` (inputs filled with small random values); returns ms per run.
double time_graph(Backend& be, Graph& g, Tensor* out, const std::vector<std::pair<Tensor*, std::vector<uint8_t>>>& in) {
  g.build(out);
  const MemoryPlan plan = MemoryPlan::make(g);
  auto buf = be.alloc(plan.arena_bytes() + 64);
  plan.place(g, static_cast<uint8_t*>((*buf)->base()));
  for (const auto& [t, bytes] : in) (void)be.upload(*t, bytes.data(), bytes.size());
  (void)be.compute(g.nodes());
  size_t iters = 0;
  const auto t0 = Clock::now();
  const double c0 = cpu_seconds();
  while (seconds_since(t0) < 0.5 || iters < 3) {
    (void)be.compute(g.nodes());
    ++iters;
  }
  return (cpu_seconds() - c0) / static_cast<double>(iters) * 1e3;
}

template <class T>
std::vector<uint8_t> raw(const std::vector<T>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// Llama-1B shaped attention / rope / rms_norm / swiglu for n_tok tokens at positions
// first_pos.. (F16 KV cache).
void bench_ops(Backend& be, int threads, int64_t n_tok, int64_t first_pos, const char* level) {
  const int64_t hd = 64, nh = 32, nkv = 8, bs = 16, ctx = first_pos + n_tok;
  const int64_t nblocks = (ctx + bs - 1) / bs;
  std::vector<float> q(static_cast<size_t>(hd * nh * n_tok), 0.1f);
  std::vector<uint16_t> kv(static_cast<size_t>(hd * nkv * nblocks * bs), 0x2e66);  // 0.1 in f16
  std::vector<int32_t> pos(static_cast<size_t>(n_tok)), seq(static_cast<size_t>(n_tok), 0), table(static_cast<size_t>(nblocks));
  for (int64_t t = 0; t < n_tok; ++t) pos[static_cast<size_t>(t)] = static_cast<int32_t>(first_pos + t);
  for (int64_t b = 0; b < nblocks; ++b) table[static_cast<size_t>(b)] = static_cast<int32_t>(b);
  {
    Graph g;
    Tensor* tq = g.input(DType::F32, {hd, nh, n_tok}, "q");
    Tensor* tk = g.input(DType::F16, {hd * nkv, nblocks * bs}, "k");
    Tensor* tv = g.input(DType::F16, {hd * nkv, nblocks * bs}, "v");
    Tensor* tp = g.input(DType::I32, {n_tok}, "pos");
    Tensor* ts = g.input(DType::I32, {n_tok}, "seq");
    Tensor* tt = g.input(DType::I32, {nblocks, 1}, "table");
    AttentionParams ap;
    ap.n_kv_head = static_cast<int32_t>(nkv);
    ap.block_size = static_cast<int32_t>(bs);
    ap.scale = 0.125f;
    const double ms = time_graph(be, g, g.attention(tq, tk, tv, tp, ts, tt, ap),
                                 {{tq, raw(q)}, {tk, raw(kv)}, {tv, raw(kv)}, {tp, raw(pos)}, {ts, raw(seq)}, {tt, raw(table)}});
    std::printf("%-7s attention n_tok=%-4lld ctx=%-5lld cpu-time %8.3f ms/thread\n", level,
                static_cast<long long>(n_tok), static_cast<long long>(ctx), ms / threads);
  }
  {
    Graph g;
    Tensor* tq = g.input(DType::F32, {hd, nh, n_tok}, "q");
    Tensor* tp = g.input(DType::I32, {n_tok}, "pos");
    RopeParams rp;
    rp.n_rot = static_cast<int32_t>(hd);
    const double ms = time_graph(be, g, g.rope(tq, tp, rp), {{tq, raw(q)}, {tp, raw(pos)}});
    std::printf("%-7s rope      n_tok=%-4lld            cpu-time %8.3f ms/thread\n", level, static_cast<long long>(n_tok), ms / threads);
  }
  {
    Graph g;
    std::vector<float> x(static_cast<size_t>(8192 * n_tok), 0.3f);
    Tensor* ta = g.input(DType::F32, {8192, n_tok}, "a");
    Tensor* tb = g.input(DType::F32, {8192, n_tok}, "b");
    const double ms = time_graph(be, g, g.swiglu(ta, tb), {{ta, raw(x)}, {tb, raw(x)}});
    std::printf("%-7s swiglu    8192 x %-4lld           cpu-time %8.3f ms/thread\n", level, static_cast<long long>(n_tok), ms / threads);
  }
  {
    Graph g;
    std::vector<float> x(static_cast<size_t>(2048 * n_tok), 0.3f), w(2048, 1.f);
    Tensor* ta = g.input(DType::F32, {2048, n_tok}, "a");
    Tensor* tw = g.input(DType::F32, {2048}, "w");
    const double ms = time_graph(be, g, g.rms_norm(ta, tw, 1e-5f), {{ta, raw(x)}, {tw, raw(w)}});
    std::printf("%-7s rms_norm  2048 x %-4lld           cpu-time %8.3f ms/thread\n", level, static_cast<long long>(n_tok), ms / threads);
  }
  std::fflush(stdout);
}

// One batched decode step of attention at Llama-1B shapes (32 q heads, 8 KV heads, head_dim 64):
// n_seqs sequences, each one token at position ctx - 1 with its keys in blocks of 16 scattered
// over the cache (a shuffled block pool). Prints wall and CPU time per step in µs.
void bench_attention_decode(Backend& be, int threads, DType kv, int64_t n_seqs, int64_t ctx, const char* level) {
  const int64_t hd = 64, nh = 32, nkv = 8, bs = 16, row = hd * nkv;
  const int64_t per_seq = (ctx + bs - 1) / bs, nblocks = per_seq * n_seqs, nslots = nblocks * bs;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> q(static_cast<size_t>(hd * nh * n_seqs));
  for (float& v : q) v = nd(rng);
  std::vector<float> kvf(static_cast<size_t>(row * 256));  // 256 distinct rows tiled over the cache
  for (float& v : kvf) v = nd(rng);
  const size_t rb = quant::row_size(kv, row).value();
  std::vector<uint8_t> proto(rb * 256), cache(rb * static_cast<size_t>(nslots));
  if (!quant::quantize_rows(kv, kvf.data(), proto.data(), 256, row).ok()) std::abort();
  for (int64_t s = 0; s < nslots; ++s) std::memcpy(cache.data() + rb * s, proto.data() + rb * (s % 256), rb);
  std::vector<int32_t> phys(static_cast<size_t>(nblocks)), pos(static_cast<size_t>(n_seqs)), seq(pos.size());
  for (size_t i = 0; i < phys.size(); ++i) phys[i] = static_cast<int32_t>(i);
  std::shuffle(phys.begin(), phys.end(), rng);
  for (int64_t s = 0; s < n_seqs; ++s) pos[s] = static_cast<int32_t>(ctx - 1), seq[s] = static_cast<int32_t>(s);
  Graph g;
  Tensor* tq = g.input(DType::F32, {hd, nh, n_seqs}, "q");
  Tensor* tk = g.input(kv, {row, nslots}, "k");
  Tensor* tv = g.input(kv, {row, nslots}, "v");
  Tensor* tp = g.input(DType::I32, {n_seqs}, "pos");
  Tensor* ts = g.input(DType::I32, {n_seqs}, "seq");
  Tensor* tt = g.input(DType::I32, {per_seq, n_seqs}, "table");
  AttentionParams ap;
  ap.n_kv_head = static_cast<int32_t>(nkv);
  ap.block_size = static_cast<int32_t>(bs);
  ap.scale = 0.125f;
  Tensor* out = g.attention(tq, tk, tv, tp, ts, tt, ap);
  g.build(out);
  const MemoryPlan plan = MemoryPlan::make(g);
  auto buf = be.alloc(plan.arena_bytes() + 64);
  plan.place(g, static_cast<uint8_t*>((*buf)->base()));
  const std::vector<std::pair<Tensor*, std::vector<uint8_t>>> in = {
      {tq, raw(q)}, {tk, cache}, {tv, cache}, {tp, raw(pos)}, {ts, raw(seq)}, {tt, raw(phys)}};
  for (const auto& [t, bytes] : in) (void)be.upload(*t, bytes.data(), bytes.size());
  (void)be.compute(g.nodes());
  size_t iters = 0;
  const auto t0 = Clock::now();
  const double c0 = cpu_seconds();
  double el = 0, best = 1e30;
  while ((el = seconds_since(t0)) < 1.0 || iters < 3) {
    const auto t1 = Clock::now();
    (void)be.compute(g.nodes());
    best = std::min(best, seconds_since(t1));
    ++iters;
  }
  const double wall = el / static_cast<double>(iters) * 1e6;
  const double cpu = (cpu_seconds() - c0) / static_cast<double>(iters) / threads * 1e6;
  // On a shared machine the fastest step is the best estimate of an unshared one.
  std::printf("%-7s attention decode %-4s seqs=%-3lld ctx=%-5lld wall mean %9.1f min %9.1f us/step | cpu-time %9.1f us/step/thread\n",
              level, std::string(quant::find_traits(kv)->name).c_str(), static_cast<long long>(n_seqs),
              static_cast<long long>(ctx), wall, best * 1e6, cpu);
  std::fflush(stdout);
}

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  size_t p = 0;
  while (p <= s.size()) {
    const size_t q = s.find(',', p);
    out.push_back(s.substr(p, q == std::string::npos ? std::string::npos : q - p));
    if (q == std::string::npos) break;
    p = q + 1;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2;
  std::string levels = "", types = "q4_0,q4_K,q8_0,f16", ns = "1,512";
  bool bw = true, ops = false;
  std::string attn;  // "SEQS:CTX,..." batched decode attention steps (f16 and q8_0 caches)
  size_t n_shapes = 3;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--threads" && i + 1 < argc) threads = std::atoi(argv[++i]);
    else if (a == "--levels" && i + 1 < argc) levels = argv[++i];
    else if (a == "--types" && i + 1 < argc) types = argv[++i];
    else if (a == "--n" && i + 1 < argc) ns = argv[++i];
    else if (a == "--no-bandwidth") bw = false;
    else if (a == "--first-shape") n_shapes = 1;
    else if (a == "--ops") ops = true;
    else if (a == "--attn" && i + 1 < argc) attn = argv[++i];
    else if (a == "--gemm-max" && i + 1 < argc) cpu::set_gemm8_max_rows(std::atoll(argv[++i]));
    else if (a == "--wgemm-max" && i + 1 < argc) cpu::set_wgemm_rows(-1, std::atoll(argv[++i]));
    else {
      std::fprintf(stderr, "usage: kite-bench-kernels [--threads N] [--levels l1,l2] [--types t1,t2] [--n 1,512] [--no-bandwidth] [--first-shape] [--ops] [--attn 16:512,64:512] [--gemm-max N] [--wgemm-max N]\n");
      return 2;
    }
  }
  std::printf("cpu: %s; threads %d\n", cpu::cpu_features().describe().c_str(), threads);
  if (bw) std::printf("read bandwidth (1 GiB, %d threads): %.2f GB/s\n", threads, read_bandwidth(threads));
  BackendOptions opts;
  opts.n_threads = threads;
  auto be = create_backend("cpu", opts);
  if (!be.ok()) return 1;
  std::vector<cpu::SimdLevel> lv;
  if (levels.empty()) {
    lv = {cpu::best_simd_level()};
  } else {
    for (const auto& s : split_list(levels)) {
      cpu::SimdLevel l;
      if (cpu::parse_simd_level(s, &l)) lv.push_back(l);
    }
  }
  const Shape shapes[] = {{2048, 2048}, {2048, 8192}, {8192, 2048}};
  for (cpu::SimdLevel l : lv) {
    cpu::force_simd_level(l);
    if (!attn.empty()) {
      for (const auto& sc : split_list(attn))
        for (DType kv : {DType::F16, DType::Q8_0})
          bench_attention_decode(**be, threads, kv, std::atoll(sc.c_str()), std::atoll(sc.c_str() + sc.find(':') + 1),
                                 cpu::simd_level_name(cpu::active_simd_level()));
      continue;
    }
    if (ops) {
      bench_ops(**be, threads, 512, 0, cpu::simd_level_name(cpu::active_simd_level()));
      bench_ops(**be, threads, 1, 1023, cpu::simd_level_name(cpu::active_simd_level()));
      continue;
    }
    for (const auto& nstr : split_list(ns))
      for (const auto& tn : split_list(types)) {
        const quant::TypeTraits* tr = quant::find_traits(std::string_view(tn));
        if (tr == nullptr) continue;
        for (size_t si = 0; si < n_shapes; ++si) bench_type(**be, threads, tr->type, shapes[si], std::atoll(nstr.c_str()), cpu::simd_level_name(cpu::active_simd_level()));
      }
  }
  return 0;
}

// kite-cuda-matmul: the CUDA backend's quantized mul_mat at Llama-3-8B's weight shapes, for each
// activation width, both ways it can run: the int8 tensor-core kernel (mmq; KITE_CUDA_MMQ=1) and
// dequantize-to-F16 + cuBLAS (KITE_CUDA_MMQ=0). Up to 8 columns both settings take the mat-vec
// kernels (mmvq). The table says which is faster per type and width: what the backend's own
// timing of each new shape chooses between (backends/cuda/ops_matmul.cpp; bench/cuda-device.sh
// runs this on a lent GPU).
//
//   kite-cuda-matmul [--device cuda] [--types q4_K,q4_0,q8_0,q6_K] [--cols 1,16,...]
//                    [--shapes 8b|tiny] [--reps 5] [--min-mib 384]
//
// Each timed run computes R distinct copies of the weight matrix (R * weight bytes >=
// --min-mib, so they stream from device memory as in a model, not from L2; mirrored on the
// device once, like a model's weights) against one activation matrix; the median of --reps
// runs, divided by R, is a product's time. GB/s counts
// the weight bytes (what bounds narrow products); TFLOP/s counts 2 * k * m * n.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "formats/quant/types.h"
#include "src/core/backend.h"
#include "src/core/graph.h"
#include "src/core/planner.h"

namespace {

using namespace kite;
using Clock = std::chrono::steady_clock;

struct Shape {
  const char* name;
  int64_t k, m;
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string x; std::getline(ss, x, ',');)
    if (!x.empty()) out.push_back(x);
  return out;
}

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "kite-cuda-matmul: %s\n", what.c_str());
  std::exit(1);
}

// A [k, m] weight matrix of type t: a quantized [k, 64] block of random values, repeated.
std::vector<uint8_t> make_weights(DType t, int64_t k, int64_t m, uint32_t seed) {
  constexpr int64_t kRows = 64;
  std::mt19937 g(seed);
  std::normal_distribution<float> nd(0.f, 0.02f);
  std::vector<float> f(static_cast<size_t>(k * kRows));
  for (float& v : f) v = nd(g);
  const size_t rb = quant::row_size(t, k).value();
  std::vector<uint8_t> block(rb * kRows), out(rb * static_cast<size_t>(m));
  if (!quant::quantize_rows(t, f.data(), block.data(), kRows, k).ok()) die("cannot quantize the weights");
  for (int64_t r = 0; r < m; r += kRows)
    std::memcpy(out.data() + rb * r, block.data(), rb * static_cast<size_t>(std::min(kRows, m - r)));
  return out;
}

// Seconds per product of each weight copy times x ([k, n]), median of `reps` timed runs. The
// copies are host memory, as a model's weights are: the backend mirrors each on the device on
// first use (run 0, untimed) and keeps the mirror for later graphs.
double time_products(Backend& be, DType t, std::vector<std::vector<uint8_t>>& copies, int64_t k, int64_t m, int64_t n,
                     int reps) {
  Graph g;
  Tensor* x = g.input(DType::F32, {k, n}, "x");
  for (size_t c = 0; c < copies.size(); ++c)
    g.build(g.mul_mat(g.external(t, {k, m}, copies[c].data(), "w" + std::to_string(c)), x));
  const MemoryPlan plan = MemoryPlan::make(g);
  auto buf = be.alloc(plan.arena_bytes() + 64);
  if (!buf.ok()) die(buf.error().message);
  plan.place(g, static_cast<uint8_t*>((*buf)->base()));
  std::vector<float> xf(static_cast<size_t>(k * n));
  std::mt19937 gen(7);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (float& v : xf) v = nd(gen);
  if (auto s = be.upload(*x, xf.data(), xf.size() * sizeof(float)); !s.ok()) die(s.error().message);
  std::vector<double> runs;
  for (int r = 0; r <= reps; ++r) {  // (run 0 warms up: mirrors, scratch, cuBLAS)
    const auto t0 = Clock::now();
    if (auto s = be.compute(g.nodes()); !s.ok()) die(s.error().message);
    if (auto s = be.synchronize(); !s.ok()) die(s.error().message);
    if (r > 0)
      runs.push_back(std::chrono::duration<double>(Clock::now() - t0).count() / static_cast<double>(copies.size()));
  }
  std::sort(runs.begin(), runs.end());
  return runs[runs.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::string device = "cuda", types = "q4_K,q4_0,q8_0,q6_K", cols = "1,8,16,32,64,128,256,512,1024", shapes = "8b";
  int reps = 5;
  double min_mib = 384;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) die(a + " needs a value");
      return argv[++i];
    };
    if (a == "--device")
      device = next();
    else if (a == "--types")
      types = next();
    else if (a == "--cols")
      cols = next();
    else if (a == "--shapes")
      shapes = next();
    else if (a == "--reps")
      reps = std::max(1, std::atoi(next().c_str()));
    else if (a == "--min-mib")
      min_mib = std::atof(next().c_str());
    else
      die("unknown argument " + a + " (see the comment at the top of bench/cuda_matmul.cpp)");
  }
  std::vector<Shape> shape_list;
  if (shapes == "8b")  // Llama-3-8B: q/o, k/v, gate/up, down
    shape_list = {{"attn_q", 4096, 4096}, {"attn_k", 4096, 1024}, {"ffn_up", 4096, 14336}, {"ffn_down", 14336, 4096}};
  else if (shapes == "tiny")  // (a dry run on the CPU CUDA emulator)
    shape_list = {{"tiny", 256, 128}};
  else
    die("--shapes is 8b or tiny");
  auto be = create_backend(device);
  if (!be.ok()) die(be.error().message);

  std::printf("kite-cuda-matmul --device %s --types %s --cols %s --shapes %s --reps %d --min-mib %g\n", device.c_str(),
              types.c_str(), cols.c_str(), shapes.c_str(), reps, min_mib);
  std::printf("| type | shape | k x m | n | mmq us | cuBLAS us | faster | weight GB/s | TFLOP/s |\n");
  std::printf("|---|---|---|---:|---:|---:|---|---:|---:|\n");
  std::vector<std::vector<std::vector<uint8_t>>> weights;  // per type and shape: its copies
  std::map<std::string, std::string[2]> summary;           // "type shape" -> widths where mmq / cuBLAS won
  for (const std::string& tn : split(types)) {
    const quant::TypeTraits* tr = quant::find_traits(tn);
    if (tr == nullptr || !tr->is_quantized) die("not a quantized type: " + tn);
    const DType t = tr->type;
    for (const Shape& s : shape_list) {
      const std::vector<uint8_t> wb = make_weights(t, s.k, s.m, 1234);
      const double mib = static_cast<double>(wb.size()) / (1 << 20);
      // (kept until the end: the backend's mirrors are keyed by these host addresses)
      auto& copies =
          weights.emplace_back(std::clamp(static_cast<size_t>(min_mib / mib + 0.999), size_t{1}, size_t{64}), wb);
      for (const std::string& cn : split(cols)) {
        const int64_t n = std::atoll(cn.c_str());
        if (n < 1) die("--cols takes positive widths");
        setenv("KITE_CUDA_MMQ", "1", 1);
        const double t_mmq = time_products(**be, t, copies, s.k, s.m, n, reps);
        double t_blas = t_mmq;
        if (n > 8) {
          setenv("KITE_CUDA_MMQ", "0", 1);
          t_blas = time_products(**be, t, copies, s.k, s.m, n, reps);
        }
        const double best = std::min(t_mmq, t_blas);
        const char* faster = n <= 8 ? "(mmvq)" : (t_mmq <= t_blas ? "mmq" : "cuBLAS");
        if (n > 8) summary[tn + " " + s.name][t_mmq <= t_blas ? 0 : 1] += " " + std::to_string(n);
        char blas[32] = "-";
        if (n > 8) std::snprintf(blas, sizeof(blas), "%.1f", t_blas * 1e6);
        std::printf("| %s | %s | %lld x %lld | %lld | %.1f | %s | %s | %.0f | %.1f |\n", tn.c_str(), s.name,
                    static_cast<long long>(s.k), static_cast<long long>(s.m), static_cast<long long>(n), t_mmq * 1e6,
                    blas, faster, static_cast<double>(wb.size()) / best / 1e9,
                    2.0 * static_cast<double>(s.k * s.m * n) / best / 1e12);
        std::fflush(stdout);
      }
    }
  }
  unsetenv("KITE_CUDA_MMQ");
  std::printf("\nthe faster way per width (columns):\n");
  for (const auto& [key, won] : summary)
    std::printf("  %s: mmq%s | cuBLAS%s\n", key.c_str(), won[0].empty() ? " -" : won[0].c_str(),
                won[1].empty() ? " -" : won[1].c_str());
  return 0;
}

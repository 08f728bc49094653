// kite-decode-kernels: single-thread throughput of the decode (one activation row) dot kernels
// of each x86 level, with the weights hot in cache (kernel cost) and streamed from DRAM
// (kernel + memory). Not run in CI.
//
//   kite-decode-kernels [--types q4_0,q8_0,q4_K,q6_K] [--k 2048]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/cpu_features.h"
#include "backends/cpu/matmul.h"
#include "formats/quant/types.h"

namespace {

using namespace kite;

// CPU time of this thread: the machine may be shared, wall time would count other programs.
double thread_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// GB/s of weights read by `dot` over `bytes` of rows, cycling `reps` times.
double run(cpu::VecDotFn dot, const uint8_t* w, size_t row_bytes, int64_t rows, int64_t k, const uint8_t* act,
           double min_s) {
  float sink = 0.f, r = 0.f;
  int64_t done = 0;
  const double t0 = thread_seconds();
  double el = 0;
  do {
    for (int64_t i = 0; i < rows; ++i) {
      dot(k, w + static_cast<size_t>(i) * row_bytes, act, 0, &r);
      sink += r;
    }
    done += rows;
    el = thread_seconds() - t0;
  } while (el < min_s);
  if (sink == 12345.f) std::printf(" ");
  return static_cast<double>(done) * static_cast<double>(row_bytes) / el / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  std::string types = "q4_0,q8_0,q4_K,q6_K";
  int64_t k = 2048;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--types" && i + 1 < argc) types = argv[++i];
    else if (a == "--k" && i + 1 < argc) k = std::atoll(argv[++i]);
    else {
      std::fprintf(stderr, "usage: kite-decode-kernels [--types t1,t2] [--k K]\n");
      return 2;
    }
  }
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> x(static_cast<size_t>(k));
  for (float& v : x) v = nd(rng);
  size_t start = 0;
  while (start < types.size()) {
    size_t end = types.find(',', start);
    if (end == std::string::npos) end = types.size();
    const std::string name = types.substr(start, end - start);
    start = end + 1;
    const quant::TypeTraits* tr = quant::find_traits(name);
    if (tr == nullptr || tr->quantize == nullptr) {
      std::fprintf(stderr, "unknown type %s\n", name.c_str());
      return 2;
    }
    const size_t row_bytes = static_cast<size_t>(k / tr->block_size) * tr->type_size;
    // One quantized row copied to fill 512 MiB (cold) / 256 KiB (hot).
    std::vector<uint8_t> row(row_bytes);
    tr->quantize(x.data(), row.data(), k);
    const int64_t cold_rows = static_cast<int64_t>((512u << 20) / row_bytes), hot_rows = static_cast<int64_t>((256u << 10) / row_bytes) + 1;
    std::vector<uint8_t> w(static_cast<size_t>(cold_rows) * row_bytes);
    for (int64_t i = 0; i < cold_rows; ++i) std::memcpy(w.data() + static_cast<size_t>(i) * row_bytes, row.data(), row_bytes);
    for (cpu::SimdLevel level : {cpu::SimdLevel::kAvx2, cpu::SimdLevel::kAvx512}) {
      const cpu::MatmulKernels* mk = cpu::matmul_kernels_for(level);
      if (mk == nullptr || level > cpu::best_simd_level()) continue;
      const cpu::ActFormat f = cpu::act_format(static_cast<DType>(tr->type));
      std::vector<uint8_t> act(cpu::act_row_bytes(f, k) + 64);
      if (f == cpu::ActFormat::kQ8K) mk->quantize_q8k(x.data(), act.data(), k);
      else mk->quantize_q8(x.data(), act.data(), k);
      const cpu::VecDotFn dot = mk->dot[static_cast<size_t>(tr->type)][0];
      float r = 0.f;
      dot(k, row.data(), act.data(), 0, &r);
      const double hot = run(dot, w.data(), row_bytes, hot_rows, k, act.data(), 0.3);
      const double cold = run(dot, w.data(), row_bytes, cold_rows, k, act.data(), 0.3);
      std::printf("%-6s %-6s k=%lld  hot %6.2f GB/s (%5.2f ns/block)  dram %6.2f GB/s  dot=%g\n",
                  level == cpu::SimdLevel::kAvx2 ? "avx2" : "avx512", name.c_str(), static_cast<long long>(k), hot,
                  static_cast<double>(tr->type_size) / hot, cold, static_cast<double>(r));
    }
  }
  return 0;
}

// The CUDA backend's int8 tensor-core matmul (backends/cuda/k_mmq.cu, launch_mmq): mul_mat of
// every quantized weight type with more columns than the mat-vec kernels take, run through the
// backend with KITE_CUDA_MMQ=1 and compared with the CPU backend and with an exact host model of
// the kernel's arithmetic (the same int8 activations); the routing (KITE_CUDA_MMQ, the column
// threshold). Without the CUDA backend or a device the cases skip, visibly. (The emulator's
// mma.sync is tested in test_cuda_emu.cpp; test_ops.cpp's "ops: mul_mat ..." cases run mmq too:
// it takes 9..256 columns.)
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "src/core/backend.h"
#include "tests/ops_test_util.h"

using namespace kite;
using namespace kite::ops_test;

namespace {

// The CUDA backend, or nothing (said once per case) when it is not compiled in or has no device.
std::unique_ptr<Backend> cuda_or_skip() {
  const auto names = backend_names();
  if (std::find(names.begin(), names.end(), "cuda") == names.end()) {
    MESSAGE("cuda: skipped, CUDA backend not compiled in");
    return nullptr;
  }
  auto be = create_backend("cuda");
  if (!be.ok() && be.error().message.find("no CUDA device found") != std::string::npos) {
    MESSAGE("cuda: skipped, no device (", be.error().message, ")");
    return nullptr;
  }
  INFO((be.ok() ? std::string() : be.error().message));
  REQUIRE(be.ok());
  return std::move(*be);
}

// Sets KITE_CUDA_MMQ (or unsets it, for nullptr) for the guard's lifetime.
class MmqEnv : public ScopedEnv {
 public:
  explicit MmqEnv(const char* v) : ScopedEnv("KITE_CUDA_MMQ", v) {}
};

// W [k, m] of type t times x [k, n] (n rows of k floats) on `be`: [m, n].
std::vector<float> mul_mat_on(Backend& be, DType t, const std::vector<uint8_t>& wb, const std::vector<float>& xf,
                              int64_t k, int64_t m, int64_t n) {
  Graph g;
  Tensor* w = g.input(t, {k, m}, "w");
  Tensor* x = g.input(DType::F32, {k, n}, "x");
  Tensor* y = g.mul_mat(w, x);
  return run_graph(be, g, y, {{w, wb}, {x, bytes_of(xf)}});
}

// The decoded weights times activations `x` ([n][k]), in doubles.
template <class X>
std::vector<double> matmul_reference(const std::vector<float>& wd, const std::vector<X>& x, int64_t k, int64_t m,
                                     int64_t n) {
  std::vector<double> ref(static_cast<size_t>(m * n));
  for (int64_t c = 0; c < n; ++c)
    for (int64_t r = 0; r < m; ++r) {
      double s = 0;
      for (int64_t e = 0; e < k; ++e)
        s += static_cast<double>(wd[static_cast<size_t>(r * k + e)]) * static_cast<double>(x[static_cast<size_t>(c * k + e)]);
      ref[static_cast<size_t>(c * m + r)] = s;
    }
  return ref;
}

// What the int8 kernels compute, in doubles: the decoded weights times the activations as
// launch_quantize_act quantizes them (per 32 elements d = amax / 127, q = round(x / d)).
std::vector<double> int8_reference(const std::vector<float>& wd, const std::vector<float>& xf, int64_t k, int64_t m,
                                   int64_t n) {
  std::vector<double> xq(xf.size());
  for (size_t b = 0; b < xf.size(); b += 32) {
    float amax = 0.f;
    for (size_t i = b; i < b + 32; ++i) amax = std::max(amax, std::fabs(xf[i]));
    const float d = amax / 127.f;
    const float id = d != 0.f ? 1.f / d : 0.f;
    for (size_t i = b; i < b + 32; ++i) xq[i] = static_cast<double>(d) * std::round(xf[i] * id);
  }
  return matmul_reference(wd, xq, k, m, n);
}

std::vector<double> to_double(const std::vector<float>& v) {
  return {v.begin(), v.end()};
}

struct Shape {
  int64_t k, m, n;
};

}  // namespace

TEST_CASE("cuda: mmq matches the CPU backend and the int8 model, every quantized type") {
  auto cuda = cuda_or_skip();
  if (!cuda) return;
  auto cpu = create_backend("cpu");
  REQUIRE(cpu.ok());
  const MmqEnv env("1");
  // Odd row counts (partial 16-row warp tiles, one to three 64-row blocks), 9..256 columns (16-,
  // 32- and 64-column blocks, partial 8-column tiles, up to four column blocks), 8 and 16 units
  // per row; for the 32-element types also 2, 3 and 9 units (a partial 4-unit step). Split over
  // k on the emulator's 4 SMs (mmq_splits): {512, 37, 16} in 2 ranges, {1024, 37, 20} in 4,
  // {864, 70, 40} in 3 of 12, 12 and 3 units, {1280, 70, 40} in 4 of 12, 12, 12 and 4 units.
  const Shape shapes[] = {{256, 1, 9},   {512, 37, 16}, {256, 70, 17},   {256, 5, 33},
                          {256, 19, 64}, {512, 67, 100}, {1024, 37, 20}, {1280, 70, 40}};
  uint32_t seed = 9100;
  for (DType t : kQuantTypes) {
    std::vector<Shape> all(std::begin(shapes), std::end(shapes));
    if (quant::find_traits(t)->block_size == 32)
      all.insert(all.end(), {{64, 21, 256}, {96, 130, 40}, {288, 33, 12}, {864, 70, 40}});
    else
      all.push_back({256, 64, 256});
    for (const Shape& s : all) {
      const std::vector<float> wf = randn(static_cast<size_t>(s.k * s.m), seed++);
      const std::vector<uint8_t> wb = encode(t, wf, s.m, s.k);
      const std::vector<float> xf = randn(static_cast<size_t>(s.k * s.n), seed++);
      const std::vector<float> got = mul_mat_on(*cuda, t, wb, xf, s.k, s.m, s.n);
      const std::vector<float> want = mul_mat_on(**cpu, t, wb, xf, s.k, s.m, s.n);
      const std::vector<float> wd = decode(t, wb, s.k * s.m);
      const std::vector<double> exact = matmul_reference(wd, xf, s.k, s.m, s.n);
      const std::vector<double> same_codes = int8_reference(wd, xf, s.k, s.m, s.n);
      INFO(quant::find_traits(t)->name, " k=", s.k, " m=", s.m, " n=", s.n);
      const double e_exact = nmse(got, exact), e_cpu = nmse(got, to_double(want)), e_int8 = nmse(got, same_codes);
      CHECK(e_exact < 2e-4);  // 8-bit activations vs exact math (mul_mat_bound's 1e-4, doubled: 9 outputs are noisy)
      CHECK(e_exact > 0);     // (the int8 kernel ran, not a float path)
      // Both quantize activations to 8 bits: alike on AVX-512 VNNI hosts (~1e-14; Q2_K not); on
      // AVX2 ones the CPU's per-row dots take Q8_K's 256-element blocks where mmq takes 32-element
      // ones. Each is within 2e-4 of the exact result, so within 8e-4 of the other.
      CHECK(e_cpu < 8e-4);
      CHECK(e_int8 < 1e-10);  // the same int8 codes: only float rounding differs
    }
  }
}

TEST_CASE("cuda: mmq routing, KITE_CUDA_MMQ and the 256-column threshold") {
  auto cuda = cuda_or_skip();
  if (!cuda) return;
  const DType t = DType::Q4_K;
  const int64_t k = 256, m = 16;
  uint32_t seed = 9300;
  for (int64_t n : {17, 257}) {
    const std::vector<float> wf = randn(static_cast<size_t>(k * m), seed++);
    const std::vector<uint8_t> wb = encode(t, wf, m, k);
    const std::vector<float> xf = randn(static_cast<size_t>(k * n), seed++);
    std::vector<float> by_default, mmq, cublas;
    {
      const MmqEnv env(nullptr);
      by_default = mul_mat_on(*cuda, t, wb, xf, k, m, n);
    }
    {
      const MmqEnv env("1");
      mmq = mul_mat_on(*cuda, t, wb, xf, k, m, n);
    }
    {
      const MmqEnv env("0");
      cublas = mul_mat_on(*cuda, t, wb, xf, k, m, n);
    }
    INFO("n=", n);
    // The two paths agree closely but not bit for bit (int8 vs F16 activations).
    CHECK(nmse(mmq, to_double(cublas)) < 1e-4);
    CHECK(mmq != cublas);
    CHECK(by_default == (n <= 256 ? mmq : cublas));
  }
}

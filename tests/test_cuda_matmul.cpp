// The CUDA backend's matmuls beyond the op conformance test (test_ops.cpp): the int8
// tensor-core matmul (backends/cuda/k_mmq.cu, launch_mmq) for every quantized weight type with
// more columns than the mat-vec kernels take, run with KITE_CUDA_MMQ=1 and compared with the CPU
// backend and with an exact host model of the kernel's arithmetic (the same int8 activations),
// and its routing (mmq or cuBLAS, timed per shape; KITE_CUDA_MMQ); the mat-vec launch that also computes a
// residual add and the rms_norm after it (ops.cpp run_fused), against the unfused launches. Without
// the CUDA backend or a device the cases skip, visibly. (The emulator's mma.sync is tested in
// test_cuda_emu.cpp; test_ops.cpp's "ops: mul_mat ..." cases run mmq and cuBLAS too, as the
// backend's timing of each shape chose.)
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include "src/core/backend.h"
#include "src/core/devices.h"
#include "tests/ops_test_util.h"
#ifdef KITE_CUDA
#include "backends/cuda/cuda_backend.h"
#endif
#ifdef KITE_CUDA_EMU
#include "backends/cuda/emu/runtime.h"
#include "backends/cuda/kernels.h"
#endif

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
  std::vector<DType> types(std::begin(kQuantTypes), std::end(kQuantTypes));
  types.insert(types.end(), std::begin(kIqTypes), std::end(kIqTypes));
  for (DType t : types) {
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

TEST_CASE("cuda: mmq or cuBLAS per shape, timed at first use, or forced by KITE_CUDA_MMQ") {
  auto cuda = cuda_or_skip();
  if (!cuda) return;
#ifdef KITE_CUDA
  const DType t = DType::Q4_K;
  const int64_t k = 256, m = 16;
  uint32_t seed = 9300;
  cuda::reset_cuda_matmul_choices();
  for (int64_t n : {17, 257}) {
    const std::vector<float> wf = randn(static_cast<size_t>(k * m), seed++);
    const std::vector<uint8_t> wb = encode(t, wf, m, k);
    const std::vector<float> xf = randn(static_cast<size_t>(k * n), seed++);
    std::vector<float> first, again, mmq, cublas;
    {
      const MmqEnv env(nullptr);
      first = mul_mat_on(*cuda, t, wb, xf, k, m, n);  // timed both ways
      again = mul_mat_on(*cuda, t, wb, xf, k, m, n);  // the choice, untimed
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
    const std::vector<cuda::MatmulChoice> choices = cuda::cuda_matmul_choices();
    const auto c = std::find_if(choices.begin(), choices.end(), [&](const cuda::MatmulChoice& c) {
      return c.type == t && c.k == k && c.m == m && c.cols == static_cast<int64_t>(std::bit_ceil(uint64_t(n)));
    });
    REQUIRE(c != choices.end());
    CHECK(c->mmq_ms > 0);
    CHECK(c->cublas_ms > 0);
    CHECK(c->mmq == (c->mmq_ms <= c->cublas_ms));
    // The timing step left the chosen way's bits, and later steps took that way.
    CHECK(first == (c->mmq ? mmq : cublas));
    CHECK(again == first);
  }
  CHECK(cuda::cuda_matmul_choices().size() == 2);
  CHECK(measured_choices("cuda").size() == 2);
  // Forced ways time nothing.
  cuda::reset_cuda_matmul_choices();
  {
    const MmqEnv env("0");
    const std::vector<uint8_t> wb = encode(t, randn(static_cast<size_t>(k * m), seed++), m, k);
    mul_mat_on(*cuda, t, wb, randn(static_cast<size_t>(k * 40), seed++), k, m, 40);
  }
  CHECK(cuda::cuda_matmul_choices().empty());
#ifdef KITE_CUDA_EMU
  // Where cuBLAS's F16 weight scratch (here 8 MiB) does not fit in device memory, the shape keeps
  // mmq, untimed, and the step still succeeds with mmq's bits.
  {
    const int64_t k2 = 2048, m2 = 2048, n2 = 16;
    const std::vector<uint8_t> wb = encode(t, randn(static_cast<size_t>(k2 * m2), seed++), m2, k2);
    const std::vector<float> xf = randn(static_cast<size_t>(k2 * n2), seed++);
    auto small = cuda_or_skip();  // (a backend with no scratch grown yet)
    REQUIRE(small);
    std::vector<float> got, mmq;
    {
      const ScopedEnv memory("KITE_CUDA_EMU_MEMORY_MB", "6");
      got = mul_mat_on(*small, t, wb, xf, k2, m2, n2);
    }
    {
      const MmqEnv env("1");
      mmq = mul_mat_on(*small, t, wb, xf, k2, m2, n2);
    }
    const std::vector<cuda::MatmulChoice> choices = cuda::cuda_matmul_choices();
    REQUIRE(choices.size() == 1);
    CHECK(choices[0].mmq);
    CHECK(choices[0].cublas_ms == 0);
    CHECK(got == mmq);
    CHECK(measured_choices("cuda")[0].find("cuBLAS could not run") != std::string::npos);
  }
  // The timing's cuBLAS scratch (the F16 weight chunk: 8 MiB here, with headroom 10) is held
  // after it only where cuBLAS was kept; a cuBLAS made slow keeps mmq. (Device memory is the
  // emulator's exact count.) The slow cuBLAS takes 4x a whole forced-mmq step longer than it
  // would, as measured here: the emulator's mmq runs far slower shuffled or sanitized.
  double mmq_ms = 0;
  {
    const MmqEnv env("1");
    auto probe = cuda_or_skip();
    REQUIRE(probe);
    const std::vector<uint8_t> wb = encode(t, randn(static_cast<size_t>(2048 * 2048), seed), 2048, 2048);
    const std::vector<float> xf = randn(static_cast<size_t>(2048 * 16), seed + 1);
    const auto t0 = std::chrono::steady_clock::now();
    mul_mat_on(*probe, t, wb, xf, 2048, 2048, 16);
    mmq_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }
  for (const std::string& delay : {std::string("0"), std::to_string(static_cast<int>(4 * mmq_ms) + 20)}) {
    const ScopedEnv slow("KITE_CUDA_EMU_CUBLAS_DELAY_MS", delay.c_str());
    cuda::reset_cuda_matmul_choices();
    const int64_t k2 = 2048, m2 = 2048, n2 = 16;
    const std::vector<uint8_t> wb = encode(t, randn(static_cast<size_t>(k2 * m2), seed++), m2, k2);
    const std::vector<float> xf = randn(static_cast<size_t>(k2 * n2), seed++);
    auto fresh = cuda_or_skip();
    REQUIRE(fresh);
    const size_t before = fresh->memory_info().value().free;
    const std::vector<float> got = mul_mat_on(*fresh, t, wb, xf, k2, m2, n2);
    const size_t held = before - fresh->memory_info().value().free;
    const std::vector<cuda::MatmulChoice> choices = cuda::cuda_matmul_choices();
    REQUIRE(choices.size() == 1);
    INFO("cuBLAS delay ", delay, " ms: ", std::string(choices[0].mmq ? "mmq" : "cuBLAS"),
         " kept; device memory held after the step: ", held >> 10, " KiB");
    CHECK(choices[0].cublas_ms > 0);
    if (delay != "0") CHECK(choices[0].mmq);
    if (choices[0].mmq)
      CHECK(held < (size_t{2} << 20));
    else
      CHECK(held >= (size_t{8} << 20));
    // The kept way's bits, whichever it was.
    const MmqEnv env(choices[0].mmq ? "1" : "0");
    CHECK(got == mul_mat_on(*fresh, t, wb, xf, k2, m2, n2));
  }
#endif
#endif
}

TEST_CASE("cuda: a residual add's mat-vec launch normalizes the sum with the norm kernel's bits") {
  auto cuda = cuda_or_skip();
  if (!cuda) return;
  auto cpu = create_backend("cpu");
  REQUIRE(cpu.ok());
  const ScopedEnv op_by_op("KITE_CUDA_GRAPHS", "0");
  // sum = res + W1 · x, h = rms_norm(sum) (then, in the second graph, W2 · h + h: the norm also
  // quantizes h for W2's int8 kernel, and h's bits show in the output). For one column the
  // mat-vec launch's last block normalizes the sum (kMaxNormTailCols), summing it in the norm
  // kernel's order: widths whose sums run as 64, 256 and 1024 threads, the last 1024-wide
  // stretch partial (1280) or whole (4096). More columns take the norm's own launch.
  const int64_t k = 256;
  uint32_t seed = 9500;
  for (DType t : {DType::Q4_K, DType::Q8_0, DType::F16}) {
    for (int64_t m : {96, 256, 1280, 4096}) {
      for (int64_t n : {1, 2}) {
        for (const bool weighted : {true, false}) {
          for (const bool then_matmul : {false, true}) {
            // (W2 is [m, m]: whole weight blocks, and not too big for the emulator.)
            if (then_matmul && (m % quant::find_traits(t)->block_size != 0 || m > 1280)) continue;
            const std::vector<float> w1 = randn(static_cast<size_t>(k * m), seed++);
            const std::vector<uint8_t> w1b = encode(t, w1, m, k);
            const std::vector<float> xf = randn(static_cast<size_t>(k * n), seed++);
            const std::vector<float> rf = randn(static_cast<size_t>(m * n), seed++, 4.f);
            const std::vector<float> nwf = randn(static_cast<size_t>(m), seed++);
            const std::vector<uint8_t> w2b = then_matmul ? encode(t, randn(static_cast<size_t>(m * m), seed++), m, m)
                                                         : std::vector<uint8_t>{};
            auto run = [&](Backend& be) {
              Graph g;
              Tensor* w1t = g.input(t, {k, m}, "w1");
              Tensor* x = g.input(DType::F32, {k, n}, "x");
              Tensor* res = g.input(DType::F32, {m, n}, "res");
              std::vector<Input> in = {{w1t, w1b}, {x, bytes_of(xf)}, {res, bytes_of(rf)}};
              Tensor* nw = nullptr;
              if (weighted) {
                nw = g.input(DType::F32, {m}, "norm_w");
                in.push_back({nw, bytes_of(nwf)});
              }
              Tensor* h = g.rms_norm(g.add(res, g.mul_mat(w1t, x)), nw, 1e-5f);
              Tensor* out = h;
              if (then_matmul) {
                Tensor* w2t = g.input(t, {m, m}, "w2");
                out = g.add(g.mul_mat(w2t, h), h);
                in.push_back({w2t, w2b});
              }
              return run_graph(be, g, out, in);
            };
            const std::string what = std::string(quant::find_traits(t)->name) + " m=" + std::to_string(m) +
                                     " n=" + std::to_string(n) + (weighted ? " weighted" : "") +
                                     (then_matmul ? " then W2" : "");
            INFO(what);
            std::vector<float> fused, plain;
            uint64_t launches[2] = {0, 0};
            for (const bool fuse : {true, false}) {
              const ScopedEnv env("KITE_CUDA_FUSE", fuse ? nullptr : "0");
#ifdef KITE_CUDA_EMU
              const uint64_t before = cuda::emu::counters().launches;
#endif
              (fuse ? fused : plain) = run(*cuda);
#ifdef KITE_CUDA_EMU
              launches[fuse ? 0 : 1] = cuda::emu::counters().launches - before;
#endif
            }
            CHECK(fused == plain);
            // Near the CPU's: W1's 8-bit activations; then h's, on both sides, in blocks of 32
            // here and of 32 or 256 on the CPU (as in the mmq case above).
            CHECK(nmse(fused, to_double(run(**cpu))) < (then_matmul ? 8e-4 : 1e-4));
#ifdef KITE_CUDA_EMU
            // Unfused: W1 (after x's quantization, for int8 weights), add, norm, (h's quantization
            // for int8 weights,) W2, add. Fused: the adds join the mat-vec launches and, for one
            // column, so does the norm; the norm quantizes h in its launch.
            const unsigned w2_saved = then_matmul ? (ops_test::is_float(t) ? 1u : 2u) : 0u;
            CHECK(launches[1] - launches[0] == (n <= cuda::kMaxNormTailCols ? 2u : 1u) + w2_saved);
#endif
            (void)launches;
          }
        }
      }
    }
  }
}

TEST_CASE("cuda: the q/k/v mat-vec launch ropes q and k and writes the caches with the unfused bits") {
  auto cuda = cuda_or_skip();
  if (!cuda) return;
  auto cpu = create_backend("cpu");
  REQUIRE(cpu.ok());
  const ScopedEnv op_by_op("KITE_CUDA_GRAPHS", "0");
  const MmqEnv mmq("1");  // (twelve columns: no timing runs in the launch counts)
  // A layer's q, k, v = Wq·x (+ bq), Wk·x (+ bk), Wv·x (+ bv), (per-head rms_norms of q and k,)
  // rope(q) and rope(k), k and v written to slots of float caches, built in the model's order
  // (src/model/model.cpp): for one column the q/k/v launch's blocks rope their own rows and
  // write the caches (MatVecJob::with_rope), or with the head norms each head's last block
  // normalizes and ropes it. Heads of 64 with every dimension or half of them rotated (the rest
  // copied), adjacent rotary pairs (llama) or rotated halves (qwen2, with its biases; qwen3, with
  // its head norms), 4 query and 2 key/value heads, no scaling, llama3's and yarn's, F16, BF16
  // and F32 caches, int8 and F16 weights, v's of another type (q and k's launch, then v's: each
  // with its share of the tail); two columns take the rope's own launch, and twelve the int8
  // tensor-core matmul (its bias in a launch of its own).
  const int64_t k = 256, hd = 64, n_head = 4, n_kv = 2, n_slots = 16;
  struct Case {
    DType w, wv, cache;
    int n_rot;
    RopeScaling scaling;
    int64_t n;
    RopeMode mode = RopeMode::kNorm;
    bool bias = false;
    bool head_norm = false;
  };
  constexpr RopeMode kNorm = RopeMode::kNorm, kNeox = RopeMode::kNeox;
  uint32_t seed = 9700;
  for (const Case& c : {Case{DType::Q4_K, DType::Q4_K, DType::F16, 64, RopeScaling::kNone, 1},
                        Case{DType::Q8_0, DType::Q8_0, DType::BF16, 32, RopeScaling::kLlama3, 1},
                        Case{DType::Q4_0, DType::Q4_0, DType::F32, 64, RopeScaling::kYarn, 1},
                        Case{DType::F16, DType::F16, DType::F16, 32, RopeScaling::kNone, 1},
                        Case{DType::Q4_K, DType::Q6_K, DType::F16, 32, RopeScaling::kNone, 1},
                        Case{DType::Q8_0, DType::Q8_0, DType::F16, 64, RopeScaling::kNone, 2},
                        Case{DType::Q8_0, DType::Q8_0, DType::F16, 64, RopeScaling::kNone, 1, kNeox, true},
                        Case{DType::Q4_K, DType::Q6_K, DType::BF16, 32, RopeScaling::kYarn, 1, kNeox, true},
                        Case{DType::Q4_0, DType::Q4_0, DType::F32, 64, RopeScaling::kNone, 1, kNeox},
                        Case{DType::F16, DType::F16, DType::F16, 64, RopeScaling::kNone, 1, kNeox, true},
                        Case{DType::Q8_0, DType::Q8_0, DType::F16, 64, RopeScaling::kNone, 2, kNeox, true},
                        Case{DType::Q4_K, DType::Q4_K, DType::F16, 64, RopeScaling::kNone, 12, kNeox, true},
                        Case{DType::Q8_0, DType::Q8_0, DType::F16, 64, RopeScaling::kNone, 1, kNeox, false, true},
                        Case{DType::Q4_K, DType::Q6_K, DType::BF16, 32, RopeScaling::kYarn, 1, kNeox, false, true},
                        Case{DType::F16, DType::F16, DType::F32, 64, RopeScaling::kNone, 1, kNorm, false, true},
                        Case{DType::Q8_0, DType::Q8_0, DType::F16, 64, RopeScaling::kNone, 2, kNeox, false, true}}) {
    const std::vector<uint8_t> wq = encode(c.w, randn(static_cast<size_t>(k * hd * n_head), seed++), hd * n_head, k);
    const std::vector<uint8_t> wk = encode(c.w, randn(static_cast<size_t>(k * hd * n_kv), seed++), hd * n_kv, k);
    const std::vector<uint8_t> wv = encode(c.wv, randn(static_cast<size_t>(k * hd * n_kv), seed++), hd * n_kv, k);
    const std::vector<float> bq = randn(static_cast<size_t>(hd * n_head), seed++);
    const std::vector<float> bk = randn(static_cast<size_t>(hd * n_kv), seed++);
    const std::vector<float> bv = randn(static_cast<size_t>(hd * n_kv), seed++);
    std::vector<float> qn = randn(static_cast<size_t>(hd), seed++), kn = randn(static_cast<size_t>(hd), seed++);
    for (float& w : qn) w = 1.f + 0.25f * w;
    for (float& w : kn) w = 1.f + 0.25f * w;
    const std::vector<float> xf = randn(static_cast<size_t>(k * c.n), seed++);
    std::vector<int32_t> pos, slots;
    for (int64_t i = 0; i < c.n; ++i) {
      pos.push_back(static_cast<int32_t>(300 + i));
      slots.push_back(static_cast<int32_t>((5 + 7 * i) % n_slots));
    }
    RopeParams rp;
    rp.mode = c.mode;
    rp.n_rot = c.n_rot;
    rp.scaling = c.scaling;
    rp.factor = 4.f;
    rp.original_ctx = 256;
    // q's rope, then the two caches, as floats.
    auto run = [&](Backend& be) {
      Graph g;
      Tensor* wqt = g.input(c.w, {k, hd * n_head}, "wq");
      Tensor* wkt = g.input(c.w, {k, hd * n_kv}, "wk");
      Tensor* wvt = g.input(c.wv, {k, hd * n_kv}, "wv");
      Tensor* bqt = g.input(DType::F32, {hd * n_head}, "bq");
      Tensor* bkt = g.input(DType::F32, {hd * n_kv}, "bk");
      Tensor* bvt = g.input(DType::F32, {hd * n_kv}, "bv");
      Tensor* qnt = g.input(DType::F32, {hd}, "q_norm");
      Tensor* knt = g.input(DType::F32, {hd}, "k_norm");
      Tensor* x = g.input(DType::F32, {k, c.n}, "x");
      Tensor* pt = g.input(DType::I32, {c.n}, "pos");
      Tensor* st = g.input(DType::I32, {c.n}, "slots");
      Tensor* kc = g.input(c.cache, {hd * n_kv, n_slots}, "cache_k");
      Tensor* vc = g.input(c.cache, {hd * n_kv, n_slots}, "cache_v");
      Tensor* q = g.mul_mat(wqt, x, c.bias ? bqt : nullptr);
      Tensor* kk = g.mul_mat(wkt, x, c.bias ? bkt : nullptr);
      Tensor* v = g.mul_mat(wvt, x, c.bias ? bvt : nullptr);
      q = g.reshape(q, {hd, n_head, c.n});
      kk = g.reshape(kk, {hd, n_kv, c.n});
      if (c.head_norm) {
        q = g.rms_norm(q, qnt, 1e-6f);
        kk = g.rms_norm(kk, knt, 1e-6f);
      }
      q = g.rope(q, pt, rp);
      kk = g.rope(kk, pt, rp);
      Tensor* kw = g.kv_write(kc, g.reshape(kk, {hd * n_kv, c.n}), st);
      Tensor* vw = g.kv_write(vc, v, st);
      for (Tensor* out : {q, kw, vw}) g.build(out);
      const MemoryPlan plan = MemoryPlan::make(g);
      auto buf = be.alloc(plan.arena_bytes() + 64);
      REQUIRE(buf.ok());
      plan.place(g, static_cast<uint8_t*>((*buf)->base()));
      const std::vector<uint8_t> empty(kc->nbytes(), 0);
      std::vector<Input> inputs = {{wqt, wq}, {wkt, wk}, {wvt, wv}, {x, bytes_of(xf)}, {pt, bytes_of_i32(pos)},
                                   {st, bytes_of_i32(slots)}, {kc, empty}, {vc, empty}};
      if (c.bias) inputs.insert(inputs.end(), {{bqt, bytes_of(bq)}, {bkt, bytes_of(bk)}, {bvt, bytes_of(bv)}});
      if (c.head_norm) inputs.insert(inputs.end(), {{qnt, bytes_of(qn)}, {knt, bytes_of(kn)}});
      for (const Input& in : inputs) REQUIRE(be.upload(*in.t, in.bytes.data(), in.bytes.size()).ok());
      REQUIRE(be.compute(g.nodes()).ok());
      REQUIRE(be.synchronize().ok());
      std::vector<float> all;
      for (const Tensor* t : {q, kc, vc}) {
        std::vector<uint8_t> raw(t->nbytes());
        REQUIRE(be.download(*t, raw.data(), raw.size()).ok());
        const std::vector<float> f = decode(t->type, raw, t->n_elements());
        all.insert(all.end(), f.begin(), f.end());
      }
      return all;
    };
    INFO(quant::find_traits(c.w)->name, " v ", quant::find_traits(c.wv)->name, " cache ", quant::find_traits(c.cache)->name, " n_rot=", c.n_rot,
         " scaling=", static_cast<int>(c.scaling), " n=", c.n, " mode=", static_cast<int>(c.mode), " bias=", c.bias,
         " head_norm=", c.head_norm);
    // The rope tail, the rope's own launch (KITE_CUDA_ROPE_TAIL=0) and one launch per op.
    std::vector<float> got[3];
    uint64_t launches[3] = {};
    const char* knobs[3][2] = {{"KITE_CUDA_ROPE_TAIL", nullptr}, {"KITE_CUDA_ROPE_TAIL", "0"}, {"KITE_CUDA_FUSE", "0"}};
    for (int i = 0; i < 3; ++i) {
      const ScopedEnv env(knobs[i][0], knobs[i][1]);
#ifdef KITE_CUDA_EMU
      const uint64_t before = cuda::emu::counters().launches;
#endif
      got[i] = run(*cuda);
#ifdef KITE_CUDA_EMU
      launches[i] = cuda::emu::counters().launches - before;
#endif
    }
    CHECK(got[0] == got[1]);
    CHECK(got[0] == got[2]);
    CHECK(nmse(got[0], to_double(run(**cpu))) < 1e-4);
#ifdef KITE_CUDA_EMU
    // (With the head norms the tail saves their launch too.)
    CHECK(launches[1] - launches[0] == (c.n <= cuda::kMaxRopeTailCols ? (c.head_norm ? 2u : 1u) : 0u));
#endif
    (void)launches;
  }
}

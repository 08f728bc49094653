// kite/tests/ops_test_util.h — what the op conformance tests share (test_ops.cpp,
// test_ops_attention.cpp): random data, encoding into weight types, normalized error, running a
// graph on a backend, and the loop over every registered backend and CPU SIMD level.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "backends/cpu/cpu_features.h"
#include "backends/cpu/matmul.h"
#include "formats/quant/types.h"
#include "src/base/half.h"
#include "src/core/backend.h"
#include "src/core/graph.h"
#include "src/core/planner.h"

namespace kite::ops_test {

using cpu::SimdLevel;

inline std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

inline std::vector<uint8_t> bytes_of(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

inline std::vector<uint8_t> bytes_of_i32(const std::vector<int32_t>& v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// Rows of `cols` floats encoded as `t`; for the types kite only decodes (the IQ codebook types),
// random blocks of x's RMS instead (seeded by x's first value).
inline std::vector<uint8_t> encode(DType t, const std::vector<float>& x, int64_t rows, int64_t cols) {
  const size_t rb = quant::row_size(t, cols).value();
  std::vector<uint8_t> out(rb * static_cast<size_t>(rows));
  if (quant::can_randomize(t)) {
    double s2 = 0;
    for (float v : x) s2 += static_cast<double>(v) * v;
    uint32_t seed;
    std::memcpy(&seed, x.data(), sizeof seed);
    const auto rms = static_cast<float>(std::sqrt(s2 / static_cast<double>(x.size())));
    REQUIRE(quant::random_blocks(t, out.data(), rows * cols, seed, rms).ok());
    return out;
  }
  REQUIRE(quant::quantize_rows(t, x.data(), out.data(), rows, cols).ok());
  return out;
}

inline std::vector<float> decode(DType t, const std::vector<uint8_t>& b, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  REQUIRE(quant::dequantize_row(t, b.data(), out.data(), n).ok());
  return out;
}

// na activation rows of k floats (row j at xf[j * k]) quantized as the tiles, gemm8 and wgemm
// take them: ActQ8, or for the 16-element-scale types (t16) kQ8U (codes + 128, half sums).
inline std::vector<uint8_t> tile_acts(const cpu::MatmulKernels& mk, const std::vector<float>& xf, int64_t k, int na,
                                      bool t16) {
  const size_t ab = cpu::act_row_bytes(cpu::ActFormat::kQ8, k);
  std::vector<uint8_t> at(ab * static_cast<size_t>(na));
  for (int j = 0; j < na; ++j) {
    mk.quantize_q8(&xf[static_cast<size_t>(j * k)], at.data() + ab * static_cast<size_t>(j), k);
    if (t16) cpu::act_q8_to_q8u(at.data() + ab * static_cast<size_t>(j), k);
  }
  return at;
}

inline double nmse(const std::vector<float>& got, const std::vector<double>& ref) {
  REQUIRE(got.size() == ref.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    num += (got[i] - ref[i]) * (got[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return den > 0 ? num / den : num;
}

struct Input {
  Tensor* t;
  std::vector<uint8_t> bytes;
};

// Plans, places and runs the graph that ends in `out` on `be`; returns out's elements as floats.
inline std::vector<float> run_graph(Backend& be, Graph& g, Tensor* out, const std::vector<Input>& inputs) {
  g.build(out);
  const MemoryPlan plan = MemoryPlan::make(g);
  auto buf = be.alloc(plan.arena_bytes() + 64);
  REQUIRE(buf.ok());
  plan.place(g, static_cast<uint8_t*>((*buf)->base()));
  for (const Input& in : inputs) {
    REQUIRE(in.bytes.size() == in.t->nbytes());
    REQUIRE(be.upload(*in.t, in.bytes.data(), in.bytes.size()).ok());
  }
  REQUIRE(be.compute(g.nodes()).ok());
  REQUIRE(be.synchronize().ok());
  std::vector<uint8_t> raw(out->nbytes());
  REQUIRE(be.download(*out, raw.data(), raw.size()).ok());
  if (out->type == DType::F32) {
    std::vector<float> v(raw.size() / 4);
    std::memcpy(v.data(), raw.data(), raw.size());
    return v;
  }
  return decode(out->type, raw, out->n_elements());
}

// One way of running ops: a backend, and for the CPU a forced SIMD level.
// Sets an environment variable (or unsets it, for nullptr) for the guard's lifetime: the CUDA
// backend reads its routing knobs (KITE_CUDA_MMQ, KITE_CUDA_ATTN_TC) per call.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* v) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    set(v);
  }
  ~ScopedEnv() { set(old_ ? old_->c_str() : nullptr); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  void set(const char* v) const {
    if (v)
      ::setenv(name_.c_str(), v, 1);
    else
      ::unsetenv(name_.c_str());
  }
  std::string name_;
  std::optional<std::string> old_;
};

struct Config {
  std::string label;
  Backend* backend;
  bool cpu;
  SimdLevel level;
};

// Calls fn for every registered backend (2 threads) and, for the CPU, every supported level
// (plus a 3-thread CPU run at the best level, for the work splitting).
inline void for_each_config(const std::function<void(const Config&)>& fn) {
  for (const std::string& name : backend_names()) {
    const bool is_cpu = name == "cpu";
    std::vector<int> threads = is_cpu ? std::vector<int>{2, 3, 1} : std::vector<int>{0};
    for (int nt : threads) {
      BackendOptions opts;
      opts.n_threads = nt;
      auto be = create_backend(name, opts);
      // A GPU backend compiled in but without a device here is skipped, visibly; any other
      // failure to create a backend is an error.
      if (!be.ok() && !is_cpu &&
          (be.error().message.find("no CUDA device found") != std::string::npos ||
           be.error().message.find("no Vulkan device found") != std::string::npos)) {
        static std::set<std::string> said;  // once per backend and run, not once per op variant
        if (said.insert(name).second) MESSAGE(name, ": skipped, no device (", be.error().message, ")");
        continue;
      }
      REQUIRE_MESSAGE(be.ok(), "backend ", name, ": ", be.ok() ? std::string() : be.error().message);
      std::vector<SimdLevel> levels = {cpu::best_simd_level()};
      if (is_cpu && nt == 2) levels = cpu::supported_simd_levels();
      for (SimdLevel l : levels) {
        if (is_cpu) cpu::force_simd_level(l);
        const std::string label =
            name + (is_cpu ? std::string("/") + cpu::simd_level_name(l) + "/t" + std::to_string(nt) : "");
        fn(Config{label, be->get(), is_cpu, l});
      }
    }
  }
  cpu::reset_simd_level();
}

inline constexpr DType kFloatTypes[] = {DType::F32, DType::F16, DType::BF16};
inline constexpr DType kQuantTypes[] = {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0,
                             DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K,
                             DType::IQ4_NL, DType::IQ4_XS};

// The codebook types (kite decodes them; its quantizer does not make them: encode() makes random
// blocks).
inline constexpr DType kIqTypes[] = {DType::IQ2_XXS, DType::IQ2_XS, DType::IQ2_S, DType::IQ3_XXS,
                                     DType::IQ3_S,   DType::IQ1_S,  DType::IQ1_M};

inline bool is_float(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }

// NMSE bound for mul_mat of n activation rows: exact f32 math (scalar reference, float weights,
// and Vulkan, which multiplies decoded weights in f32 for every type) vs activations quantized to
// 8 bits on the fly, or for BF16 weights on CPUs that multiply bf16 pairs rounded to bf16 (each
// value within 2^-9 relative: NMSE ~1.3e-6).
inline double mul_mat_bound(const Config& c, DType t, int64_t n) {
  if (c.cpu && c.level != SimdLevel::kScalar &&
      cpu::mul_mat_act_format(cpu::matmul_kernels_for(c.level), t, n) == cpu::ActFormat::kBF16)
    return 1e-5;
  if (is_float(t) || (c.cpu && c.level == SimdLevel::kScalar) || c.label.rfind("vulkan", 0) == 0) return 1e-9;
  return 1e-4;
}

// x is [k, n] (or 3-D [k, n1, n2] when n2 > 1), optionally a strided view with a gap between
// its n2 groups of n1 rows.
inline void check_mul_mat(DType t, int64_t k, int64_t m, int64_t n1, int64_t n2, bool gap, uint32_t seed) {
  const int64_t n = n1 * n2;
  const std::vector<float> wf = randn(static_cast<size_t>(k * m), seed);
  const std::vector<uint8_t> wb = encode(t, wf, m, k);
  const std::vector<float> wd = decode(t, wb, k * m);  // the values the kernels must multiply
  const int64_t stored_rows = gap ? n2 * (n1 + 1) : n;
  const std::vector<float> xf = randn(static_cast<size_t>(k * stored_rows), seed + 1);
  auto x_at = [&](int64_t j) {
    const int64_t i1 = j % n1, i2 = j / n1;
    return &xf[static_cast<size_t>((gap ? i2 * (n1 + 1) + i1 : j) * k)];
  };
  std::vector<double> ref(static_cast<size_t>(m * n));
  for (int64_t j = 0; j < n; ++j)
    for (int64_t i = 0; i < m; ++i) {
      double s = 0;
      const float* xr = x_at(j);
      for (int64_t e = 0; e < k; ++e) s += static_cast<double>(wd[static_cast<size_t>(i * k + e)]) * xr[e];
      ref[static_cast<size_t>(j * m + i)] = s;
    }
  for_each_config([&](const Config& c) {
    Graph g;
    Tensor* w = g.input(t, {k, m}, "w");
    Tensor* xs = g.input(DType::F32, {k, stored_rows}, "x");
    Tensor* x = xs;
    if (n2 > 1 || gap) {
      x = g.reshape(xs, {k, gap ? n1 + 1 : n1, n2});
      if (gap) {
        x->ne[1] = n1;  // a strided view: n2 groups of n1 rows, one row skipped between groups
      }
    }
    Tensor* y = g.mul_mat(w, x);
    const std::vector<float> got = run_graph(*c.backend, g, y, {{w, wb}, {xs, bytes_of(xf)}});
    const double e = nmse(got, ref);
    INFO(c.label, " ", quant::find_traits(t)->name, " k=", k, " m=", m, " n=", n1, "x", n2, gap ? " strided" : "");
    CHECK(e < mul_mat_bound(c, t, n));
    // The int8 (bf16) kernels really ran (an exact result would mean the reference was used).
    if (mul_mat_bound(c, t, n) > 1e-9) CHECK(e > 0);
  });
}

// Runs a single-output graph built by `build` on every config and compares with `ref`.
inline void check_op(const char* what, const std::vector<double>& ref, double bound,
              const std::function<std::vector<float>(Backend&)>& run) {
  for_each_config([&](const Config& c) {
    const std::vector<float> got = run(*c.backend);
    INFO(std::string(what), " on ", c.label);
    CHECK(nmse(got, ref) < bound);
  });
}

}  // namespace kite::ops_test

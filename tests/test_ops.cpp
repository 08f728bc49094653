// Op conformance: every op and variant, run through each registered backend (and, for the CPU,
// through every SIMD level this machine supports, forced in turn), compared with naive
// double-precision references written here by normalized mean squared error on random data
// (fixed seeds).
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/cpu_features.h"
#include "backends/cpu/matmul.h"
#include "formats/quant/types.h"
#include "src/base/half.h"
#include "src/core/backend.h"
#include "src/core/graph.h"
#include "src/core/planner.h"

namespace kite {
namespace {

using cpu::SimdLevel;

std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

std::vector<uint8_t> bytes_of(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

std::vector<uint8_t> bytes_of_i32(const std::vector<int32_t>& v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// Rows of `cols` floats encoded as `t`.
std::vector<uint8_t> encode(DType t, const std::vector<float>& x, int64_t rows, int64_t cols) {
  const size_t rb = quant::row_size(t, cols).value();
  std::vector<uint8_t> out(rb * static_cast<size_t>(rows));
  REQUIRE(quant::quantize_rows(t, x.data(), out.data(), rows, cols).ok());
  return out;
}

std::vector<float> decode(DType t, const std::vector<uint8_t>& b, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  REQUIRE(quant::dequantize_row(t, b.data(), out.data(), n).ok());
  return out;
}

double nmse(const std::vector<float>& got, const std::vector<double>& ref) {
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
std::vector<float> run_graph(Backend& be, Graph& g, Tensor* out, const std::vector<Input>& inputs) {
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
struct Config {
  std::string label;
  Backend* backend;
  bool cpu;
  SimdLevel level;
};

// Calls fn for every registered backend (2 threads) and, for the CPU, every supported level
// (plus a 3-thread CPU run at the best level, for the work splitting).
void for_each_config(const std::function<void(const Config&)>& fn) {
  for (const std::string& name : backend_names()) {
    const bool is_cpu = name == "cpu";
    std::vector<int> threads = is_cpu ? std::vector<int>{2, 3, 1} : std::vector<int>{0};
    for (int nt : threads) {
      BackendOptions opts;
      opts.n_threads = nt;
      auto be = create_backend(name, opts);
      // A GPU backend compiled in but without a device here is skipped, visibly; any other
      // failure to create a backend is an error.
      if (!be.ok() && !is_cpu && be.error().message.find("no CUDA device found") != std::string::npos) {
        static bool said = false;  // once per run, not once per op variant
        if (!said) MESSAGE(name, ": skipped, no CUDA device (", be.error().message, ")");
        said = true;
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

const DType kFloatTypes[] = {DType::F32, DType::F16, DType::BF16};
const DType kQuantTypes[] = {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0,
                             DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K,
                             DType::IQ4_NL, DType::IQ4_XS};

bool is_float(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }

// NMSE bound for mul_mat: exact f32 math (scalar reference, float weights) vs activations
// quantized to 8 bits on the fly.
double mul_mat_bound(const Config& c, DType t) {
  if (is_float(t) || (c.cpu && c.level == SimdLevel::kScalar)) return 1e-9;
  return 1e-4;
}

// x is [k, n] (or 3-D [k, n1, n2] when n2 > 1), optionally a strided view with a gap between
// its n2 groups of n1 rows.
void check_mul_mat(DType t, int64_t k, int64_t m, int64_t n1, int64_t n2, bool gap, uint32_t seed) {
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
    CHECK(e < mul_mat_bound(c, t));
    // The int8 kernels really ran (an exact result would mean the reference was used).
    if (mul_mat_bound(c, t) > 1e-9) CHECK(e > 0);
  });
}

TEST_CASE("ops: cpu features and simd levels") {
  const auto& f = cpu::cpu_features();
  MESSAGE("cpu features: ", f.describe(), "; best level ", std::string(cpu::simd_level_name(cpu::best_simd_level())));
  const auto levels = cpu::supported_simd_levels();
  REQUIRE(!levels.empty());
  CHECK(levels.front() == SimdLevel::kScalar);
  CHECK(levels.back() == cpu::best_simd_level());
  if (f.avx2 && f.fma && f.f16c) CHECK(levels.size() >= 2);
  SimdLevel l;
  CHECK(cpu::parse_simd_level("avx2", &l));
  CHECK(l == SimdLevel::kAvx2);
  CHECK_FALSE(cpu::parse_simd_level("sse9", &l));
  cpu::force_simd_level(SimdLevel::kScalar);
  CHECK(cpu::active_simd_level() == SimdLevel::kScalar);
  cpu::force_simd_level(SimdLevel::kAvx512);  // clamped to what the CPU has
  CHECK(cpu::active_simd_level() == cpu::best_simd_level());
  cpu::reset_simd_level();
}

TEST_CASE("ops: activation quantizers match their scalar versions") {
  const int64_t k = 512;
  const std::vector<float> x = randn(static_cast<size_t>(k), 7, 3.f);
  std::vector<uint8_t> ref8(cpu::act_row_bytes(cpu::ActFormat::kQ8, k)), refk(cpu::act_row_bytes(cpu::ActFormat::kQ8K, k));
  cpu::quantize_act_q8_scalar(x.data(), ref8.data(), k);
  cpu::quantize_act_q8k_scalar(x.data(), refk.data(), k);
  // The scalar Q8 blocks reproduce x within half a step.
  const auto* b = reinterpret_cast<const cpu::ActQ8*>(ref8.data());
  for (int64_t i = 0; i < k; ++i) CHECK(std::fabs(b[i / 32].d * b[i / 32].qs[i % 32] - x[static_cast<size_t>(i)]) <= 0.51f * b[i / 32].d);
  for (SimdLevel l : cpu::supported_simd_levels()) {
    if (l == SimdLevel::kScalar) continue;
    REQUIRE(cpu::matmul_kernels_for(l) != nullptr);
    const cpu::MatmulKernels& mk = *cpu::matmul_kernels_for(l);
    std::vector<uint8_t> q8(ref8.size()), qk(refk.size());
    mk.quantize_q8(x.data(), q8.data(), k);
    mk.quantize_q8k(x.data(), qk.data(), k);
    INFO(cpu::simd_level_name(l));
    for (DType t : kQuantTypes) CHECK(static_cast<bool>(mk.dot[static_cast<size_t>(t)][0]));
    for (DType t : kFloatTypes) CHECK(static_cast<bool>(mk.dot[static_cast<size_t>(t)][3]));
    CHECK(q8 == ref8);
    CHECK(qk == refk);
  }
}

TEST_CASE("ops: prefill tiles match the per-row kernels on the same activations") {
  const int64_t k = 512, na = 4;
  const std::vector<float> xf = randn(static_cast<size_t>(k * na), 77);
  for (SimdLevel l : cpu::supported_simd_levels()) {
    if (l == SimdLevel::kScalar) continue;
    REQUIRE(cpu::matmul_kernels_for(l) != nullptr);
    const cpu::MatmulKernels& mk = *cpu::matmul_kernels_for(l);
    int tiled_types = 0;
    for (DType t : kQuantTypes) {
      const auto id = static_cast<size_t>(t);
      const bool t16 = mk.tile16_pack[id] != nullptr;
      if (mk.tile_pack[id] == nullptr && !t16) continue;
      ++tiled_types;
      for (int nrows : {8, 5}) {
        const std::vector<uint8_t> wb = encode(t, randn(static_cast<size_t>(k * nrows), 78 + nrows), nrows, k);
        const size_t rb = wb.size() / static_cast<size_t>(nrows);
        // Activations for the tile (ActQ8, or ActQ8U with codes + 128) and for the row kernel.
        const size_t ab = cpu::act_row_bytes(cpu::ActFormat::kQ8, k);
        std::vector<uint8_t> at(ab * na);
        for (int j = 0; j < na; ++j) {
          mk.quantize_q8(&xf[static_cast<size_t>(j * k)], at.data() + ab * j, k);
          if (t16)
            for (size_t b = 0; b < ab; b += sizeof(cpu::ActQ8))
              for (int i = 0; i < 32; ++i) at[ab * j + b + 8 + i] ^= 0x80;
        }
        const cpu::ActFormat rf = cpu::act_format(t);
        const size_t rab = cpu::act_row_bytes(rf, k);
        std::vector<uint8_t> ar(rab * na);
        for (int j = 0; j < na; ++j)
          (rf == cpu::ActFormat::kQ8 ? mk.quantize_q8 : mk.quantize_q8k)(&xf[static_cast<size_t>(j * k)], ar.data() + rab * j, k);
        std::vector<uint8_t> tile(static_cast<size_t>(k / 32) * (t16 ? cpu::kTile16BlockBytes : cpu::kTileBlockBytes));
        const uint8_t* rows[cpu::kTileRows];
        for (int r = 0; r < nrows; ++r) rows[r] = wb.data() + rb * r;
        (t16 ? mk.tile16_pack[id] : mk.tile_pack[id])(rows, nrows, k, tile.data());
        float got[cpu::kMaxNa * cpu::kTileRows];
        (t16 ? mk.tile16_dot : mk.tile_dot)[na - 1](k, tile.data(), at.data(), ab, got);
        std::vector<float> g;
        std::vector<double> ref;
        for (int j = 0; j < na; ++j)
          for (int r = 0; r < nrows; ++r) {
            float one;
            mk.dot[id][0](k, rows[r], ar.data() + rab * j, rab, &one);
            ref.push_back(one);
            g.push_back(got[j * cpu::kTileRows + r]);
          }
        INFO(cpu::simd_level_name(l), " ", quant::find_traits(t)->name, " rows ", nrows);
        // Same weights; the activations differ only in block size for the K types (Q8 vs Q8_K).
        CHECK(nmse(g, ref) < (rf == cpu::ActFormat::kQ8 ? 1e-10 : 1e-4));
      }
    }
    if (l == SimdLevel::kAvx512) CHECK(tiled_types == 11);
  }
}

TEST_CASE("ops: gemm8 small-batch kernels match the packed tiles on the same activations") {
  const int64_t k = 512;
  const int max_na = cpu::kGemmMaxNa;
  const std::vector<float> xf = randn(static_cast<size_t>(k * max_na), 91);
  for (SimdLevel l : cpu::supported_simd_levels()) {
    if (l == SimdLevel::kScalar) continue;
    REQUIRE(cpu::matmul_kernels_for(l) != nullptr);
    const cpu::MatmulKernels& mk = *cpu::matmul_kernels_for(l);
    int types = 0;
    for (DType t : kQuantTypes) {
      const auto id = static_cast<size_t>(t);
      if (mk.gemm8[id] == nullptr) continue;
      ++types;
      const bool t16 = mk.tile16_pack[id] != nullptr;
      REQUIRE((t16 || mk.tile_pack[id] != nullptr));
      // ActQ8 activations (codes + 128 for the 16-element-scale types), as both paths take them.
      const size_t ab = cpu::act_row_bytes(cpu::ActFormat::kQ8, k);
      std::vector<uint8_t> at(ab * max_na);
      for (int j = 0; j < max_na; ++j) {
        mk.quantize_q8(&xf[static_cast<size_t>(j * k)], at.data() + ab * j, k);
        if (t16)
          for (size_t b = 0; b < ab; b += sizeof(cpu::ActQ8))
            for (int i = 0; i < 32; ++i) at[ab * j + b + 8 + i] ^= 0x80;
      }
      for (int nrows : {8, 5, 1}) {
        const std::vector<uint8_t> wb = encode(t, randn(static_cast<size_t>(k * nrows), 92 + nrows), nrows, k);
        const size_t rb = wb.size() / static_cast<size_t>(nrows);
        const uint8_t* rows[cpu::kTileRows];
        for (int r = 0; r < nrows; ++r) rows[r] = wb.data() + rb * r;
        std::vector<uint8_t> tile(static_cast<size_t>(k / 32) * (t16 ? cpu::kTile16BlockBytes : cpu::kTileBlockBytes));
        (t16 ? mk.tile16_pack[id] : mk.tile_pack[id])(rows, nrows, k, tile.data());
        for (int na = 1; na <= max_na; ++na) {
          float got[cpu::kGemmMaxNa * cpu::kTileRows];
          mk.gemm8[id](rows, nrows, k, at.data(), ab, na, got);
          std::vector<float> g;
          std::vector<double> ref;
          for (int j = 0; j < na; ++j) {
            float one[cpu::kTileRows];
            (t16 ? mk.tile16_dot : mk.tile_dot)[0](k, tile.data(), at.data() + ab * j, ab, one);
            for (int r = 0; r < nrows; ++r) ref.push_back(one[r]), g.push_back(got[j * cpu::kTileRows + r]);
          }
          INFO(cpu::simd_level_name(l), " ", quant::find_traits(t)->name, " rows ", nrows, " na ", na);
          // The same integer sums; only the float rounding differs.
          CHECK(nmse(g, ref) < 1e-10);
        }
      }
    }
    if (l == SimdLevel::kAvx512) CHECK(types == 11);
  }
}

TEST_CASE("ops: mul_mat small batches, every row count 1..17, gemm8 on and off") {
  uint32_t seed = 400;
  for (int64_t limit : {cpu::kGemmDefaultMaxRows, int64_t{0}}) {
    cpu::set_gemm8_max_rows(limit);
    REQUIRE(cpu::gemm8_max_rows() == limit);
    for (DType t : {DType::Q4_0, DType::Q8_0, DType::Q4_K, DType::Q6_K, DType::Q5_K, DType::Q5_0, DType::Q4_1,
                    DType::Q3_K, DType::IQ4_XS})
      for (int64_t n = 1; n <= 17; ++n) {
        // Odd weight-row counts: whole 8-row tiles plus a partial one; 9 blocks of 32.
        const int64_t k = quant::find_traits(t)->block_size == 256 ? 512 : 288;
        check_mul_mat(t, k, n % 2 == 0 ? 21 : 37, n, 1, false, seed++);
      }
    // Past the small-batch range: the packed tiles (or the per-row dots up to 31 rows for Q6_K/Q3_K).
    for (DType t : {DType::Q4_0, DType::Q4_K, DType::Q6_K, DType::Q3_K}) {
      check_mul_mat(t, 256, 21, 24, 1, false, seed++);
      check_mul_mat(t, 256, 21, 33, 1, false, seed++);
    }
  }
  cpu::set_gemm8_max_rows(-1);
  CHECK(cpu::gemm8_max_rows() == cpu::kGemmDefaultMaxRows);
}

TEST_CASE("ops: mul_mat quantized weights, every type and level") {
  uint32_t seed = 100;
  for (DType t : kQuantTypes) {
    const bool k_quant = quant::find_traits(t)->block_size == 256;
    for (int64_t n : {1, 2, 4, 7, 19}) check_mul_mat(t, 512, 37, n, 1, false, seed++);
    check_mul_mat(t, k_quant ? 256 : 96, 5, 3, 1, false, seed++);
  }
}

TEST_CASE("ops: mul_mat float weights, odd sizes") {
  uint32_t seed = 200;
  for (DType t : kFloatTypes) {
    for (int64_t n : {1, 3, 4, 9}) check_mul_mat(t, 67, 13, n, 1, false, seed++);
    check_mul_mat(t, 512, 33, 5, 1, false, seed++);
  }
}

TEST_CASE("ops: mul_mat 3-D and strided activations") {
  uint32_t seed = 300;
  for (DType t : {DType::F32, DType::F16, DType::Q4_0, DType::Q4_K, DType::Q6_K}) {
    check_mul_mat(t, 256, 21, 3, 2, false, seed++);
    check_mul_mat(t, 256, 21, 3, 2, true, seed++);
    check_mul_mat(t, 256, 21, 5, 2, true, seed++);   // 10 rows: gemm8 (the per-row dots for Q6_K)
    check_mul_mat(t, 256, 21, 20, 2, true, seed++);  // 40 rows: the prefill tiles
  }
}

// ---------------------------------------------------------------------------------------------
// The other ops.

// Runs a single-output graph built by `build` on every config and compares with `ref`.
void check_op(const char* what, const std::vector<double>& ref, double bound,
              const std::function<std::vector<float>(Backend&)>& run) {
  for_each_config([&](const Config& c) {
    const std::vector<float> got = run(*c.backend);
    INFO(what, " on ", c.label);
    CHECK(nmse(got, ref) < bound);
  });
}

TEST_CASE("ops: add, mul, scale, swiglu with broadcast") {
  const int64_t ne0 = 37, rows = 6;
  const std::vector<float> a = randn(ne0 * rows, 1), b = randn(ne0 * rows, 2), b1 = randn(ne0, 3);
  std::vector<double> add(a.size()), mul(a.size()), addb(a.size()), scale(a.size()), sw(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    add[i] = static_cast<double>(a[i]) + b[i];
    mul[i] = static_cast<double>(a[i]) * b[i];
    addb[i] = static_cast<double>(a[i]) + b1[i % ne0];
    scale[i] = a[i] * 0.375;
    sw[i] = a[i] / (1.0 + std::exp(-static_cast<double>(a[i]))) * b[i];
  }
  auto binary = [&](int which, bool bcast) {
    return [&, which, bcast](Backend& be) {
      Graph g;
      Tensor* ta = g.input(DType::F32, {ne0, 3, 2}, "a");
      Tensor* tb = bcast ? g.input(DType::F32, {ne0}, "b") : g.input(DType::F32, {ne0, 3, 2}, "b");
      Tensor* y = which == 0 ? g.add(ta, tb) : which == 1 ? g.mul(ta, tb) : which == 2 ? g.swiglu(ta, tb) : g.scale(ta, 0.375f);
      if (which == 3) return run_graph(be, g, y, {{ta, bytes_of(a)}});  // tb is not in the graph
      return run_graph(be, g, y, {{ta, bytes_of(a)}, {tb, bytes_of(bcast ? b1 : b)}});
    };
  };
  check_op("add", add, 1e-12, binary(0, false));
  check_op("add broadcast", addb, 1e-12, binary(0, true));
  check_op("mul", mul, 1e-12, binary(1, false));
  check_op("swiglu", sw, 1e-10, binary(2, false));
  check_op("scale", scale, 1e-12, binary(3, false));
}

TEST_CASE("ops: rms_norm with and without weight") {
  for (int64_t ne0 : {67, 2048}) {
    const int64_t rows = 5;
    const std::vector<float> x = randn(static_cast<size_t>(ne0 * rows), 11, 2.f), w = randn(static_cast<size_t>(ne0), 12);
    for (bool with_w : {false, true}) {
      std::vector<double> ref(x.size());
      for (int64_t r = 0; r < rows; ++r) {
        double ss = 0;
        for (int64_t i = 0; i < ne0; ++i) ss += static_cast<double>(x[r * ne0 + i]) * x[r * ne0 + i];
        const double s = 1.0 / std::sqrt(ss / ne0 + 1e-5);
        for (int64_t i = 0; i < ne0; ++i) ref[r * ne0 + i] = x[r * ne0 + i] * s * (with_w ? w[i] : 1.f);
      }
      check_op(with_w ? "rms_norm*w" : "rms_norm", ref, 1e-11, [&](Backend& be) {
        Graph g;
        Tensor* tx = g.input(DType::F32, {ne0, rows}, "x");
        Tensor* tw = g.input(DType::F32, {ne0}, "w");
        Tensor* y = g.rms_norm(tx, with_w ? tw : nullptr, 1e-5f);
        std::vector<Input> in = {{tx, bytes_of(x)}};
        if (with_w) in.push_back({tw, bytes_of(w)});
        return run_graph(be, g, y, in);
      });
    }
  }
}

TEST_CASE("ops: rope norm and neox, full and partial, linear scaling") {
  const int64_t hd = 64, nh = 3, nt = 4;
  const std::vector<float> x = randn(static_cast<size_t>(hd * nh * nt), 21);
  const std::vector<int32_t> pos = {0, 5, 17, 300};
  for (RopeMode mode : {RopeMode::kNorm, RopeMode::kNeox}) {
    for (int n_rot : {64, 32}) {
      for (float factor : {1.f, 4.f}) {
        RopeParams p;
        p.mode = mode;
        p.n_rot = n_rot;
        p.freq_base = 10000.f;
        p.scaling = factor == 1.f ? RopeScaling::kNone : RopeScaling::kLinear;
        p.factor = factor;
        std::vector<double> ref(x.begin(), x.end());
        for (int64_t t = 0; t < nt; ++t)
          for (int64_t h = 0; h < nh; ++h)
            for (int i = 0; i < n_rot / 2; ++i) {
              const double theta = pos[t] * std::pow(10000.0, -2.0 * i / n_rot) / factor;
              const int64_t base = (t * nh + h) * hd;
              const int64_t i0 = base + (mode == RopeMode::kNorm ? 2 * i : i);
              const int64_t i1 = base + (mode == RopeMode::kNorm ? 2 * i + 1 : i + n_rot / 2);
              ref[i0] = x[i0] * std::cos(theta) - x[i1] * std::sin(theta);
              ref[i1] = x[i0] * std::sin(theta) + x[i1] * std::cos(theta);
            }
        check_op("rope", ref, 1e-9, [&](Backend& be) {
          Graph g;
          Tensor* tx = g.input(DType::F32, {hd, nh, nt}, "x");
          Tensor* tp = g.input(DType::I32, {nt}, "pos");
          Tensor* y = g.rope(tx, tp, p);
          return run_graph(be, g, y, {{tx, bytes_of(x)}, {tp, bytes_of_i32(pos)}});
        });
      }
    }
  }
}

TEST_CASE("ops: get_rows, copy and kv_write") {
  const int64_t ne0 = 256, rows = 9;
  const std::vector<float> table = randn(static_cast<size_t>(ne0 * rows), 31);
  const std::vector<int32_t> ids = {3, 0, 8, 3};
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::Q4_0, DType::Q8_0, DType::Q4_K, DType::Q6_K}) {
    const std::vector<uint8_t> tb = encode(t, table, rows, ne0);
    const std::vector<float> td = decode(t, tb, ne0 * rows);
    std::vector<double> ref;
    for (int32_t id : ids) ref.insert(ref.end(), td.begin() + id * ne0, td.begin() + (id + 1) * ne0);
    check_op("get_rows", ref, 1e-14, [&](Backend& be) {
      Graph g;
      Tensor* tt = g.input(t, {ne0, rows}, "table");
      Tensor* ti = g.input(DType::I32, {static_cast<int64_t>(ids.size())}, "ids");
      return run_graph(be, g, g.get_rows(tt, ti), {{tt, tb}, {ti, bytes_of_i32(ids)}});
    });
  }
  // copy F32 -> F16 / BF16 / Q8_0 and back to F32.
  for (DType t : {DType::F16, DType::BF16, DType::Q8_0}) {
    const std::vector<float> td = decode(t, encode(t, table, rows, ne0), ne0 * rows);
    check_op("copy", std::vector<double>(td.begin(), td.end()), 1e-14, [&](Backend& be) {
      Graph g;
      Tensor* tx = g.input(DType::F32, {ne0, rows}, "x");
      return run_graph(be, g, g.copy(g.copy(tx, t), DType::F32), {{tx, bytes_of(table)}});
    });
  }
  // kv_write into an F16 cache of 12 slots.
  const int64_t slots = 12;
  const std::vector<int32_t> where = {7, 2, 11};
  const std::vector<float> newrows(table.begin(), table.begin() + 3 * ne0);
  const std::vector<float> rd = decode(DType::F16, encode(DType::F16, newrows, 3, ne0), 3 * ne0);
  std::vector<double> ref(static_cast<size_t>(ne0 * slots), 0.0);
  for (size_t r = 0; r < where.size(); ++r)
    for (int64_t i = 0; i < ne0; ++i) ref[where[r] * ne0 + i] = rd[r * ne0 + i];
  check_op("kv_write", ref, 1e-14, [&](Backend& be) {
    Graph g;
    Tensor* cache = g.input(DType::F16, {ne0, slots}, "cache");
    Tensor* tr = g.input(DType::F32, {ne0, 3}, "rows");
    Tensor* ts = g.input(DType::I32, {3}, "slots");
    return run_graph(be, g, g.kv_write(cache, tr, ts),
                     {{cache, std::vector<uint8_t>(static_cast<size_t>(ne0 * slots * 2), 0)},
                      {tr, bytes_of(newrows)},
                      {ts, bytes_of_i32(where)}});
  });
}

// A continuous-batching step over a paged cache: several sequences with scattered,
// non-monotonic block tables (the first block shared by two of them, as the prefix cache
// leaves it), each contributing decode tokens or a prefill chunk at positions not starting at 0.
struct PagedBatch {
  int64_t hd, nh, nkv, bs, maxb, nslots;
  std::vector<int32_t> table, pos, seq, slots;  // table [maxb, n_seqs]; slots: where each token's K/V goes
  int64_t n_tok() const { return static_cast<int64_t>(pos.size()); }
  int64_t n_seqs() const { return static_cast<int64_t>(table.size()) / maxb; }
  int64_t slot(int64_t s, int64_t p) const { return int64_t{table[s * maxb + p / bs]} * bs + p % bs; }
};

// seqs[i] = {first position, tokens}: a prefill chunk (or one decode token) of sequence i.
PagedBatch make_batch(int64_t hd, int64_t nh, int64_t nkv, const std::vector<std::pair<int, int>>& seqs,
                      uint32_t seed) {
  PagedBatch b{hd, nh, nkv, 16, 0, 0, {}, {}, {}, {}};
  int64_t nblocks = 0;
  for (auto [p0, n] : seqs) {
    b.maxb = std::max<int64_t>(b.maxb, (p0 + n + b.bs - 1) / b.bs);
    nblocks += (p0 + n + b.bs - 1) / b.bs;
  }
  nblocks += 3;  // a few blocks nobody uses
  std::vector<int32_t> phys(static_cast<size_t>(nblocks));
  for (size_t i = 0; i < phys.size(); ++i) phys[i] = static_cast<int32_t>(i);
  std::shuffle(phys.begin(), phys.end(), std::mt19937(seed));
  b.table.assign(static_cast<size_t>(b.maxb * static_cast<int64_t>(seqs.size())), -1);
  size_t next = 0;
  for (size_t s = 0; s < seqs.size(); ++s) {
    const int64_t need = (seqs[s].first + seqs[s].second + b.bs - 1) / b.bs;
    for (int64_t k = 0; k < need; ++k) b.table[s * b.maxb + k] = phys[next++];
  }
  // Sequences 1 and 2 share their first block (a cached prefix; neither writes into it).
  if (seqs.size() >= 3 && seqs[1].first >= b.bs && seqs[2].first >= b.bs) b.table[2 * b.maxb] = b.table[b.maxb];
  b.nslots = nblocks * b.bs;
  for (size_t s = 0; s < seqs.size(); ++s)
    for (int i = 0; i < seqs[s].second; ++i) {
      b.pos.push_back(seqs[s].first + i);
      b.seq.push_back(static_cast<int32_t>(s));
      b.slots.push_back(static_cast<int32_t>(b.slot(static_cast<int64_t>(s), seqs[s].first + i)));
    }
  return b;
}

// Double-precision attention of q over the decoded caches kd/vd ([hd * nkv] per slot).
std::vector<double> attention_ref(const PagedBatch& b, const std::vector<float>& q, const std::vector<float>& kd,
                                  const std::vector<float>& vd, double scale) {
  const int64_t hd = b.hd, nh = b.nh, nkv = b.nkv;
  std::vector<double> ref(static_cast<size_t>(hd * nh * b.n_tok()));
  for (int64_t ti = 0; ti < b.n_tok(); ++ti)
    for (int64_t h = 0; h < nh; ++h) {
      const int64_t kvh = h / (nh / nkv);
      std::vector<double> s;
      for (int64_t j = 0; j <= b.pos[ti]; ++j) {
        const int64_t slot = b.slot(b.seq[ti], j);
        double d = 0;
        for (int64_t i = 0; i < hd; ++i)
          d += static_cast<double>(q[(ti * nh + h) * hd + i]) * kd[(slot * nkv + kvh) * hd + i];
        s.push_back(d * scale);
      }
      double mx = -INFINITY, sum = 0;
      for (double v : s) mx = std::max(mx, v);
      for (double& v : s) sum += (v = std::exp(v - mx));
      for (int64_t i = 0; i < hd; ++i) {
        double acc = 0;
        for (int64_t j = 0; j <= b.pos[ti]; ++j) acc += s[j] / sum * vd[(b.slot(b.seq[ti], j) * nkv + kvh) * hd + i];
        ref[(ti * nh + h) * hd + i] = acc;
      }
    }
  return ref;
}

TEST_CASE("ops: attention over a paged F16 and F32 cache with GQA") {
  const int64_t hd = 64, nh = 4, nkv = 2, bs = 4, nblocks = 8, nslots = bs * nblocks, maxb = 4;
  // Two sequences: seq 0 owns blocks {2, 0, 5, 7}, seq 1 owns {1, 3, 4, 6}.
  const std::vector<int32_t> table = {2, 0, 5, 7, 1, 3, 4, 6};  // [max_blocks=4, n_seqs=2]
  const std::vector<int32_t> pos = {13, 2, 15, 9}, seq = {0, 1, 0, 1};
  const int64_t nt = static_cast<int64_t>(pos.size());
  const std::vector<float> q = randn(static_cast<size_t>(hd * nh * nt), 41);
  const std::vector<float> kf = randn(static_cast<size_t>(hd * nkv * nslots), 42);
  const std::vector<float> vf = randn(static_cast<size_t>(hd * nkv * nslots), 43);
  const float scale = 1.f / 8.f;
  for (DType t : {DType::F16, DType::F32}) {
    const std::vector<uint8_t> kb = encode(t, kf, nslots, hd * nkv), vb = encode(t, vf, nslots, hd * nkv);
    const std::vector<float> kd = decode(t, kb, hd * nkv * nslots), vd = decode(t, vb, hd * nkv * nslots);
    const PagedBatch b{hd, nh, nkv, bs, maxb, nslots, table, pos, seq, {}};
    const std::vector<double> ref = attention_ref(b, q, kd, vd, scale);
    check_op("attention", ref, 1e-10, [&](Backend& be) {
      Graph g;
      Tensor* tq = g.input(DType::F32, {hd, nh, nt}, "q");
      Tensor* tk = g.input(t, {hd * nkv, nslots}, "k");
      Tensor* tv = g.input(t, {hd * nkv, nslots}, "v");
      Tensor* tp = g.input(DType::I32, {nt}, "pos");
      Tensor* ts = g.input(DType::I32, {nt}, "seq");
      Tensor* tt = g.input(DType::I32, {maxb, 2}, "table");
      AttentionParams ap;
      ap.n_kv_head = static_cast<int32_t>(nkv);
      ap.block_size = static_cast<int32_t>(bs);
      ap.scale = scale;
      return run_graph(be, g, g.attention(tq, tk, tv, tp, ts, tt, ap),
                       {{tq, bytes_of(q)}, {tk, kb}, {tv, vb}, {tp, bytes_of_i32(pos)}, {ts, bytes_of_i32(seq)},
                        {tt, bytes_of_i32(table)}});
    });
  }
}


// kv_write of the batch's new K/V rows into caches of types kt/vt, then attention over them.
std::vector<float> run_paged_attention(Backend& be, const PagedBatch& b, DType kt, DType vt, const std::vector<float>& q,
                                       const std::vector<uint8_t>& kb, const std::vector<uint8_t>& vb,
                                       const std::vector<float>& knew, const std::vector<float>& vnew, float scale) {
  const int64_t row = b.hd * b.nkv, nt = b.n_tok();
  Graph g;
  Tensor* tq = g.input(DType::F32, {b.hd, b.nh, nt}, "q");
  Tensor* tk = g.input(kt, {row, b.nslots}, "k");
  Tensor* tv = g.input(vt, {row, b.nslots}, "v");
  Tensor* tkn = g.input(DType::F32, {row, nt}, "k_new");
  Tensor* tvn = g.input(DType::F32, {row, nt}, "v_new");
  Tensor* tsl = g.input(DType::I32, {nt}, "slots");
  Tensor* tp = g.input(DType::I32, {nt}, "pos");
  Tensor* ts = g.input(DType::I32, {nt}, "seq");
  Tensor* tt = g.input(DType::I32, {b.maxb, b.n_seqs()}, "table");
  AttentionParams ap;
  ap.n_kv_head = static_cast<int32_t>(b.nkv);
  ap.block_size = static_cast<int32_t>(b.bs);
  ap.scale = scale;
  Tensor* kw = g.kv_write(tk, tkn, tsl);
  Tensor* vw = g.kv_write(tv, tvn, tsl);
  return run_graph(be, g, g.attention(tq, kw, vw, tp, ts, tt, ap),
                   {{tq, bytes_of(q)}, {tk, kb}, {tv, vb}, {tkn, bytes_of(knew)}, {tvn, bytes_of(vnew)},
                    {tsl, bytes_of_i32(b.slots)}, {tp, bytes_of_i32(b.pos)}, {ts, bytes_of_i32(b.seq)},
                    {tt, bytes_of_i32(b.table)}});
}

// Runs the batch with caches of kt/vt through every config and checks it against the double
// reference on the decoded caches (with the new rows as the reference quantizer stores them).
// Returns the worst NMSE seen.
double check_paged_attention(const PagedBatch& b, DType kt, DType vt, uint32_t seed) {
  const int64_t row = b.hd * b.nkv, nt = b.n_tok();
  const float scale = 1.f / std::sqrt(static_cast<float>(b.hd));
  const std::vector<float> q = randn(static_cast<size_t>(b.hd * b.nh * nt), seed);
  const std::vector<float> kf = randn(static_cast<size_t>(row * b.nslots), seed + 1);
  const std::vector<float> vf = randn(static_cast<size_t>(row * b.nslots), seed + 2);
  const std::vector<float> knew = randn(static_cast<size_t>(row * nt), seed + 3);
  const std::vector<float> vnew = randn(static_cast<size_t>(row * nt), seed + 4);
  const std::vector<uint8_t> kb = encode(kt, kf, b.nslots, row), vb = encode(vt, vf, b.nslots, row);
  std::vector<float> kd = decode(kt, kb, row * b.nslots), vd = decode(vt, vb, row * b.nslots);
  const std::vector<float> knd = decode(kt, encode(kt, knew, nt, row), row * nt);
  const std::vector<float> vnd = decode(vt, encode(vt, vnew, nt, row), row * nt);
  for (int64_t t = 0; t < nt; ++t) {
    std::copy_n(knd.begin() + t * row, row, kd.begin() + b.slots[t] * row);
    std::copy_n(vnd.begin() + t * row, row, vd.begin() + b.slots[t] * row);
  }
  const std::vector<double> ref = attention_ref(b, q, kd, vd, scale);
  // Every path computes in f32 from the decoded cache values (Q8_0 rows are dequantized, the
  // queries are not quantized), so all of them are close to exact.
  double worst = 0;
  for_each_config([&](const Config& c) {
    const std::vector<float> got = run_paged_attention(*c.backend, b, kt, vt, q, kb, vb, knew, vnew, scale);
    const double e = nmse(got, ref);
    INFO("attention on ", c.label, " k ", quant::find_traits(kt)->name, " v ", quant::find_traits(vt)->name,
         " hd=", b.hd, " nh=", b.nh, " nkv=", b.nkv, " n_tok=", nt);
    CHECK(e < 1e-10);
    worst = std::max(worst, e);
  });
  return worst;
}

TEST_CASE("ops: kv_write into a Q8_0 cache") {
  const int64_t row = 96 * 3, slots = 21;  // three KV heads of 96 (3 blocks each)
  const std::vector<int32_t> where = {17, 3, 20, 8, 0};
  const int64_t n = static_cast<int64_t>(where.size());
  const std::vector<float> rows = randn(static_cast<size_t>(row * n), 61, 3.f);
  const std::vector<float> old = randn(static_cast<size_t>(row * slots), 62);
  const std::vector<uint8_t> cache0 = encode(DType::Q8_0, old, slots, row);
  std::vector<float> expect = decode(DType::Q8_0, cache0, row * slots);
  const std::vector<float> rd = decode(DType::Q8_0, encode(DType::Q8_0, rows, n, row), row * n);
  for (int64_t r = 0; r < n; ++r) std::copy_n(rd.begin() + r * row, row, expect.begin() + where[r] * row);
  for_each_config([&](const Config& c) {
    Graph g;
    Tensor* cache = g.input(DType::Q8_0, {row, slots}, "cache");
    Tensor* tr = g.input(DType::F32, {row, n}, "rows");
    Tensor* ts = g.input(DType::I32, {n}, "slots");
    Tensor* out = g.kv_write(cache, tr, ts);
    REQUIRE(c.backend->supports(*out));
    const std::vector<float> got =
        run_graph(*c.backend, g, out, {{cache, cache0}, {tr, bytes_of(rows)}, {ts, bytes_of_i32(where)}});
    INFO("kv_write on ", c.label);
    // The reference quantizer's bytes exactly: untouched slots keep theirs, written ones match.
    CHECK(got == expect);
  });
  // A row that is not whole Q8_0 blocks is refused rather than miswritten.
  auto be = create_backend("cpu", BackendOptions{});
  REQUIRE(be.ok());
  Graph g;
  Tensor* bad = g.kv_write(g.input(DType::Q8_0, {40, 4}, "cache"), g.input(DType::F32, {40, 1}, "rows"),
                           g.input(DType::I32, {1}, "slots"));
  CHECK_FALSE((*be)->supports(*bad));
}

TEST_CASE("ops: attention over a Q8_0 cache, mixed decode and prefill rows, scattered blocks") {
  // Decode tokens of long sequences (several kChunk-sized chunks), a prefill chunk at positions
  // 20..24, decode tokens sharing a prefix block; GQA groups of 4 and 6.
  const std::vector<std::pair<int, int>> seqs = {{700, 1}, {20, 5}, {40, 1}, {1100, 1}, {3, 2}};
  const PagedBatch llama = make_batch(64, 8, 2, seqs, 71);
  const PagedBatch odd = make_batch(96, 12, 2, seqs, 72);
  check_paged_attention(llama, DType::Q8_0, DType::Q8_0, 80);
  check_paged_attention(odd, DType::Q8_0, DType::Q8_0, 81);
  check_paged_attention(odd, DType::F16, DType::Q8_0, 82);
  check_paged_attention(llama, DType::Q8_0, DType::F16, 83);
  check_paged_attention(odd, DType::BF16, DType::BF16, 84);
  check_paged_attention(llama, DType::F32, DType::F16, 85);
  check_paged_attention(llama, DType::F16, DType::F16, 86);
}

TEST_CASE("ops: attention of one long sequence spread over threads, batch-independent results") {
  // One KV head and group 12 (more than the 8 heads scored together): a single decode token's
  // chunks are spread over the threads; its result must equal, bit for bit, the one it gets
  // inside a larger batch (where it is not spread), for every cache type.
  const PagedBatch alone = make_batch(64, 12, 1, {{1300, 1}}, 91);
  for (DType t : {DType::F16, DType::Q8_0, DType::F32}) {
    check_paged_attention(alone, t, t, 92);
    PagedBatch mixed = make_batch(64, 12, 1, {{1300, 1}, {600, 40}, {9, 1}}, 93);
    mixed.table.assign(mixed.table.size(), 0);
    // Same blocks for sequence 0 as `alone`; the others get blocks beyond them.
    const int64_t nb0 = alone.maxb;
    for (int64_t k = 0; k < nb0; ++k) mixed.table[k] = alone.table[k];
    int32_t next = static_cast<int32_t>(alone.nslots / alone.bs);
    for (int64_t s = 1; s < mixed.n_seqs(); ++s)
      for (int64_t k = 0; k < mixed.maxb; ++k) mixed.table[s * mixed.maxb + k] = next++;
    mixed.nslots = int64_t{next} * mixed.bs;
    for (int64_t i = 0; i < mixed.n_tok(); ++i) mixed.slots[i] = static_cast<int32_t>(mixed.slot(mixed.seq[i], mixed.pos[i]));
    const int64_t row = 64;
    const std::vector<float> q1 = randn(64 * 12, 94), kf = randn(static_cast<size_t>(row * mixed.nslots), 95),
                             vf = randn(static_cast<size_t>(row * mixed.nslots), 96);
    std::vector<float> qm = randn(static_cast<size_t>(64 * 12 * mixed.n_tok()), 97);
    std::copy(q1.begin(), q1.end(), qm.begin());
    const std::vector<float> kn = randn(static_cast<size_t>(row * mixed.n_tok()), 98),
                             vn = randn(static_cast<size_t>(row * mixed.n_tok()), 99);
    const std::vector<uint8_t> kb = encode(t, kf, mixed.nslots, row), vb = encode(t, vf, mixed.nslots, row);
    const size_t rb = quant::row_size(t, row).value();
    const std::vector<uint8_t> kb1(kb.begin(), kb.begin() + static_cast<std::ptrdiff_t>(rb * alone.nslots));
    const std::vector<uint8_t> vb1(vb.begin(), vb.begin() + static_cast<std::ptrdiff_t>(rb * alone.nslots));
    for_each_config([&](const Config& c) {
      const std::vector<float> one = run_paged_attention(*c.backend, alone, t, t, q1, kb1, vb1,
                                                         std::vector<float>(kn.begin(), kn.begin() + row),
                                                         std::vector<float>(vn.begin(), vn.begin() + row), 0.125f);
      const std::vector<float> many = run_paged_attention(*c.backend, mixed, t, t, qm, kb, vb, kn, vn, 0.125f);
      INFO("attention on ", c.label, " ", quant::find_traits(t)->name);
      CHECK(std::memcmp(one.data(), many.data(), one.size() * sizeof(float)) == 0);
    });
  }
}

TEST_CASE("ops: decode gemv kernels (kQ8G activations) match the per-row dots") {
  int checked = 0;
  for (SimdLevel l : cpu::supported_simd_levels()) {
    if (l == SimdLevel::kScalar) continue;
    REQUIRE(cpu::matmul_kernels_for(l) != nullptr);
    const cpu::MatmulKernels& mk = *cpu::matmul_kernels_for(l);
    // 3, 7, 9, 16, 21 and 64 blocks: whole 16-block chunks, partial chunks with and without
    // whole 4-block groups.
    for (int64_t k : {96, 224, 288, 512, 672, 2048}) {
      const std::vector<float> x = randn(static_cast<size_t>(k), 500 + static_cast<uint32_t>(k), 2.f);
      const size_t ab = cpu::act_row_bytes(cpu::ActFormat::kQ8, k);
      REQUIRE(cpu::act_row_bytes(cpu::ActFormat::kQ8G, k) == ab);
      std::vector<uint8_t> a8(ab), ag(ab);
      mk.quantize_q8(x.data(), a8.data(), k);
      if (mk.quantize_q8g == nullptr) continue;
      mk.quantize_q8g(x.data(), ag.data(), k);
      // kQ8G is ActQ8's content regrouped: check every code, scale and sum where matmul.h puts it.
      const auto* blk = reinterpret_cast<const cpu::ActQ8*>(a8.data());
      for (int64_t c0 = 0; c0 < k / 32; c0 += 16) {
        const int r = static_cast<int>(std::min<int64_t>(16, k / 32 - c0));
        const uint8_t* chunk = ag.data() + 40 * c0;
        float d[16], s[16];
        std::memcpy(d, chunk + 32 * r, sizeof(float) * static_cast<size_t>(r));
        std::memcpy(s, chunk + 32 * r + 4 * r, sizeof(float) * static_cast<size_t>(r));
        for (int b = 0; b < r; ++b) {
          const cpu::ActQ8& ref = blk[c0 + b];
          INFO("k=", k, " block ", c0 + b);
          CHECK(d[b] == ref.d);
          CHECK(s[b] == ref.s);
          for (int e = 0; e < 32; ++e) {
            const size_t at = b < r / 4 * 4 ? static_cast<size_t>(128 * (b / 4) + 16 * (b % 4) + 64 * (e / 16) + e % 16)
                                            : static_cast<size_t>(32 * b + e);
            CHECK(static_cast<int8_t>(chunk[at]) == ref.qs[e]);
          }
        }
      }
      for (DType t : kQuantTypes) {
        const auto id = static_cast<size_t>(t);
        if (mk.gemv[id] == nullptr) continue;
        const int64_t rows = 5;
        const std::vector<uint8_t> wb = encode(t, randn(static_cast<size_t>(k * rows), 600 + static_cast<uint32_t>(k)), rows, k);
        const size_t rb = wb.size() / rows;
        std::vector<float> got;
        std::vector<double> ref;
        for (int64_t i = 0; i < rows; ++i) {
          float a = 0.f, b = 0.f;
          mk.gemv[id](k, wb.data() + rb * static_cast<size_t>(i), ag.data(), ab, &a);
          mk.dot[id][0](k, wb.data() + rb * static_cast<size_t>(i), a8.data(), ab, &b);
          got.push_back(a), ref.push_back(b);
        }
        INFO(cpu::simd_level_name(l), " ", quant::find_traits(t)->name, " k=", k);
        // The same integer sums; only the float rounding differs.
        CHECK(nmse(got, ref) < 1e-10);
        ++checked;
      }
    }
    // Through mul_mat at one activation row (the decode path), odd block counts.
    for (int64_t k : {224, 288, 672}) check_mul_mat(DType::Q4_0, k, 37, 1, 1, false, 700 + static_cast<uint32_t>(k));
  }
  if (cpu::best_simd_level() == SimdLevel::kAvx512) CHECK(checked >= 6);
}

TEST_CASE("ops: wide 16-row prefill tiles match the 8-row tiles") {
  const int max_na = cpu::kGemmMaxNa;
  int types = 0;
  for (SimdLevel l : cpu::supported_simd_levels()) {
    if (l == SimdLevel::kScalar) continue;
    REQUIRE(cpu::matmul_kernels_for(l) != nullptr);
    const cpu::MatmulKernels& mk = *cpu::matmul_kernels_for(l);
    for (DType t : kQuantTypes) {
      const auto id = static_cast<size_t>(t);
      if (mk.wtile_pack[id] == nullptr) continue;
      const int64_t k = quant::find_traits(t)->block_size == 256 ? 512 : 288;  // 9 blocks of 32
      const std::vector<float> xf = randn(static_cast<size_t>(k * max_na), 801);
      const size_t ab = cpu::act_row_bytes(cpu::ActFormat::kQ8, k);
      std::vector<uint8_t> at(ab * max_na);
      for (int j = 0; j < max_na; ++j) mk.quantize_q8(&xf[static_cast<size_t>(j * k)], at.data() + ab * j, k);
      REQUIRE((mk.tile_pack[id] != nullptr));
      ++types;
      for (int nrows : {16, 11, 3}) {
        const std::vector<uint8_t> wb = encode(t, randn(static_cast<size_t>(k * nrows), 802 + nrows), nrows, k);
        const size_t rb = wb.size() / static_cast<size_t>(nrows);
        const uint8_t* rows[cpu::kWideTileRows];
        for (int r = 0; r < nrows; ++r) rows[r] = wb.data() + rb * static_cast<size_t>(r);
        std::vector<uint8_t> wide(static_cast<size_t>(k / 32) * cpu::kWideTileBlockBytes);
        mk.wtile_pack[id](rows, nrows, k, wide.data());
        // The reference: two 8-row tiles (the second may be partial or empty).
        std::vector<float> ref8(static_cast<size_t>(max_na * cpu::kWideTileRows), 0.f);
        for (int h = 0; h * cpu::kTileRows < nrows; ++h) {
          std::vector<uint8_t> tile(static_cast<size_t>(k / 32) * cpu::kTileBlockBytes);
          mk.tile_pack[id](rows + h * cpu::kTileRows, std::min(cpu::kTileRows, nrows - h * cpu::kTileRows), k, tile.data());
          for (int j = 0; j < max_na; ++j) {
            float one[cpu::kTileRows];
            mk.tile_dot[0](k, tile.data(), at.data() + ab * static_cast<size_t>(j), ab, one);
            for (int r = 0; r < cpu::kTileRows; ++r)
              ref8[static_cast<size_t>(j * cpu::kWideTileRows + h * cpu::kTileRows + r)] = one[r];
          }
        }
        for (int na = 1; na <= max_na; ++na) {
          REQUIRE((mk.wtile_dot[na - 1] != nullptr));
          float got[cpu::kGemmMaxNa * cpu::kWideTileRows];
          mk.wtile_dot[na - 1](k, wide.data(), at.data(), ab, got);
          std::vector<float> g;
          std::vector<double> ref;
          for (int j = 0; j < na; ++j)
            for (int r = 0; r < nrows; ++r) {
              g.push_back(got[j * cpu::kWideTileRows + r]);
              ref.push_back(ref8[static_cast<size_t>(j * cpu::kWideTileRows + r)]);
            }
          INFO(cpu::simd_level_name(l), " ", quant::find_traits(t)->name, " rows ", nrows, " na ", na);
          CHECK(nmse(g, ref) < 1e-10);  // the same integer sums and float steps per row
        }
      }
    }
  }
  if (cpu::best_simd_level() == SimdLevel::kAvx512) CHECK(types == 9);
  // Through mul_mat: past the small-batch range, a whole and a partial 16-row tile, n % 8 != 0.
  uint32_t seed = 820;
  for (DType t : {DType::Q4_0, DType::Q8_0, DType::Q4_K, DType::IQ4_XS, DType::Q5_1})
    check_mul_mat(t, quant::find_traits(t)->block_size == 256 ? 512 : 288, 37, 43, 1, false, seed++);
}

TEST_CASE("ops: rope with frequency factors (llama.cpp's rope_freqs), which replace the llama3 formula") {
  const int64_t hd = 64, nh = 2, nt = 3;
  const std::vector<float> x = randn(static_cast<size_t>(hd * nh * nt), 31);
  const std::vector<int32_t> pos = {0, 7, 4000};
  std::vector<float> ff(static_cast<size_t>(hd / 2));
  for (size_t i = 0; i < ff.size(); ++i) ff[i] = 1.f + 7.f * static_cast<float>(i) / static_cast<float>(ff.size());
  for (RopeScaling scaling : {RopeScaling::kNone, RopeScaling::kLlama3}) {
    RopeParams p;
    p.mode = RopeMode::kNorm;
    p.n_rot = static_cast<int32_t>(hd);
    p.freq_base = 500000.f;
    p.scaling = scaling;  // kLlama3 with factors: the factors alone apply
    p.factor = 32.f;
    p.original_ctx = 8192;
    std::vector<double> ref(x.begin(), x.end());
    for (int64_t t = 0; t < nt; ++t)
      for (int64_t h = 0; h < nh; ++h)
        for (int i = 0; i < hd / 2; ++i) {
          const double theta = pos[t] * std::pow(500000.0, -2.0 * i / hd) / ff[static_cast<size_t>(i)];
          const int64_t i0 = (t * nh + h) * hd + 2 * i, i1 = i0 + 1;
          ref[i0] = x[i0] * std::cos(theta) - x[i1] * std::sin(theta);
          ref[i1] = x[i0] * std::sin(theta) + x[i1] * std::cos(theta);
        }
    check_op("rope+factors", ref, 1e-9, [&](Backend& be) {
      Graph g;
      Tensor* tx = g.input(DType::F32, {hd, nh, nt}, "x");
      Tensor* tp = g.input(DType::I32, {nt}, "pos");
      Tensor* tf = g.input(DType::F32, {hd / 2}, "freq_factors");
      Tensor* y = g.rope(tx, tp, p, tf);
      return run_graph(be, g, y, {{tx, bytes_of(x)}, {tp, bytes_of_i32(pos)}, {tf, bytes_of(ff)}});
    });
  }
}

}  // namespace
}  // namespace kite

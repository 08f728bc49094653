// Op conformance: every op and variant, run through each registered backend (and, for the CPU,
// through every SIMD level this machine supports, forced in turn), compared with naive
// double-precision references written here by normalized mean squared error on random data
// (fixed seeds).
#include <array>

#include "tests/ops_test_util.h"

namespace kite {
namespace {

using namespace ops_test;

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
      // 32-element tiles, or 16-element-scale ones with mins (Q2_K) or without (ActQ8U activations).
      const cpu::TileKernels tk = cpu::tile_kernels(&mk, t);
      if (tk.kind == cpu::TileKernels::kNone) continue;
      ++tiled_types;
      for (int nrows : {8, 5}) {
        const std::vector<uint8_t> wb = encode(t, randn(static_cast<size_t>(k * nrows), 78 + nrows), nrows, k);
        const size_t rb = wb.size() / static_cast<size_t>(nrows);
        // Activations for the tile (ActQ8, or ActQ8U with codes + 128) and for the row kernel.
        const size_t ab = cpu::act_row_bytes(cpu::ActFormat::kQ8, k);
        const std::vector<uint8_t> at = tile_acts(mk, xf, k, na, tk.q8u());
        const cpu::ActFormat rf = cpu::act_format(t);
        const size_t rab = cpu::act_row_bytes(rf, k);
        std::vector<uint8_t> ar(rab * na);
        for (int j = 0; j < na; ++j)
          (rf == cpu::ActFormat::kQ8 ? mk.quantize_q8 : mk.quantize_q8k)(&xf[static_cast<size_t>(j * k)], ar.data() + rab * j, k);
        std::vector<uint8_t> tile(static_cast<size_t>(k / 32) * tk.block_bytes);
        const uint8_t* rows[cpu::kTileRows];
        for (int r = 0; r < nrows; ++r) rows[r] = wb.data() + rb * r;
        tk.pack(rows, nrows, k, tile.data());
        float got[cpu::kMaxNa * cpu::kTileRows];
        tk.dot[na - 1](k, tile.data(), at.data(), ab, got);
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
    // The x86 levels tile Q2_K (with its mins); the VNNI levels also Q8_0, IQ4_NL and IQ4_XS.
    if (l == SimdLevel::kAvx512 || l == SimdLevel::kAvxVnni) CHECK(tiled_types == 12);
    if (l == SimdLevel::kAvx2) CHECK(tiled_types == 9);
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
      const cpu::TileKernels tk = cpu::tile_kernels(&mk, t);
      REQUIRE(tk.kind != cpu::TileKernels::kNone);
      // ActQ8 activations (codes + 128 for the 16-element-scale types), as both paths take them.
      const size_t ab = cpu::act_row_bytes(cpu::ActFormat::kQ8, k);
      const std::vector<uint8_t> at = tile_acts(mk, xf, k, max_na, tk.q8u());
      for (int nrows : {8, 5, 1}) {
        const std::vector<uint8_t> wb = encode(t, randn(static_cast<size_t>(k * nrows), 92 + nrows), nrows, k);
        const size_t rb = wb.size() / static_cast<size_t>(nrows);
        const uint8_t* rows[cpu::kTileRows];
        for (int r = 0; r < nrows; ++r) rows[r] = wb.data() + rb * r;
        std::vector<uint8_t> tile(static_cast<size_t>(k / 32) * tk.block_bytes);
        tk.pack(rows, nrows, k, tile.data());
        for (int na = 1; na <= max_na; ++na) {
          float got[cpu::kGemmMaxNa * cpu::kTileRows];
          mk.gemm8[id](rows, nrows, k, at.data(), ab, na, got);
          std::vector<float> g;
          std::vector<double> ref;
          for (int j = 0; j < na; ++j) {
            float one[cpu::kTileRows];
            tk.dot[0](k, tile.data(), at.data() + ab * j, ab, one);
            for (int r = 0; r < nrows; ++r) ref.push_back(one[r]), g.push_back(got[j * cpu::kTileRows + r]);
          }
          INFO(cpu::simd_level_name(l), " ", quant::find_traits(t)->name, " rows ", nrows, " na ", na);
          // The same integer sums; only the float rounding differs.
          CHECK(nmse(g, ref) < 1e-10);
        }
      }
    }
    if (l == SimdLevel::kAvx512 || l == SimdLevel::kAvxVnni) CHECK(types == 11);
  }
}

TEST_CASE("ops: mul_mat small batches, every row count 1..17, gemm8 on and off") {
  uint32_t seed = 400;
  cpu::set_wgemm_rows(0, 0);  // gemm8, the per-row dots and the tiles (wgemm: the test below)
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
  cpu::set_wgemm_rows(-1, -1);
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

TEST_CASE("ops: float-weight GEMM gives every dot the same bits at any row count and tile position") {
  // fgemm (f32 activations) and bgemm (BF16 weights on bf16 activations, AVX512-BF16): a token's
  // logits must not depend on how many rows a step holds (decode, batches, prefill). k values
  // end mid-cache-line and mid-vector (the decode tiles' line steps, the vector steps, the
  // scalar tail); 37 weight rows end every tile shape partially (8, 6, 4 and 3 rows).
  const int64_t m = 37;
  int kernels = 0;
  for (SimdLevel l : cpu::supported_simd_levels()) {
    const cpu::MatmulKernels* mk = cpu::matmul_kernels_for(l);
    if (mk == nullptr) continue;
    struct Case {
      DType t;
      cpu::MatmulKernels::FloatGemmFn fn;
      bool bf16_act;
    };
    std::vector<Case> cases;
    for (DType t : kFloatTypes)
      if (mk->fgemm[static_cast<size_t>(t)] != nullptr) cases.push_back({t, mk->fgemm[static_cast<size_t>(t)], false});
    if (mk->bgemm != nullptr) {
      REQUIRE(static_cast<bool>(mk->quantize_bf16));
      cases.push_back({DType::BF16, mk->bgemm, true});
    }
    for (const Case& cs : cases) {
      ++kernels;
      for (int64_t k : {7, 67, 100, 289}) {
        INFO(cpu::simd_level_name(l), " ", quant::find_traits(cs.t)->name, cs.bf16_act ? " bgemm" : " fgemm", " k=", k);
        const int na = 13;
        const std::vector<uint8_t> wb = encode(cs.t, randn(static_cast<size_t>(k * m), 1300 + k), m, k);
        const size_t rb = wb.size() / static_cast<size_t>(m);
        const std::vector<float> wf = decode(cs.t, wb, k * m);
        std::vector<float> xf = randn(static_cast<size_t>(k * na), 1400 + k);
        std::vector<uint8_t> act;
        size_t as;
        if (cs.bf16_act) {
          as = cpu::act_row_bytes(cpu::ActFormat::kBF16, k);
          act.resize(as * na);
          for (int j = 0; j < na; ++j) mk->quantize_bf16(xf.data() + j * k, act.data() + as * static_cast<size_t>(j), k);
          // The reference multiplies what the kernel multiplies: the rounded activations.
          xf = decode(DType::BF16, act, k * na);
        } else {
          as = static_cast<size_t>(k) * sizeof(float);
          act.resize(as * na);
          std::memcpy(act.data(), xf.data(), act.size());
        }
        std::vector<float> all(static_cast<size_t>(na * m), -1.f);
        cs.fn(wb.data(), rb, static_cast<int>(m), k, act.data(), as, na, all.data(), m);
        std::vector<double> ref(all.size());
        for (int j = 0; j < na; ++j)
          for (int64_t r = 0; r < m; ++r) {
            double d = 0;
            for (int64_t i = 0; i < k; ++i) d += static_cast<double>(wf[r * k + i]) * xf[j * k + i];
            ref[static_cast<size_t>(j * m + r)] = d;
          }
        CHECK(nmse(all, ref) < 1e-10);
        // Each activation row alone, pairs, and each weight row alone at offsets that move it
        // to every position of a tile: the same bits as in the whole product.
        for (int na2 : {1, 2, 5}) {
          for (int j0 = 0; j0 + na2 <= na; j0 += na2) {
            std::vector<float> part(static_cast<size_t>(na2 * m), -1.f);
            cs.fn(wb.data(), rb, static_cast<int>(m), k, act.data() + as * static_cast<size_t>(j0), as, na2, part.data(),
                  m);
            CHECK(std::memcmp(part.data(), all.data() + static_cast<size_t>(j0 * m), part.size() * sizeof(float)) == 0);
          }
        }
        for (int64_t r0 : {1, 5, 30}) {
          const int nr = static_cast<int>(m - r0);
          std::vector<float> part(static_cast<size_t>(na * nr), -1.f);
          cs.fn(wb.data() + rb * static_cast<size_t>(r0), rb, nr, k, act.data(), as, na, part.data(), nr);
          for (int j = 0; j < na; ++j)
            CHECK(std::memcmp(part.data() + static_cast<size_t>(j * nr), all.data() + static_cast<size_t>(j * m + r0),
                              static_cast<size_t>(nr) * sizeof(float)) == 0);
        }
      }
    }
  }
#if defined(__x86_64__)
  CHECK(kernels >= 3);  // (every x86 level has fgemm for F32, F16 and BF16)
  if (cpu::cpu_features().avx512bf16 && cpu::best_simd_level() == SimdLevel::kAvx512)
    CHECK(static_cast<bool>(cpu::matmul_kernels_for(SimdLevel::kAvx512)->bgemm));
#endif
}

TEST_CASE("ops: mul_mat tall weights and long rows (more than one workgroup's rows)") {
  uint32_t seed = 600;
  for (DType t : kQuantTypes)
    for (int64_t n : {1, 9}) check_mul_mat(t, 512, 300, n, 1, false, seed++);
  for (DType t : kFloatTypes) check_mul_mat(t, 520, 300, 9, 1, false, seed++);
  check_mul_mat(DType::Q4_K, 4096, 513, 1, 1, false, seed++);
  check_mul_mat(DType::Q8_0, 4096, 513, 3, 1, false, seed++);
}

TEST_CASE("ops: mul_mat 3-D and strided activations") {
  uint32_t seed = 300;
  for (DType t : {DType::F32, DType::F16, DType::Q4_0, DType::Q4_K, DType::Q6_K}) {
    check_mul_mat(t, 256, 21, 3, 2, false, seed++);
    check_mul_mat(t, 256, 21, 3, 2, true, seed++);
    check_mul_mat(t, 256, 21, 5, 2, true, seed++);   // 10 rows: wgemm
    check_mul_mat(t, 256, 21, 20, 2, true, seed++);  // 40 rows: wgemm too (tiles past 64 rows)
  }
}

// ---------------------------------------------------------------------------------------------
// The other ops.

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
  std::vector<DType> types(std::begin(kFloatTypes), std::end(kFloatTypes));
  types.insert(types.end(), std::begin(kQuantTypes), std::end(kQuantTypes));
  for (DType t : types) {
    const std::vector<uint8_t> tb = encode(t, table, rows, ne0);
    const std::vector<float> td = decode(t, tb, ne0 * rows);
    std::vector<double> ref;
    for (int32_t id : ids) ref.insert(ref.end(), td.begin() + id * ne0, td.begin() + (id + 1) * ne0);
    INFO("table type ", quant::find_traits(t)->name);
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

TEST_CASE("ops: decode gemv kernels (kQ8G activations) match the per-row dots") {
  int checked = 0, x86_levels = 0;
  for (SimdLevel l : cpu::supported_simd_levels()) {
    if (l == SimdLevel::kScalar) continue;
    REQUIRE(cpu::matmul_kernels_for(l) != nullptr);
    const cpu::MatmulKernels& mk = *cpu::matmul_kernels_for(l);
    if (l == SimdLevel::kAvx2 || l == SimdLevel::kAvxVnni || l == SimdLevel::kAvx512) {
      ++x86_levels;
      CHECK((mk.gemv[static_cast<size_t>(DType::Q4_0)] != nullptr));  // every x86 level has Q4_0's
    }
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
    for (DType t : {DType::Q4_0, DType::Q8_0})
      for (int64_t k : {224, 288, 672}) check_mul_mat(t, k, 37, 1, 1, false, 700 + static_cast<uint32_t>(k));
  }
  CHECK(checked >= 6 * x86_levels);  // Q4_0 at 6 sizes on each
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
  // Through mul_mat: past the small-batch range, a whole and a partial 16-row tile, n % 8 != 0
  // (wgemm off: it would take these rows).
  uint32_t seed = 820;
  cpu::set_wgemm_rows(0, 0);
  for (DType t : {DType::Q4_0, DType::Q8_0, DType::Q4_K, DType::IQ4_XS, DType::Q5_1})
    check_mul_mat(t, quant::find_traits(t)->block_size == 256 ? 512 : 288, 37, 43, 1, false, seed++);
  cpu::set_wgemm_rows(-1, -1);
}

TEST_CASE("ops: wgemm batched-decode kernels match the packed tiles on the same activations") {
  const int max_na = cpu::kWideGemmMaxNa;
  int types = 0;
  for (SimdLevel l : cpu::supported_simd_levels()) {
    if (l == SimdLevel::kScalar) continue;
    REQUIRE(cpu::matmul_kernels_for(l) != nullptr);
    const cpu::MatmulKernels& mk = *cpu::matmul_kernels_for(l);
    for (DType t : kQuantTypes) {
      const auto id = static_cast<size_t>(t);
      if (mk.wgemm[id] == nullptr) continue;
      ++types;
      const cpu::TileKernels tk = cpu::tile_kernels(&mk, t);
      REQUIRE(tk.kind != cpu::TileKernels::kNone);
      // Two 256-element super-blocks (K types) or 9 blocks of 32.
      const int64_t k = quant::find_traits(t)->block_size == 256 ? 512 : 288;
      const std::vector<float> xf = randn(static_cast<size_t>(k * max_na), 901);
      const size_t ab = cpu::act_row_bytes(cpu::ActFormat::kQ8, k);
      const std::vector<uint8_t> at = tile_acts(mk, xf, k, max_na, tk.q8u());
      for (int nrows : {16, 11, 1}) {
        const std::vector<uint8_t> wb = encode(t, randn(static_cast<size_t>(k * nrows), 902 + nrows), nrows, k);
        const size_t rb = wb.size() / static_cast<size_t>(nrows);
        const uint8_t* rows[cpu::kWideTileRows];
        for (int r = 0; r < nrows; ++r) rows[r] = wb.data() + rb * static_cast<size_t>(r);
        // The reference: 8-row tiles, one activation row at a time.
        std::vector<double> ref_all(static_cast<size_t>(max_na * cpu::kWideTileRows), 0.0);
        for (int h = 0; h * cpu::kTileRows < nrows; ++h) {
          std::vector<uint8_t> tile(static_cast<size_t>(k / 32) * tk.block_bytes);
          const int n8 = std::min(cpu::kTileRows, nrows - h * cpu::kTileRows);
          tk.pack(rows + h * cpu::kTileRows, n8, k, tile.data());
          for (int j = 0; j < max_na; ++j) {
            float one[cpu::kTileRows];
            tk.dot[0](k, tile.data(), at.data() + ab * static_cast<size_t>(j), ab, one);
            for (int r = 0; r < n8; ++r) ref_all[static_cast<size_t>(j * cpu::kWideTileRows + h * cpu::kTileRows + r)] = one[r];
          }
        }
        for (int na : {1, 2, 9, 17, 33, max_na}) {
          std::vector<float> got(static_cast<size_t>(na * cpu::kWideTileRows), 12345.f);
          mk.wgemm[id](rows, nrows, k, at.data(), ab, na, got.data());
          std::vector<float> g;
          std::vector<double> ref;
          for (int j = 0; j < na; ++j)
            for (int r = 0; r < nrows; ++r) {
              g.push_back(got[static_cast<size_t>(j * cpu::kWideTileRows + r)]);
              ref.push_back(ref_all[static_cast<size_t>(j * cpu::kWideTileRows + r)]);
            }
          INFO(cpu::simd_level_name(l), " ", quant::find_traits(t)->name, " rows ", nrows, " na ", na);
          CHECK(nmse(g, ref) < 1e-10);  // the same integer sums; only the float rounding differs
        }
      }
    }
  }
  if (cpu::best_simd_level() == SimdLevel::kAvx512) CHECK(types == 12);
}

TEST_CASE("ops: mul_mat batched decode 2..70 rows, wgemm on and off") {
  uint32_t seed = 950;
  for (bool wide : {true, false}) {
    if (wide) cpu::set_wgemm_rows(-1, -1);
    else cpu::set_wgemm_rows(0, 0);
    CHECK(cpu::wgemm_max_rows() == (wide ? -1 : 0));
    for (DType t : {DType::Q4_0, DType::Q8_0, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::Q3_K, DType::IQ4_XS,
                    DType::Q4_1})
      for (int64_t n : {2, 6, 9, 12, 17, 24, 32, 40, 70}) {
        // Whole 16-row tiles plus a partial one; K types: two super-blocks.
        const int64_t k = quant::find_traits(t)->block_size == 256 ? 512 : 288;
        check_mul_mat(t, k, n % 2 == 0 ? 37 : 21, n, 1, false, seed++);
      }
  }
  // More rows than one wgemm call takes (kWideGemmMaxNa), for the 32-element-scale types too.
  cpu::set_wgemm_rows(-1, 1000);
  for (DType t : {DType::Q4_0, DType::Q4_K, DType::IQ4_XS})
    check_mul_mat(t, quant::find_traits(t)->block_size == 256 ? 512 : 288, 21, 70, 1, false, seed++);
  cpu::set_wgemm_rows(-1, -1);
  CHECK(cpu::wgemm_min_rows() == -1);
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

// The reference for top_k: every entry that is neither NaN nor -inf, sorted by (value desc,
// index asc) — a full sort, not the kernels' selection.
static std::vector<float> top_k_reference(const std::vector<float>& x, int64_t n, int64_t rows, int k, bool lse) {
  std::vector<float> out;
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = &x[static_cast<size_t>(r * n)];
    std::vector<int32_t> idx;
    for (int32_t i = 0; i < n; ++i)
      if (row[i] > -INFINITY) idx.push_back(i);
    std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return row[a] > row[b]; });
    for (int j = 0; j < k; ++j) out.push_back(j < static_cast<int>(idx.size()) ? row[idx[j]] : -INFINITY);
    for (int j = 0; j < k; ++j) out.push_back(j < static_cast<int>(idx.size()) ? static_cast<float>(idx[j]) : -1.f);
    double m = -INFINITY, s = 0;
    for (int32_t i = 0; i < n; ++i)
      if (row[i] == row[i]) m = std::max(m, static_cast<double>(row[i]));
    for (int32_t i = 0; i < n && std::isfinite(m); ++i)
      if (row[i] == row[i]) s += std::exp(row[i] - m);
    out.push_back(!lse ? 0.f : std::isfinite(m) ? static_cast<float>(m + std::log(s)) : static_cast<float>(m));
  }
  return out;
}

TEST_CASE("ops: top_k selects each row's best entries, ties to the lower index, skipping NaN and -inf") {
  struct Case {
    const char* what;
    int64_t n, rows;
    int k;
    bool lse;
    std::function<float(std::mt19937&, int64_t r, int64_t i)> value;
  };
  std::normal_distribution<float> normal(0.f, 3.f);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<Case> cases = {
      {"random logits", 4096, 5, 64, true, [&](std::mt19937& g, int64_t, int64_t) { return normal(g); }},
      {"k = 1 (greedy)", 1000, 3, 1, false, [&](std::mt19937& g, int64_t, int64_t) { return normal(g); }},
      // Few distinct values: the k-th largest is shared by many entries, which must be taken lowest
      // index first (the CUDA kernel's ordered tie path).
      {"heavy ties", 3000, 4, 40, true,
       [&](std::mt19937& g, int64_t, int64_t) { return std::round(normal(g)) * 0.5f; }},
      {"all equal", 700, 2, 128, false, [](std::mt19937&, int64_t, int64_t) { return 1.25f; }},
      {"signed zeros", 500, 2, 16, false,
       [](std::mt19937& g, int64_t, int64_t i) { return i % 7 == 0 ? (g() % 2 ? 0.f : -0.f) : -1.f - float(i % 5); }},
      // NaN and -inf are never candidates; rows with fewer allowed entries than k pad, and a
      // row with none has log-sum-exp -inf.
      {"NaN, -inf, short rows", 2000, 4, 32, true,
       [&](std::mt19937& g, int64_t r, int64_t i) {
         if (r == 2) return i % 400 == 3 ? normal(g) : -INFINITY;  // 5 allowed entries
         if (r == 3) return i % 9 == 0 ? nan : -INFINITY;          // none
         return i % 11 == 0 ? nan : i % 13 == 0 ? -INFINITY : normal(g);
       }},
      {"fewer entries than k", 50, 3, 64, true, [&](std::mt19937& g, int64_t, int64_t) { return normal(g); }},
      {"k = 1 over NaN, -inf and signed zeros", 1500, 4, 1, true,
       [&](std::mt19937& g, int64_t r, int64_t i) {
         if (r == 0) return i % 3 == 0 ? nan : -INFINITY;                                  // nothing allowed
         if (r == 1) return i % 97 == 5 ? (g() % 2 ? 0.f : -0.f) : -1.f;                 // ties at zero
         return i % 5 == 0 ? nan : i % 7 == 0 ? -INFINITY : normal(g);
       }},
      {"huge and tiny magnitudes", 3000, 2, 24, true,
       [&](std::mt19937& g, int64_t, int64_t i) { return i % 3 == 0 ? normal(g) * 1e30f : normal(g) * 1e-30f; }},
      // A vocabulary-sized row (CUDA: the 1024-thread blocks) at the largest k.
      {"a 128K vocabulary", 131072, 2, 128, true, [&](std::mt19937& g, int64_t, int64_t) { return normal(g); }},
  };
  for (const Case& tc : cases) {
    std::mt19937 g(7);
    std::vector<float> x(static_cast<size_t>(tc.n * tc.rows));
    for (int64_t r = 0; r < tc.rows; ++r)
      for (int64_t i = 0; i < tc.n; ++i) x[static_cast<size_t>(r * tc.n + i)] = tc.value(g, r, i);
    const std::vector<float> ref = top_k_reference(x, tc.n, tc.rows, tc.k, tc.lse);
    for_each_config([&](const Config& c) {
      Graph g2;
      // (Rows as a 3-D tensor when there are several: the op walks any row layout.)
      Tensor* a = tc.rows % 2 == 0 ? g2.input(DType::F32, {tc.n, 2, tc.rows / 2}, "a")
                                   : g2.input(DType::F32, {tc.n, tc.rows}, "a");
      Tensor* y = g2.top_k(a, tc.k, tc.lse);
      INFO(tc.what, " on ", c.label);
      REQUIRE(c.backend->supports(*y));
      const std::vector<float> got = run_graph(*c.backend, g2, y, {{a, bytes_of(x)}});
      REQUIRE(got.size() == ref.size());
      const size_t w = static_cast<size_t>(2 * tc.k + 1);
      for (size_t r = 0; r < static_cast<size_t>(tc.rows); ++r)
        for (size_t j = 0; j < w; ++j) {
          const float e = ref[r * w + j], v = got[r * w + j];
          INFO("row ", r, " entry ", j);
          if (j + 1 < w) {  // values and indices exactly (signed zeros compare equal)
            CHECK(v == e);
          } else if (std::isinf(e)) {
            CHECK(v == e);
          } else {
            CHECK(std::abs(v - e) <= 1e-5f * std::max(1.f, std::abs(e)));
          }
        }
    });
  }
}


// Graph::top_k's draw, computed here as the contract states: float weights, summed in double in
// index order. Returns the token and, through `lo`/`hi`, the running sums around it.
static int32_t reference_draw(const float* x, int64_t n, float t, double u, double* lo, double* hi, double* total) {
  float m = -INFINITY;
  for (int64_t i = 0; i < n; ++i)
    if (x[i] > m) m = x[i];
  *total = 0;
  if (!(t > 0.f) || !(m > -INFINITY)) return -1;
  int64_t last = -1;
  for (int64_t i = 0; i < n; ++i)
    if (x[i] > -INFINITY) *total += std::exp((x[i] - m) * (1.f / t)), last = i;
  double acc = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (!(x[i] > -INFINITY)) continue;
    *lo = acc;
    acc += std::exp((x[i] - m) * (1.f / t));
    *hi = acc;
    if (u * *total < acc) return static_cast<int32_t>(i);
  }
  return static_cast<int32_t>(last);
}

TEST_CASE("ops: top_k draws a token from the whole row at a temperature with a given uniform, and gives its logit") {
  const int64_t n = 5000, rows = 8;
  std::mt19937 g(3);
  std::normal_distribution<float> normal(0.f, 2.f);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  std::vector<float> x(static_cast<size_t>(n * rows));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < n; ++i) {
      float v = normal(g);
      if (r == 5 && i % 3 != 0) v = -INFINITY;          // few allowed
      if (r == 6) v = i % 2 ? NAN : -INFINITY;          // none allowed: -1
      if (r == 7 && i % 17 == 0) v = NAN;               // NaN skipped
      x[static_cast<size_t>(r * n + i)] = v;
    }
  for (int trial = 0; trial < 6; ++trial) {
    std::vector<int32_t> words(static_cast<size_t>(4 * rows));
    std::vector<float> temp(static_cast<size_t>(rows));
    std::vector<double> us(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) {
      constexpr std::array<float, 4> kTemps = {0.3f, 0.8f, 1.f, 2.5f};
      temp[static_cast<size_t>(r)] = r == 4 ? 0.f : kTemps[static_cast<size_t>((r + trial) % 4)];
      us[static_cast<size_t>(r)] = trial == 0 ? 0.0 : trial == 1 ? 0x1.fffffffffffffp-1 : uniform(g);
      pack_draw(temp[static_cast<size_t>(r)], us[static_cast<size_t>(r)], &words[static_cast<size_t>(4 * r)]);
    }
    std::vector<uint8_t> wb(words.size() * 4);
    std::memcpy(wb.data(), words.data(), wb.size());
    for_each_config([&](const Config& c) {
      Graph gr;
      Tensor* a = gr.input(DType::F32, {n, rows}, "a");
      Tensor* d = gr.input(DType::I32, {4, rows}, "draws");
      Tensor* y = gr.top_k(a, 8, false, d);
      INFO("trial ", trial, " on ", c.label);
      REQUIRE(c.backend->supports(*y));
      const std::vector<float> got = run_graph(*c.backend, gr, y, {{a, bytes_of(x)}, {d, wb}});
      for (int64_t r = 0; r < rows; ++r) {
        double lo = 0, hi = 0, total = 0;
        const int32_t ref = reference_draw(&x[static_cast<size_t>(r * n)], n, temp[static_cast<size_t>(r)],
                                           us[static_cast<size_t>(r)], &lo, &hi, &total);
        const auto drawn = static_cast<int32_t>(got[static_cast<size_t>(r * 19 + 17)]);
        INFO("row ", r, " reference ", ref, " drawn ", drawn);
        // With the drawn token's logit (its logprob, whether or not it is among the top k).
        const float logit = got[static_cast<size_t>(r * 19 + 18)];
        if (drawn >= 0) {
          REQUIRE(drawn < n);
          CHECK(logit == x[static_cast<size_t>(r * n + drawn)]);
        } else {
          CHECK(logit == -INFINITY);
        }
        if (c.cpu || drawn == ref) {  // the CPU sums exactly as the reference does
          CHECK(drawn == ref);
        } else {  // a device sums in another order: only a target at a boundary may move
          const double target = us[static_cast<size_t>(r)] * total;
          CHECK((std::abs(target - lo) < 1e-9 * total || std::abs(target - hi) < 1e-9 * total));
        }
      }
    });
  }
}

}  // namespace
}  // namespace kite

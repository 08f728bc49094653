// The CPU backend's kernel tables (backends/cpu/matmul.h) checked against one another at every
// SIMD level this machine supports: the level detection, the activation quantizers, the prefill
// tiles, gemm8, wgemm and the decode gemv kernels against the per-row dots or the 8-row tiles on
// the same activations, and the float-weight GEMM's batch-invariant bits. (test_ops.cpp runs the
// ops through each backend against references; test_ops_avx2.cpp the AVX2 level at its bounds.)
// Also the CPU backend's choice between the two ways of a one-row mul_mat (one_row.h).
#include "backends/cpu/one_row.h"
#include "tests/ops_test_util.h"

namespace kite {
namespace {

using namespace ops_test;

// The NMSE between type t's one-row decode kernel (mk.gemv, on activations `ag`) and its per-row
// dot (mk.dot[t][0], on `ad`), over 5 random weight rows of k: the same integer sums, so only
// the float rounding may differ.
double gemv_vs_dot(const cpu::MatmulKernels& mk, DType t, int64_t k, const uint8_t* ag, const uint8_t* ad, size_t ab,
                   uint32_t seed) {
  const auto id = static_cast<size_t>(t);
  const int64_t rows = 5;
  const std::vector<uint8_t> wb = encode(t, randn(static_cast<size_t>(k * rows), seed), rows, k);
  const size_t rb = wb.size() / rows;
  std::vector<float> got;
  std::vector<double> ref;
  for (int64_t i = 0; i < rows; ++i) {
    float a = 0.f, b = 0.f;
    mk.gemv[id](k, wb.data() + rb * static_cast<size_t>(i), ag, ab, &a);
    mk.dot[id][0](k, wb.data() + rb * static_cast<size_t>(i), ad, ab, &b);
    got.push_back(a), ref.push_back(b);
  }
  return nmse(got, ref);
}

// Whether type t's four-row decode kernel (mk.gemv4) gives every row the bits of its one-row
// kernel: 8 random rows stored `pad` bytes apart beyond their length, two calls (the first told
// of the second's rows, the second of none).
bool gemv4_same_bits(const cpu::MatmulKernels& mk, DType t, int64_t k, const uint8_t* ag, uint32_t seed) {
  const auto id = static_cast<size_t>(t);
  const std::vector<uint8_t> wb = encode(t, randn(static_cast<size_t>(k * 8), seed), 8, k);
  const size_t rb = wb.size() / 8, pad = 3 * 64, stride = rb + pad;
  std::vector<uint8_t> ws(8 * stride, 0xff);
  for (size_t i = 0; i < 8; ++i) std::memcpy(ws.data() + i * stride, wb.data() + i * rb, rb);
  float four[8], one[8];
  mk.gemv4[id](k, ws.data(), stride, ws.data() + 4 * stride, ag, four);
  mk.gemv4[id](k, ws.data() + 4 * stride, stride, nullptr, ag, four + 4);
  for (size_t i = 0; i < 8; ++i) mk.gemv[id](k, ws.data() + i * stride, ag, 0, &one[i]);
  bool same = true;
  for (int i = 0; i < 8; ++i)
    if (std::memcmp(&four[i], &one[i], sizeof(float)) != 0) {
      MESSAGE("row ", i, ": four rows a call gave ", four[i], ", one row ", one[i]);
      same = false;
    }
  return same;
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
  // kQ8U (the 16-element-scale tiles' activations): codes + 128 as u8, and the u8 sums of each
  // 16-element half in place of s.
  std::vector<uint8_t> u8 = ref8;
  cpu::act_q8_to_q8u(u8.data(), k);
  const auto* u = reinterpret_cast<const cpu::ActQ8*>(u8.data());
  for (int64_t blk = 0; blk < k / 32; ++blk) {
    uint32_t half[2] = {0, 0};
    for (int i = 0; i < 32; ++i) {
      const int code = b[blk].qs[i] + 128;
      CHECK(static_cast<uint8_t>(u[blk].qs[i]) == code);
      half[i / 16] += static_cast<uint32_t>(code);
    }
    uint32_t packed;
    std::memcpy(&packed, &u[blk].s, sizeof packed);
    CHECK(packed == (half[0] | half[1] << 16));
    CHECK(u[blk].d == b[blk].d);
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
    // The x86 levels tile Q2_K (with its mins), and Q8_0, IQ4_NL and IQ4_XS (the AVX2 level with
    // signed codes).
    if (l == SimdLevel::kAvx512 || l == SimdLevel::kAvxVnni || l == SimdLevel::kAvx2) CHECK(tiled_types == 12);
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
    if (l == SimdLevel::kAvx512 || l == SimdLevel::kAvxVnni || l == SimdLevel::kAvx2) CHECK(types == 11);
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
        cs.fn(wb.data(), rb, static_cast<int>(m), k, act.data(), as, na, all.data(), m, nullptr);
        std::vector<double> ref(all.size());
        for (int j = 0; j < na; ++j)
          for (int64_t r = 0; r < m; ++r) {
            double d = 0;
            for (int64_t i = 0; i < k; ++i) d += static_cast<double>(wf[r * k + i]) * xf[j * k + i];
            ref[static_cast<size_t>(j * m + r)] = d;
          }
        CHECK(nmse(all, ref) < 1e-10);
        // Each activation row alone, pairs, and each weight row alone at offsets that move it
        // to every position of a tile: the same bits as in the whole product (with the rows to
        // prefetch after them given: a prefetch changes no result).
        for (int na2 : {1, 2, 5}) {
          for (int j0 = 0; j0 + na2 <= na; j0 += na2) {
            std::vector<float> part(static_cast<size_t>(na2 * m), -1.f);
            cs.fn(wb.data(), rb, static_cast<int>(m), k, act.data() + as * static_cast<size_t>(j0), as, na2, part.data(),
                  m, wb.data());
            CHECK(std::memcmp(part.data(), all.data() + static_cast<size_t>(j0 * m), part.size() * sizeof(float)) == 0);
          }
        }
        for (int64_t r0 : {1, 5, 30}) {
          const int nr = static_cast<int>(m - r0);
          std::vector<float> part(static_cast<size_t>(na * nr), -1.f);
          cs.fn(wb.data() + rb * static_cast<size_t>(r0), rb, nr, k, act.data(), as, na, part.data(), nr, wb.data());
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
        if (mk.gemv[id] == nullptr || cpu::gemv_act_format(t) != cpu::ActFormat::kQ8G) continue;
        INFO(cpu::simd_level_name(l), " ", quant::find_traits(t)->name, " k=", k);
        CHECK(gemv_vs_dot(mk, t, k, ag.data(), a8.data(), ab, 600 + static_cast<uint32_t>(k)) < 1e-10);
        ++checked;
      }
    }
    // Through mul_mat at one activation row (the decode path), odd block counts.
    for (DType t : {DType::Q4_0, DType::Q8_0})
      for (int64_t k : {224, 288, 672}) check_mul_mat(t, k, 37, 1, 1, false, 700 + static_cast<uint32_t>(k));
  }
  CHECK(checked >= 6 * x86_levels);  // Q4_0 at 6 sizes on each
}

TEST_CASE("ops: Q4_K/Q5_K decode gemv kernels (kQ8KG activations) match the per-row dots, four rows a call too") {
  int checked = 0;
  for (SimdLevel l : cpu::supported_simd_levels()) {
    if (l == SimdLevel::kScalar) continue;
    const cpu::MatmulKernels& mk = *cpu::matmul_kernels_for(l);
    if (l == SimdLevel::kAvx512) {  // the 512-bit level has both, one and four rows a call
      CHECK((mk.gemv[static_cast<size_t>(DType::Q4_K)] != nullptr));
      CHECK((mk.gemv[static_cast<size_t>(DType::Q5_K)] != nullptr));
      CHECK((mk.gemv4[static_cast<size_t>(DType::Q4_K)] != nullptr));
      CHECK((mk.gemv4[static_cast<size_t>(DType::Q5_K)] != nullptr));
    }
    if (mk.quantize_q8kg == nullptr) continue;
    for (int64_t k : {256, 768, 2048}) {
      const std::vector<float> x = randn(static_cast<size_t>(k), 800 + static_cast<uint32_t>(k), 2.f);
      const size_t ab = cpu::act_row_bytes(cpu::ActFormat::kQ8K, k);
      REQUIRE(cpu::act_row_bytes(cpu::ActFormat::kQ8KG, k) == ab);
      std::vector<uint8_t> ak(ab), ag(ab);
      mk.quantize_q8k(x.data(), ak.data(), k);
      mk.quantize_q8kg(x.data(), ag.data(), k);
      // kQ8KG is BlockQ8_K's content regrouped: every code, scale and sum where matmul.h puts it.
      for (int64_t ib = 0; ib < k / 256; ++ib) {
        const auto& ref = reinterpret_cast<const quant::BlockQ8_K*>(ak.data())[ib];
        const auto& got = reinterpret_cast<const quant::BlockQ8_K*>(ag.data())[ib];
        INFO("k=", k, " super-block ", ib);
        CHECK(got.d == ref.d);
        for (int e = 0; e < 256; ++e) {
          const int h = e / 128, g = e % 128 / 32;  // group g of half h is stored at slot {0, 2, 1, 3}[g]
          const int slot = g == 1 ? 2 : g == 2 ? 1 : g;
          CHECK(got.qs[128 * h + 32 * slot + e % 32] == ref.qs[e]);
        }
        for (int sb = 0; sb < 8; ++sb) CHECK(got.bsums[sb] == ref.bsums[2 * sb] + ref.bsums[2 * sb + 1]);
        for (int sb = 8; sb < 16; ++sb) CHECK(got.bsums[sb] == 0);
      }
      for (DType t : {DType::Q4_K, DType::Q5_K}) {
        const auto id = static_cast<size_t>(t);
        REQUIRE(cpu::gemv_act_format(t) == cpu::ActFormat::kQ8KG);
        if (mk.gemv[id] == nullptr) continue;
        INFO(cpu::simd_level_name(l), " ", quant::find_traits(t)->name, " k=", k);
        CHECK(gemv_vs_dot(mk, t, k, ag.data(), ak.data(), ab, 900 + static_cast<uint32_t>(k)) < 1e-10);
        ++checked;
        if (mk.gemv4[id] != nullptr) CHECK(gemv4_same_bits(mk, t, k, ag.data(), 950 + static_cast<uint32_t>(k)));
      }
    }
  }
  if (cpu::best_simd_level() == SimdLevel::kAvx512) CHECK(checked == 6);
  // Through mul_mat at one activation row (the decode path) on every level, 1 and 3 super-blocks.
  for (DType t : {DType::Q4_K, DType::Q5_K})
    for (int64_t k : {256, 768}) check_mul_mat(t, k, 37, 1, 1, false, 950 + static_cast<uint32_t>(k));
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

TEST_CASE("ops: wide 16-element-scale prefill tiles give wgemm's bits") {
  // Q6_K, Q3_K and Q2_K (with its mins): the 16-row tiles are decoded by wgemm's decoders and
  // take its arithmetic block by block, so every activation row count gives its sums exactly.
  int types = 0;
  for (SimdLevel l : cpu::supported_simd_levels()) {
    if (l == SimdLevel::kScalar) continue;
    const cpu::MatmulKernels& mk = *cpu::matmul_kernels_for(l);
    for (DType t : kQuantTypes) {
      const auto id = static_cast<size_t>(t);
      if (mk.wtile16_pack[id] == nullptr) continue;
      ++types;
      const cpu::WideTiles wt = cpu::wide_tiles(&mk, t);
      REQUIRE((wt.pack == mk.wtile16_pack[id]));
      REQUIRE((mk.wgemm[id] != nullptr));
      const int64_t k = 512;  // two super-blocks
      const int max_na = cpu::kGemmMaxNa;
      const std::vector<float> xf = randn(static_cast<size_t>(k * max_na), 1001);
      const size_t ab = cpu::act_row_bytes(cpu::ActFormat::kQ8, k);
      const std::vector<uint8_t> at = tile_acts(mk, xf, k, max_na, true);
      for (int nrows : {16, 11, 1}) {
        const std::vector<uint8_t> wb = encode(t, randn(static_cast<size_t>(k * nrows), 1002 + nrows), nrows, k);
        const size_t rb = wb.size() / static_cast<size_t>(nrows);
        const uint8_t* rows[cpu::kWideTileRows];
        for (int r = 0; r < nrows; ++r) rows[r] = wb.data() + rb * static_cast<size_t>(r);
        std::vector<uint8_t> tile(static_cast<size_t>(k / 32) * wt.block_bytes);
        wt.pack(rows, nrows, k, tile.data());
        for (int na = 1; na <= max_na; ++na) {
          std::vector<float> got(static_cast<size_t>(na * cpu::kWideTileRows)), want(got.size());
          wt.dot[na - 1](k, tile.data(), at.data(), ab, got.data());
          mk.wgemm[id](rows, nrows, k, at.data(), ab, na, want.data());
          INFO(cpu::simd_level_name(l), " ", quant::find_traits(t)->name, " rows ", nrows, " na ", na);
          for (int j = 0; j < na; ++j)
            for (int r = 0; r < nrows; ++r)
              CHECK(got[static_cast<size_t>(j * cpu::kWideTileRows + r)] ==
                    want[static_cast<size_t>(j * cpu::kWideTileRows + r)]);
        }
      }
    }
  }
  if (cpu::best_simd_level() == SimdLevel::kAvx512) CHECK(types == 3);
  // Through mul_mat: Q3_K's prefill takes them past wgemm's 64 rows; Q6_K's and Q2_K's with
  // wgemm off. A whole and a partial 16-row tile, n % 8 != 0.
  uint32_t seed = 1010;
  check_mul_mat(DType::Q3_K, 512, 37, 100, 1, false, seed++);
  cpu::set_wgemm_rows(0, 0);
  for (DType t : {DType::Q6_K, DType::Q2_K, DType::Q3_K}) check_mul_mat(t, 512, 37, 43, 1, false, seed++);
  cpu::set_wgemm_rows(-1, -1);
}

TEST_CASE("ops: a one-row mul_mat every way (rows, four rows a call, weight rows in place), every type and level") {
  uint32_t seed = 1200;
  for (cpu::OneRowWay way : {cpu::OneRowWay::kRows, cpu::OneRowWay::kRows4, cpu::OneRowWay::kTiles}) {
    cpu::set_one_row_way(way);
    for (DType t : kQuantTypes)  // two whole 16-row tiles and a partial one
      check_mul_mat(t, quant::find_traits(t)->block_size == 256 ? 512 : 288, 37, 1, 1, false, seed++);
  }
  cpu::set_one_row_way(std::nullopt);
}

// One CPU backend running decode-like steps: `copies` one-row mul_mats of one k x k weight of
// type t (the sum of their products is the output), enough weight bytes for the backend to
// measure the one-row ways when there are more than 64 MiB of them.
struct OneRowSteps {
  Graph g;
  Tensor* w = nullptr;
  Tensor* y = nullptr;
  std::unique_ptr<Backend> be;
  std::unique_ptr<Buffer> buf;
  std::vector<double> ref;

  OneRowSteps(DType t, int64_t k, int copies, int threads = 2) {
    const std::vector<uint8_t> wb = encode(t, randn(static_cast<size_t>(k * k), 1300), k, k);
    const std::vector<float> wd = decode(t, wb, k * k), x = randn(static_cast<size_t>(k), 1301);
    for (int64_t i = 0; i < k; ++i) {
      double s = 0;
      for (int64_t e = 0; e < k; ++e)
        s += static_cast<double>(wd[static_cast<size_t>(i * k + e)]) * x[static_cast<size_t>(e)];
      ref.push_back(copies * s);
    }
    w = g.input(t, {k, k}, "w");
    Tensor* xt = g.input(DType::F32, {k, 1}, "x");
    y = g.mul_mat(w, xt);
    for (int i = 1; i < copies; ++i) y = g.add(y, g.mul_mat(w, xt));
    g.build(y);
    BackendOptions o;
    o.n_threads = threads;
    auto b = create_backend("cpu", o);
    REQUIRE(b.ok());
    be = std::move(*b);
    const MemoryPlan plan = MemoryPlan::make(g);
    auto a = be->alloc(plan.arena_bytes() + 64);
    REQUIRE(a.ok());
    buf = std::move(*a);
    plan.place(g, static_cast<uint8_t*>(buf->base()));
    REQUIRE(be->upload(*w, wb.data(), wb.size()).ok());
    REQUIRE(be->upload(*xt, x.data(), x.size() * sizeof(float)).ok());
  }
  double bytes() const { return static_cast<double>(w->nbytes()); }
  std::vector<float> step() {
    REQUIRE(be->compute(g.nodes()).ok());
    std::vector<float> out(static_cast<size_t>(y->n_elements()));
    REQUIRE(be->download(*y, out.data(), out.size() * sizeof(float)).ok());
    CHECK(nmse(out, ref) < 1e-4);
    return out;
  }
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST_CASE("ops: the cpu backend times the one-row ways before first use and keeps the fastest per weight type") {
  cpu::set_one_row_way(std::nullopt);
  cpu::reset_one_row_decisions();
  auto decision = [](DType t, int threads) -> std::optional<cpu::OneRowDecision> {
    for (const cpu::OneRowDecision& d : cpu::one_row_decisions())
      if (d.type == t && d.threads == threads && d.level == cpu::simd_level_name(cpu::active_simd_level())) return d;
    return std::nullopt;
  };
  // A small model (under 64 MiB of the type's weights) takes the row kernels, unmeasured.
  OneRowSteps small(DType::Q8_0, 1024, 4);
  small.step();
  CHECK(!decision(DType::Q8_0, 2));

  OneRowSteps big(DType::Q4_K, 1024, 120);
  REQUIRE(120 * big.bytes() > 64.0 * 1024 * 1024);
  const Tensor* first = nullptr;
  for (const Tensor* n : big.g.nodes())
    if (n->op == Op::kMulMat && first == nullptr) first = n;
  REQUIRE(first != nullptr);
  const unsigned ways = cpu::one_row_choices(first);
  // x86 has the choice at every SIMD level (gemm8, or wgemm with AVX-512 VNNI); aarch64 none.
#if defined(__x86_64__)
  REQUIRE((ways & cpu::one_row_bit(cpu::OneRowWay::kTiles)) != 0);
#endif
  const bool four = (ways & cpu::one_row_bit(cpu::OneRowWay::kRows4)) != 0;
  if (cpu::active_simd_level() == SimdLevel::kAvx512) CHECK(four);
  const std::vector<float> got = big.step();  // decided before it ran
  if (ways == 0) {
    CHECK(cpu::one_row_decisions().empty());
    return;
  }
  REQUIRE(decision(DType::Q4_K, 2));
  const cpu::OneRowDecision d = *decision(DType::Q4_K, 2);
  CHECK(d.rows_gbps > 0);
  CHECK(d.tiles_gbps > 0);
  CHECK((d.rows4_gbps > 0) == four);
  const double best_rows = std::max(d.rows_gbps, d.rows4_gbps);
  CHECK(d.way == (d.tiles_gbps > best_rows * 1.03   ? cpu::OneRowWay::kTiles
                  : d.rows4_gbps > d.rows_gbps ? cpu::OneRowWay::kRows4
                                               : cpu::OneRowWay::kRows));
  CHECK(cpu::one_row_decisions().size() == 1);
  // The rows and the tiles give different bits (Q4_K's row kernels take Q8_K activations, the
  // in-place ones Q8_0 blocks), so forcing each shows which ran: every step, this backend's and
  // a new one's, took the decided way. Four rows a call give the rows' bits.
  cpu::set_one_row_way(cpu::OneRowWay::kRows);
  const std::vector<float> rows = big.step();
  cpu::set_one_row_way(cpu::OneRowWay::kRows4);
  CHECK(same_bits(big.step(), rows));
  cpu::set_one_row_way(cpu::OneRowWay::kTiles);
  const std::vector<float> tiles = big.step();
  cpu::set_one_row_way(std::nullopt);
  CHECK(!same_bits(rows, tiles));
  const std::vector<float>& kept = d.way == cpu::OneRowWay::kTiles ? tiles : rows;
  CHECK(same_bits(got, kept));
  CHECK(same_bits(big.step(), kept));
  OneRowSteps again(DType::Q4_K, 1024, 120);
  CHECK(same_bits(again.step(), kept));
  CHECK(cpu::one_row_decisions().size() == 1);
  // A backend of another thread count keeps the rows or the tiles (their bits) and times only one
  // row against four where the rows won.
  OneRowSteps one(DType::Q4_K, 1024, 120, 1);
  CHECK(same_bits(one.step(), kept));
  if (d.way == cpu::OneRowWay::kTiles || !four) {
    CHECK(!decision(DType::Q4_K, 1));
  } else {
    REQUIRE(decision(DType::Q4_K, 1));
    const cpu::OneRowDecision d1 = *decision(DType::Q4_K, 1);
    CHECK(d1.tiles_gbps == 0);
    CHECK(d1.way == (d1.rows4_gbps > d1.rows_gbps ? cpu::OneRowWay::kRows4 : cpu::OneRowWay::kRows));
  }
}

}  // namespace
}  // namespace kite

// The AVX2 level's prefill tiles and gemm8 (matmul_x86_tiles.inc, matmul_x86_gemm.inc): the
// same sources as the VNNI levels (AVX-VNNI, AVX-512) with vpdpbusd emulated by maddubs chains in
// i16 lanes (dp_chain), exact only within the bounds those files state. Checked here at the
// bounds (codes at the top of each type's range against activation codes of +-127) against a
// double reference, bit for bit against each VNNI level this CPU has, and through mul_mat at
// prefill row counts. The signed-code tiles the level has for Q8_0, IQ4_NL and IQ4_XS instead
// (maddubs on |w|), at their codes' bounds. The AVX-VNNI level: its kernel set, and bit for bit
// against AVX-512.
#include <algorithm>

#include "formats/quant/blocks.h"
#include "tests/ops_test_util.h"

#if defined(__x86_64__)  // the x86 levels exist only there

namespace kite {
namespace {

using namespace ops_test;

// The types the AVX2 level has tiles and gemm8 for (8-row tiles; 16-element-scale tiles for
// Q6_K and Q3_K). Q8_0, IQ4_NL and IQ4_XS take signed-code tiles and gemm8 there.
constexpr DType kAvx2TileTypes[] = {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1,
                                    DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::Q3_K};
constexpr DType kAvx2SignedTileTypes[] = {DType::Q8_0, DType::IQ4_NL, DType::IQ4_XS};

bool is_t16(DType t) {
  return t == DType::Q6_K || t == DType::Q3_K;
}

constexpr uint16_t kHalfOne = 0x3C00, kHalfHalf = 0x3800, kHalfMinusHalf = 0xB800;

// nrows rows of k elements of type t whose code bits are all set (high) or all clear, with
// finite nonzero scales: all set is the largest code u of the unsigned types (15 or 31) and
// w = +31 / +3 for Q6_K / Q3_K; all clear is w = -32 / -4, their largest |w|.
std::vector<uint8_t> extreme_rows(DType t, int64_t k, int nrows, bool high) {
  const quant::TypeTraits* tr = quant::find_traits(t);
  const size_t bb = static_cast<size_t>(tr->type_size);
  const size_t nb = static_cast<size_t>(k / tr->block_size) * static_cast<size_t>(nrows);
  std::vector<uint8_t> out(bb * nb, high ? 0xFF : 0x00);
  auto set_half = [&](size_t blk, size_t off, uint16_t h) { std::memcpy(out.data() + blk * bb + off, &h, 2); };
  for (size_t b = 0; b < nb; ++b) {
    switch (t) {
      case DType::Q4_0:
        set_half(b, offsetof(quant::BlockQ4_0, d), kHalfOne);
        break;
      case DType::Q5_0:
        set_half(b, offsetof(quant::BlockQ5_0, d), kHalfOne);
        break;
      case DType::Q4_1:
        set_half(b, offsetof(quant::BlockQ4_1, d), kHalfOne);
        set_half(b, offsetof(quant::BlockQ4_1, m), kHalfMinusHalf);
        break;
      case DType::Q5_1:
        set_half(b, offsetof(quant::BlockQ5_1, d), kHalfOne);
        set_half(b, offsetof(quant::BlockQ5_1, m), kHalfMinusHalf);
        break;
      case DType::Q4_K:  // scale bytes 0xFF: every 6-bit scale and min 63
        set_half(b, offsetof(quant::BlockQ4_K, d), kHalfOne);
        set_half(b, offsetof(quant::BlockQ4_K, dmin), kHalfHalf);
        std::memset(out.data() + b * bb + offsetof(quant::BlockQ4_K, scales), 0xFF, quant::kKScaleSize);
        break;
      case DType::Q5_K:
        set_half(b, offsetof(quant::BlockQ5_K, d), kHalfOne);
        set_half(b, offsetof(quant::BlockQ5_K, dmin), kHalfHalf);
        std::memset(out.data() + b * bb + offsetof(quant::BlockQ5_K, scales), 0xFF, quant::kKScaleSize);
        break;
      case DType::Q6_K:  // scales 1: the integer sums reach the output unscaled
        std::memset(out.data() + b * bb + offsetof(quant::BlockQ6_K, scales), 1, quant::kQK_K / 16);
        set_half(b, offsetof(quant::BlockQ6_K, d), kHalfOne);
        break;
      case DType::Q3_K:  // scale codes 0 or 63: sub-block scales -32 or +31
        set_half(b, offsetof(quant::BlockQ3_K, d), kHalfOne);
        break;
      default:
        FAIL("no extreme rows for this type");
        break;
    }
  }
  return out;
}

// out[j * 8 + r] = the double-precision dot of weight row r (decoded) with activation row j
// (ActQ8 or ActQ8U codes times their block scale).
std::vector<double> reference(DType t, const std::vector<uint8_t>& wb, int nrows, int64_t k,
                              const std::vector<uint8_t>& at, int na) {
  const std::vector<float> wd = decode(t, wb, k * nrows);
  const size_t ab = cpu::act_row_bytes(cpu::ActFormat::kQ8, k);
  std::vector<double> ref(static_cast<size_t>(na) * cpu::kTileRows, 0.0);
  for (int j = 0; j < na; ++j)
    for (int r = 0; r < nrows; ++r) {
      double s = 0;
      for (int64_t e = 0; e < k; ++e) {
        cpu::ActQ8 blk;
        std::memcpy(&blk, at.data() + ab * static_cast<size_t>(j) + sizeof(cpu::ActQ8) * static_cast<size_t>(e / 32),
                    sizeof blk);
        const int code = is_t16(t) ? static_cast<int>(static_cast<uint8_t>(blk.qs[e % 32])) - 128 : blk.qs[e % 32];
        s += static_cast<double>(wd[static_cast<size_t>(r * k + e)]) * blk.d * code;
      }
      ref[static_cast<size_t>(j * cpu::kTileRows + r)] = s;
    }
  return ref;
}

// The tile product (pack + tile_dot at na rows) and gemm8 of one level: out[j * 8 + r].
struct TileResults {
  std::vector<float> tile, gemm;
};

TileResults run_tiles(const cpu::MatmulKernels& mk, DType t, const std::vector<uint8_t>& wb, int nrows, int64_t k,
                      const std::vector<uint8_t>& at, int na) {
  const auto id = static_cast<size_t>(t);
  const cpu::TileKernels tk = cpu::tile_kernels(&mk, t);
  REQUIRE(tk.kind == (is_t16(t) ? cpu::TileKernels::k16 : cpu::TileKernels::k32));
  REQUIRE((mk.gemm8[id] != nullptr));
  const size_t rb = wb.size() / static_cast<size_t>(nrows);
  const uint8_t* rows[cpu::kTileRows];
  for (int r = 0; r < nrows; ++r) rows[r] = wb.data() + rb * static_cast<size_t>(r);
  std::vector<uint8_t> tile(static_cast<size_t>(k / 32) * tk.block_bytes);
  tk.pack(rows, nrows, k, tile.data());
  const size_t ab = cpu::act_row_bytes(cpu::ActFormat::kQ8, k);
  TileResults res;
  res.tile.assign(static_cast<size_t>(na) * cpu::kTileRows, 0.f);
  res.gemm.assign(static_cast<size_t>(na) * cpu::kTileRows, 0.f);
  for (int j0 = 0; j0 < na; j0 += cpu::kMaxNa) {  // the tile kernels take up to kMaxNa rows a call
    const int n = std::min(cpu::kMaxNa, na - j0);
    tk.dot[n - 1](k, tile.data(), at.data() + ab * static_cast<size_t>(j0), ab,
                  res.tile.data() + static_cast<size_t>(j0) * cpu::kTileRows);
  }
  mk.gemm8[id](rows, nrows, k, at.data(), ab, na, res.gemm.data());
  return res;
}

// Largest |got - ref| over the first nrows of each activation row, relative to max |ref|.
double max_rel_err(const std::vector<float>& got, const std::vector<double>& ref, int nrows, int na) {
  double err = 0, mag = 0;
  for (int j = 0; j < na; ++j)
    for (int r = 0; r < nrows; ++r) {
      const size_t i = static_cast<size_t>(j * cpu::kTileRows + r);
      err = std::max(err, std::fabs(got[i] - ref[i]));
      mag = std::max(mag, std::fabs(ref[i]));
    }
  return mag > 0 ? err / mag : err;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b, int nrows, int na) {
  for (int j = 0; j < na; ++j)
    if (std::memcmp(&a[static_cast<size_t>(j * cpu::kTileRows)], &b[static_cast<size_t>(j * cpu::kTileRows)],
                    sizeof(float) * static_cast<size_t>(nrows)) != 0)
      return false;
  return true;
}

bool has_level(SimdLevel l) {
  const auto levels = cpu::supported_simd_levels();
  return std::find(levels.begin(), levels.end(), l) != levels.end();
}

TEST_CASE("ops avx2: the level has tiles and gemm8 exactly for the types within maddubs' range") {
  REQUIRE(has_level(SimdLevel::kAvx2));
  const cpu::MatmulKernels& mk = *cpu::matmul_kernels_for(SimdLevel::kAvx2);
  for (DType t : kQuantTypes) {
    const auto id = static_cast<size_t>(t);
    const bool want = std::find(std::begin(kAvx2TileTypes), std::end(kAvx2TileTypes), t) != std::end(kAvx2TileTypes);
    INFO(quant::find_traits(t)->name);
    CHECK((mk.tile_pack[id] != nullptr || mk.tile16_pack[id] != nullptr) == want);
    CHECK((mk.tile16_pack[id] != nullptr) == (want && is_t16(t)));
    const bool s8 = std::find(std::begin(kAvx2SignedTileTypes), std::end(kAvx2SignedTileTypes), t) !=
                    std::end(kAvx2SignedTileTypes);
    CHECK((mk.gemm8[id] != nullptr) == (want || s8));
    CHECK((mk.wgemm[id] == nullptr));
    CHECK((mk.wtile_pack[id] == nullptr));
    CHECK((mk.tile_s8_pack[id] != nullptr) == s8);
    CHECK((cpu::tile_kernels(&mk, t).kind == cpu::TileKernels::k32Signed) == s8);
  }
  // The codebook types are all tiled; those past tile16_dot's chain bound (IQ2/IQ3, codes up to
  // +-62) on tile16b_dot, which widens every maddubs.
  for (DType t : kIqTypes) {
    const auto id = static_cast<size_t>(t);
    INFO(quant::find_traits(t)->name);
    const bool big = t != DType::IQ1_S && t != DType::IQ1_M;
    CHECK((mk.tile16_pack[id] != nullptr));
    CHECK(mk.tile16_big[id] == big);
    CHECK((cpu::tile_kernels(&mk, t).dot == (big ? mk.tile16b_dot : mk.tile16_dot)));
  }
  for (int na = 1; na <= cpu::kMaxNa; ++na) CHECK((mk.tile_s8_dot[na - 1] != nullptr));
  for (int na = 1; na <= cpu::kMaxNa; ++na) CHECK((mk.tile_dot[na - 1] != nullptr && mk.tile16_dot[na - 1] != nullptr));
  // 8-row tile products spill at 16 registers; the 4-row ones serve (ops_matmul takes them).
  CHECK((mk.tile_dot8 == nullptr));
  CHECK((mk.tile16_dot8 == nullptr));
}

TEST_CASE("ops avx2: tiles and gemm8 are exact at the codes' bounds") {
  REQUIRE(has_level(SimdLevel::kAvx2));
  const cpu::MatmulKernels& mk = *cpu::matmul_kernels_for(SimdLevel::kAvx2);
  const int64_t k = 512;
  const int na = cpu::kGemmMaxNa;
  // Activation rows of +1 and -1 everywhere (codes +127 / -127: every i16 lane of a chain at
  // its largest magnitude), then mixed signs per row.
  std::vector<float> xf(static_cast<size_t>(k * na));
  for (int j = 0; j < na; ++j)
    for (int64_t e = 0; e < k; ++e) {
      const float s = j == 0 ? 1.f : j == 1 ? -1.f : ((e / (j + 1)) % 2 == 0 ? 1.f : -1.f);
      xf[static_cast<size_t>(j * k + e)] = s;
    }
  int checked = 0;
  for (DType t : kAvx2TileTypes) {
    const std::vector<uint8_t> at = tile_acts(mk, xf, k, na, is_t16(t));
    for (bool high : {true, false}) {
      if (!high && !is_t16(t)) continue;  // all-clear codes of the unsigned types are u = 0
      for (int nrows : {8, 3}) {
        const std::vector<uint8_t> wb = extreme_rows(t, k, nrows, high);
        const std::vector<double> ref = reference(t, wb, nrows, k, at, na);
        const TileResults got = run_tiles(mk, t, wb, nrows, k, at, na);
        INFO(quant::find_traits(t)->name, high ? " codes high" : " codes low", " rows ", nrows);
        // A wrapped or saturated i16 lane is off by thousands of units of the largest output.
        CHECK(max_rel_err(got.tile, ref, nrows, na) < 1e-5);
        CHECK(max_rel_err(got.gemm, ref, nrows, na) < 1e-5);
        ++checked;
      }
    }
  }
  CHECK(checked == 2 * 6 + 4 * 2);
}

// Rows of a signed-code type at its codes' bounds, scales 1: Q8_0 codes +127 or -128; IQ4_NL and
// IQ4_XS table values +113 or -127 (IQ4_XS sub-block scales +31 or -32).
std::vector<uint8_t> extreme_signed_rows(DType t, int64_t k, int nrows, bool high) {
  const quant::TypeTraits* tr = quant::find_traits(t);
  const size_t bb = static_cast<size_t>(tr->type_size);
  const size_t nb = static_cast<size_t>(k / tr->block_size) * static_cast<size_t>(nrows);
  std::vector<uint8_t> out(bb * nb, high ? 0xFF : 0x00);
  for (size_t b = 0; b < nb; ++b) {
    uint8_t* blk = out.data() + b * bb;
    std::memcpy(blk, &kHalfOne, 2);  // d comes first in all three
    if (t == DType::Q8_0) std::memset(blk + offsetof(quant::BlockQ8_0, qs), high ? 0x7F : 0x80, 32);
  }
  return out;
}

TEST_CASE("ops avx2: signed-code tiles and gemm8 (Q8_0, IQ4_NL, IQ4_XS) are exact at the codes' bounds") {
  REQUIRE(has_level(SimdLevel::kAvx2));
  const cpu::MatmulKernels& mk = *cpu::matmul_kernels_for(SimdLevel::kAvx2);
  const int64_t k = 512;
  const int na = cpu::kMaxNa;
  std::vector<float> xf(static_cast<size_t>(k * na));  // +-1 everywhere, then mixed signs
  for (int j = 0; j < na; ++j)
    for (int64_t e = 0; e < k; ++e)
      xf[static_cast<size_t>(j * k + e)] = j == 0 ? 1.f : j == 1 ? -1.f : ((e / (j + 1)) % 2 == 0 ? 1.f : -1.f);
  const std::vector<uint8_t> at = tile_acts(mk, xf, k, na, false);
  const size_t ab = cpu::act_row_bytes(cpu::ActFormat::kQ8, k);
  int checked = 0;
  for (DType t : kAvx2SignedTileTypes) {
    const cpu::TileKernels tk = cpu::tile_kernels(&mk, t);
    REQUIRE(tk.kind == cpu::TileKernels::k32Signed);
    for (bool high : {true, false})
      for (int nrows : {8, 3}) {
        const std::vector<uint8_t> wb = extreme_signed_rows(t, k, nrows, high);
        const size_t rb = wb.size() / static_cast<size_t>(nrows);
        const uint8_t* rows[cpu::kTileRows];
        for (int r = 0; r < nrows; ++r) rows[r] = wb.data() + rb * static_cast<size_t>(r);
        std::vector<uint8_t> tile(static_cast<size_t>(k / 32) * tk.block_bytes);
        tk.pack(rows, nrows, k, tile.data());
        std::vector<float> got(static_cast<size_t>(na) * cpu::kTileRows);
        tk.dot[na - 1](k, tile.data(), at.data(), ab, got.data());
        std::vector<float> gemm(static_cast<size_t>(na) * cpu::kTileRows);
        mk.gemm8[static_cast<size_t>(t)](rows, nrows, k, at.data(), ab, na, gemm.data());
        const std::vector<double> ref = reference(t, wb, nrows, k, at, na);
        INFO(quant::find_traits(t)->name, high ? " codes high" : " codes low", " rows ", nrows);
        CHECK(std::fabs(ref[0]) > 100.0 * static_cast<double>(k));  // (the bounds were reached)
        CHECK(max_rel_err(got, ref, nrows, na) < 1e-6);
        CHECK(max_rel_err(gemm, ref, nrows, na) < 1e-6);
        ++checked;
      }
  }
  CHECK(checked == 3 * 4);
}

// Tile products and gemm8 of two levels on the same weights and activation bytes, compared bit
// for bit (and checked against the double reference) for the given types.
void check_same_tiles(SimdLevel la, SimdLevel lb, const std::vector<DType>& types, uint32_t seed) {
  const cpu::MatmulKernels& a_mk = *cpu::matmul_kernels_for(la);
  const cpu::MatmulKernels& b_mk = *cpu::matmul_kernels_for(lb);
  const int64_t k = 768;  // 3 super-blocks, 24 blocks of 32
  const int na = cpu::kGemmMaxNa;
  const std::vector<float> xf = randn(static_cast<size_t>(k * na), seed, 2.f);
  int checked = 0;
  for (DType t : types) {
    // The same activation bytes for both levels (their quantizers agree; checked elsewhere).
    const std::vector<uint8_t> at = tile_acts(a_mk, xf, k, na, is_t16(t));
    for (int nrows : {8, 5}) {
      const std::vector<uint8_t> wb = encode(t, randn(static_cast<size_t>(k * nrows), ++seed), nrows, k);
      for (int n : {1, 3, 4, 8}) {
        const TileResults a = run_tiles(a_mk, t, wb, nrows, k, at, n);
        const TileResults b = run_tiles(b_mk, t, wb, nrows, k, at, n);
        INFO(cpu::simd_level_name(la), " vs ", cpu::simd_level_name(lb), " ", quant::find_traits(t)->name, " rows ",
             nrows, " na ", n);
        CHECK(same_bits(a.tile, b.tile, nrows, n));
        CHECK(same_bits(a.gemm, b.gemm, nrows, n));
        // And both are right (not merely equal).
        CHECK(max_rel_err(a.tile, reference(t, wb, nrows, k, at, n), nrows, n) < 1e-4);
        ++checked;
      }
    }
  }
  CHECK(checked == 8 * static_cast<int>(types.size()));
}

TEST_CASE("ops avx2: tiles and gemm8 give the VNNI levels' results bit for bit") {
  REQUIRE(has_level(SimdLevel::kAvx2));
  int levels = 0;
  for (SimdLevel l : {SimdLevel::kAvxVnni, SimdLevel::kAvx512}) {
    if (!has_level(l)) continue;
    check_same_tiles(SimdLevel::kAvx2, l, std::vector<DType>(std::begin(kAvx2TileTypes), std::end(kAvx2TileTypes)),
                     611);
    ++levels;
  }
  if (levels == 0) MESSAGE("no VNNI on this CPU: the AVX2 tiles are checked against the reference only");
}

// The AVX-VNNI level (Intel client CPUs without AVX-512): the AVX2 level's 256-bit kernels with
// vpdpbusd, so also tiles for the types past maddubs' range, and none of the 512-bit kernels.
TEST_CASE("ops avxvnni: tiles and gemm8 for every 32-element type, no 512-bit kernels") {
  if (!has_level(SimdLevel::kAvxVnni)) {
    MESSAGE("no AVX-VNNI on this CPU: its level is not checked");
    return;
  }
  const cpu::MatmulKernels& mk = *cpu::matmul_kernels_for(SimdLevel::kAvxVnni);
  int tiled = 0;
  for (DType t : kQuantTypes) {
    const auto id = static_cast<size_t>(t);
    INFO(quant::find_traits(t)->name);
    const bool tile = mk.tile_pack[id] != nullptr || mk.tile16_pack[id] != nullptr;
    CHECK(tile == (mk.gemm8[id] != nullptr));
    tiled += tile ? 1 : 0;
    CHECK((mk.wgemm[id] == nullptr));
    CHECK((mk.wtile_pack[id] == nullptr));
    // The 256-bit one-row kernels on kQ8G activations (IQ4_NL's needs vpdpbusd).
    CHECK(((mk.gemv[id] != nullptr) == (t == DType::Q4_0 || t == DType::IQ4_NL)));
  }
  CHECK(tiled == 11);
  for (DType t : {DType::Q8_0, DType::IQ4_NL, DType::IQ4_XS})
    CHECK((mk.tile_pack[static_cast<size_t>(t)] != nullptr));
  CHECK((mk.tile_dot8 == nullptr));
  CHECK((mk.tile16_dot8 == nullptr));
}

TEST_CASE("ops avxvnni: the types past maddubs' range tile like the AVX-512 level, bit for bit") {
  if (!has_level(SimdLevel::kAvxVnni) || !has_level(SimdLevel::kAvx512)) {
    MESSAGE("this CPU lacks AVX-VNNI or AVX-512: the two VNNI levels are not compared");
    return;
  }
  // The same 256-bit vpdpbusd (VEX and EVEX encodings) on the same sources.
  check_same_tiles(SimdLevel::kAvxVnni, SimdLevel::kAvx512, {DType::Q8_0, DType::IQ4_NL, DType::IQ4_XS}, 640);
}

TEST_CASE("ops avx2: mul_mat at prefill row counts, every level") {
  // Past gemm8's rows: the packed tiles, 4 activation rows a call at the AVX2 level with a
  // partial last call (n % 4 != 0), a partial last tile (m % 8 != 0); Q6_K/Q3_K: the per-row
  // dots at 24 rows, the tiles from 32 (at the VNNI level wgemm takes both).
  uint32_t seed = 700;
  for (DType t : kAvx2TileTypes) {
    const int64_t k = quant::find_traits(t)->block_size == 256 ? 512 : 288;
    for (int64_t n : {24, 70, 130}) check_mul_mat(t, k, 37, n, 1, false, seed++);
  }
  // Q2_K's tiles with mins at every x86 level: the dots below 32 rows, the tiles from there (8 rows
  // a call at the AVX-512 level, a partial last call and tile).
  for (int64_t n : {24, 40, 130}) check_mul_mat(DType::Q2_K, 512, 37, n, 1, false, seed++);
  // The signed-code types: the per-row dots at 4 rows, gemm8 at 6 and 16, the dots at 24, the
  // tiles from 32 (at the VNNI levels their unsigned tiles and gemm8).
  for (DType t : kAvx2SignedTileTypes)
    for (int64_t n : {4, 6, 16, 24, 40, 130}) check_mul_mat(t, 256, 21, n, 1, false, seed++);
}

}  // namespace
}  // namespace kite

#endif  // __x86_64__

// K-quants: 256-element super-blocks Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, and the Q8_K activation type.
//
// The quantizers share the two-level searches of superblock.h (affine for Q2_K/Q4_K/Q5_K,
// symmetric for Q3_K/Q6_K); this file holds the formats' constants, bit packing and the
// dequantization formulas.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "formats/quant/blocks.h"
#include "formats/quant/fit.h"
#include "formats/quant/ref.h"
#include "formats/quant/superblock.h"
#include "src/base/half.h"

namespace kite::quant::ref {
namespace {

// 2-bit codes of 256 elements: element 128c + 32k + l goes to bits 2k of qs[32c + l].
void pack_2bit(const uint8_t* q, uint8_t* qs) {
  for (int c = 0; c < 2; ++c)
    for (int l = 0; l < 32; ++l) {
      const uint8_t* e = q + 128 * c + l;
      qs[32 * c + l] = static_cast<uint8_t>((e[0] & 3) | ((e[32] & 3) << 2) | ((e[64] & 3) << 4) |
                                            ((e[96] & 3) << 6));
    }
}

// 4-bit codes of 256 elements: element 64p + l (l < 32) in the low nibble of qs[32p + l],
// element 64p + 32 + l in its high nibble.
void pack_4bit_pairs(const uint8_t* q, uint8_t* qs) {
  for (int p = 0; p < 4; ++p)
    for (int l = 0; l < 32; ++l)
      qs[32 * p + l] = static_cast<uint8_t>((q[64 * p + l] & 0xF) | ((q[64 * p + 32 + l] & 0xF) << 4));
}

}  // namespace

// --- Q2_K ----------------------------------------------------------------------------------

void dequantize_q2_k(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ2_K*>(src);
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float d = fp16_to_fp32(b[i].d), dmin = fp16_to_fp32(b[i].dmin);
    for (int e = 0; e < kQK_K; ++e) {
      const int s = e / 16, c = e / 128, shift = 2 * ((e % 128) / 32), l = e % 32;
      const int q = (b[i].qs[32 * c + l] >> shift) & 3;
      const float dl = d * static_cast<float>(b[i].scales[s] & 0xF);   // sub-block scale
      const float ml = dmin * static_cast<float>(b[i].scales[s] >> 4);  // sub-block min
      *dst++ = dl * static_cast<float>(q) - ml;
    }
  }
}

void quantize_q2_k(const float* src, void* dst, int64_t n) { quantize_q2_k_w(src, dst, n, nullptr); }

void quantize_q2_k_w(const float* src, void* dst, int64_t n, const float* w) {
  auto* b = static_cast<BlockQ2_K*>(dst);
  static const fit::Grid codes = fit::uniform_grid(0, 15);
  const AffineSpec spec{16, 16, 3, 15, &codes};
  for (int64_t i = 0; i < n / kQK_K; ++i, src += kQK_K, w = w ? w + kQK_K : nullptr) {
    AffineCodes c;
    quantize_affine_superblock(src, w, spec, &c);
    b[i].d = c.d;
    b[i].dmin = c.dmin;
    for (int s = 0; s < 16; ++s) b[i].scales[s] = static_cast<uint8_t>(c.sc[s] | (c.mc[s] << 4));
    pack_2bit(c.q, b[i].qs);
  }
}

// --- Q3_K ----------------------------------------------------------------------------------

void dequantize_q3_k(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ3_K*>(src);
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float d = fp16_to_fp32(b[i].d);
    int8_t sc[16];
    unpack_q3_k_scales(b[i].scales, sc);
    for (int e = 0; e < kQK_K; ++e) {
      const int c = e / 128, shift = 2 * ((e % 128) / 32), l = e % 32;
      const int low = (b[i].qs[32 * c + l] >> shift) & 3;
      const int high = (b[i].hmask[e % 32] >> (e / 32)) & 1;  // 1: add 4 to the low bits
      const float dl = d * static_cast<float>(sc[e / 16]);
      *dst++ = dl * static_cast<float>(low - (high ? 0 : 4));
    }
  }
}

void quantize_q3_k(const float* src, void* dst, int64_t n) { quantize_q3_k_w(src, dst, n, nullptr); }

void quantize_q3_k_w(const float* src, void* dst, int64_t n, const float* w) {
  auto* b = static_cast<BlockQ3_K*>(dst);
  static const fit::Grid grid = fit::uniform_grid(-4, 3), codes = fit::uniform_grid(-32, 31);
  const SymmetricSpec spec{16, 16, &grid, -32, 31, &codes};
  for (int64_t i = 0; i < n / kQK_K; ++i, src += kQK_K, w = w ? w + kQK_K : nullptr) {
    SymmetricCodes c;
    quantize_symmetric_superblock(src, w, spec, &c);
    b[i].d = c.d;
    int8_t sc[16];
    for (int s = 0; s < 16; ++s) sc[s] = static_cast<int8_t>(c.sc[s]);
    pack_q3_k_scales(sc, b[i].scales);
    // Code q = grid index (value q - 4): bit 2 to hmask, low 2 bits to qs.
    uint8_t low[kQK_K];
    std::memset(b[i].hmask, 0, sizeof(b[i].hmask));
    for (int e = 0; e < kQK_K; ++e) {
      if (c.q[e] > 3) b[i].hmask[e % 32] |= static_cast<uint8_t>(1 << (e / 32));
      low[e] = c.q[e] & 3;
    }
    pack_2bit(low, b[i].qs);
  }
}

// --- Q4_K ----------------------------------------------------------------------------------

void dequantize_q4_k(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ4_K*>(src);
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float d = fp16_to_fp32(b[i].d), dmin = fp16_to_fp32(b[i].dmin);
    for (int s = 0; s < 8; ++s) {  // sub-block s: elements 32s .. 32s+31
      uint8_t sc, mc;
      unpack_q4_k_scale_min(s, b[i].scales, &sc, &mc);
      const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(mc);
      const uint8_t* qs = b[i].qs + 32 * (s / 2);
      const int shift = 4 * (s % 2);  // even sub-blocks in low nibbles, odd in high
      for (int l = 0; l < 32; ++l) *dst++ = d1 * static_cast<float>((qs[l] >> shift) & 0xF) - m1;
    }
  }
}

void quantize_q4_k(const float* src, void* dst, int64_t n) { quantize_q4_k_w(src, dst, n, nullptr); }

void quantize_q4_k_w(const float* src, void* dst, int64_t n, const float* w) {
  auto* b = static_cast<BlockQ4_K*>(dst);
  static const fit::Grid codes = fit::uniform_grid(0, 63);
  const AffineSpec spec{8, 32, 15, 63, &codes};
  for (int64_t i = 0; i < n / kQK_K; ++i, src += kQK_K, w = w ? w + kQK_K : nullptr) {
    AffineCodes c;
    quantize_affine_superblock(src, w, spec, &c);
    b[i].d = c.d;
    b[i].dmin = c.dmin;
    pack_q4_k_scale_min(c.sc, c.mc, b[i].scales);
    pack_4bit_pairs(c.q, b[i].qs);
  }
}

// --- Q5_K ----------------------------------------------------------------------------------

void dequantize_q5_k(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ5_K*>(src);
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float d = fp16_to_fp32(b[i].d), dmin = fp16_to_fp32(b[i].dmin);
    for (int s = 0; s < 8; ++s) {
      uint8_t sc, mc;
      unpack_q4_k_scale_min(s, b[i].scales, &sc, &mc);
      const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(mc);
      const uint8_t* qs = b[i].qs + 32 * (s / 2);
      const int shift = 4 * (s % 2);
      for (int l = 0; l < 32; ++l) {
        const int q = ((qs[l] >> shift) & 0xF) + (((b[i].qh[l] >> s) & 1) ? 16 : 0);  // 5th bit
        *dst++ = d1 * static_cast<float>(q) - m1;
      }
    }
  }
}

void quantize_q5_k(const float* src, void* dst, int64_t n) { quantize_q5_k_w(src, dst, n, nullptr); }

void quantize_q5_k_w(const float* src, void* dst, int64_t n, const float* w) {
  auto* b = static_cast<BlockQ5_K*>(dst);
  static const fit::Grid codes = fit::uniform_grid(0, 63);
  const AffineSpec spec{8, 32, 31, 63, &codes};
  for (int64_t i = 0; i < n / kQK_K; ++i, src += kQK_K, w = w ? w + kQK_K : nullptr) {
    AffineCodes c;
    quantize_affine_superblock(src, w, spec, &c);
    b[i].d = c.d;
    b[i].dmin = c.dmin;
    pack_q4_k_scale_min(c.sc, c.mc, b[i].scales);
    // Bit 4 of element 32s + l goes to bit s of qh[l]; the low 4 bits as in Q4_K.
    std::memset(b[i].qh, 0, sizeof(b[i].qh));
    for (int e = 0; e < kQK_K; ++e)
      b[i].qh[e % 32] |= static_cast<uint8_t>(((c.q[e] >> 4) & 1) << (e / 32));
    pack_4bit_pairs(c.q, b[i].qs);
  }
}

// --- Q6_K ----------------------------------------------------------------------------------

void dequantize_q6_k(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ6_K*>(src);
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float d = fp16_to_fp32(b[i].d);
    for (int e = 0; e < kQK_K; ++e) {
      const int c = e / 128, k = (e % 128) / 32, l = e % 32;
      const int low = (b[i].ql[64 * c + 32 * (k & 1) + l] >> (4 * (k >> 1))) & 0xF;
      const int high = (b[i].qh[32 * c + l] >> (2 * k)) & 3;
      const int q = (low | (high << 4)) - 32;
      *dst++ = d * static_cast<float>(b[i].scales[e / 16]) * static_cast<float>(q);
    }
  }
}

void quantize_q6_k(const float* src, void* dst, int64_t n) { quantize_q6_k_w(src, dst, n, nullptr); }

void quantize_q6_k_w(const float* src, void* dst, int64_t n, const float* w) {
  auto* b = static_cast<BlockQ6_K*>(dst);
  static const fit::Grid grid = fit::uniform_grid(-32, 31), codes = fit::uniform_grid(-128, 127);
  const SymmetricSpec spec{16, 16, &grid, -128, 127, &codes};
  for (int64_t i = 0; i < n / kQK_K; ++i, src += kQK_K, w = w ? w + kQK_K : nullptr) {
    SymmetricCodes c;
    quantize_symmetric_superblock(src, w, spec, &c);
    b[i].d = c.d;
    for (int s = 0; s < 16; ++s) b[i].scales[s] = static_cast<int8_t>(c.sc[s]);
    // Code q (0..63): low 4 bits to ql, high 2 bits to qh, in the layout of dequantize_q6_k.
    std::memset(b[i].ql, 0, sizeof(b[i].ql));
    std::memset(b[i].qh, 0, sizeof(b[i].qh));
    for (int e = 0; e < kQK_K; ++e) {
      const int c6 = e / 128, k = (e % 128) / 32, l = e % 32;
      b[i].ql[64 * c6 + 32 * (k & 1) + l] |= static_cast<uint8_t>((c.q[e] & 0xF) << (4 * (k >> 1)));
      b[i].qh[32 * c6 + l] |= static_cast<uint8_t>((c.q[e] >> 4) << (2 * k));
    }
  }
}

// --- Q8_K ----------------------------------------------------------------------------------

void dequantize_q8_k(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ8_K*>(src);
  for (int64_t i = 0; i < n / kQK_K; ++i)
    for (int j = 0; j < kQK_K; ++j) *dst++ = b[i].d * static_cast<float>(b[i].qs[j]);
}

// The element of largest magnitude maps to -127 (d = max / -127, may be negative), q =
// round(x / d) to nearest even via the inverse scale, as ggml; bsums for the dot products.
void quantize_q8_k(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ8_K*>(dst);
  for (int64_t i = 0; i < n / kQK_K; ++i, src += kQK_K) {
    float amax = 0, max = 0;
    for (int j = 0; j < kQK_K; ++j)
      if (std::fabs(src[j]) > amax) {
        amax = std::fabs(src[j]);
        max = src[j];
      }
    std::memset(&b[i], 0, sizeof(b[i]));
    if (amax == 0) continue;
    const float iscale = -127.0f / max;
    for (int j = 0; j < kQK_K; ++j)
      b[i].qs[j] = static_cast<int8_t>(std::min(127.0f, std::nearbyint(iscale * src[j])));
    for (int g = 0; g < kQK_K / 16; ++g) {
      int sum = 0;
      for (int j = 0; j < 16; ++j) sum += b[i].qs[16 * g + j];
      b[i].bsums[g] = static_cast<int16_t>(sum);
    }
    b[i].d = 1 / iscale;
  }
}

}  // namespace kite::quant::ref

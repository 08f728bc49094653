// Legacy 32-element block types: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1.
//
// Quantizers: Q4_0/Q5_0 use the exact scale sweep (fit_grid_scale), Q4_1/Q5_1 the multi-start
// affine fit; both minimize the block's squared error and then settle the half-precision fields.
// Q8_0/Q8_1 use the plain "largest magnitude -> 127" rule: they are also the activation types the
// dot-product kernels quantize on the fly, which must reproduce this reference exactly.
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

// Packs 32 4-bit codes: element j in the low nibble of qs[j], element j+16 in the high one.
void pack_nibbles(const uint8_t* q, uint8_t* qs) {
  for (int j = 0; j < 16; ++j) qs[j] = static_cast<uint8_t>((q[j] & 0xF) | ((q[j + 16] & 0xF) << 4));
}

// Bit 4 of each of 32 codes, element j -> bit j (little-endian uint32).
void pack_high_bits(const uint8_t* q, uint8_t* qh) {
  uint32_t bits = 0;
  for (int j = 0; j < 32; ++j) bits |= static_cast<uint32_t>((q[j] >> 4) & 1) << j;
  for (int b = 0; b < 4; ++b) qh[b] = static_cast<uint8_t>(bits >> (8 * b));
}

// Code j (0..31) of a Q5 block.
int q5_code(const uint8_t* qs, const uint8_t* qh, int j) {
  const uint32_t bits = qh[0] | (qh[1] << 8) | (qh[2] << 16) | (static_cast<uint32_t>(qh[3]) << 24);
  const int low = j < 16 ? (qs[j] & 0xF) : (qs[j - 16] >> 4);
  return low | static_cast<int>(((bits >> j) & 1) << 4);
}

// Scale-only block (Q4_0, Q5_0): y = (q - offset) * d. Writes the codes; returns the half bits.
uint16_t quantize_scale_block(const float* x, const float* w, int bits, uint8_t* q) {
  static const fit::Grid g4 = fit::uniform_grid(-8, 7), g5 = fit::uniform_grid(-16, 15);
  const fit::Grid& g = bits == 4 ? g4 : g5;
  uint8_t idx[32];
  const float d = fit::fit_grid_scale(x, w, 32, g, idx, window_for(g));
  const uint16_t h = finalize_half_scale(x, w, 32, g, d, idx);
  std::copy(idx, idx + 32, q);  // grid index k is the code (value k - offset)
  return h;
}

// Affine block (Q4_1, Q5_1): y = q * d + m, q in 0..qmax. Writes codes and the half fields.
void quantize_affine_block(const float* x, const float* w, int qmax, uint8_t* q, uint16_t* d_out, uint16_t* m_out) {
  const fit::AffineFit f = fit::fit_affine(x, w, 32, qmax, false, q);
  float s = f.scale, o = f.offset;
  double best = INFINITY;
  uint8_t cur[32];
  for (int attempt = 0; attempt < 2; ++attempt) {
    const uint16_t dh = fp32_to_fp16(s), mh = fp32_to_fp16(o);
    const float d = fp16_to_fp32(dh), m = fp16_to_fp32(mh);
    // Re-round for the stored fields and score with the dequantization formula.
    double err = 0, sw = 0, sq = 0, sq2 = 0, sx = 0, sxq = 0;
    for (int i = 0; i < 32; ++i) {
      cur[i] = d > 0 ? static_cast<uint8_t>(fit::round_clamp((x[i] - m) / d, 0, qmax)) : 0;
      const double e = static_cast<double>(x[i]) - static_cast<double>(cur[i] * d + m);
      const double wi = w ? w[i] : 1.0;
      err += wi * e * e;
      sw += wi;
      sq += wi * cur[i];
      sq2 += wi * cur[i] * cur[i];
      sx += wi * x[i];
      sxq += wi * x[i] * cur[i];
    }
    if (err < best) {
      best = err;
      *d_out = dh;
      *m_out = mh;
      std::copy(cur, cur + 32, q);
    }
    // Least-squares refit of (d, m) for these codes, for the second attempt.
    const double det = sw * sq2 - sq * sq;
    if (!(det > 1e-12 * sw * sq2)) break;
    const double sd = (sw * sxq - sx * sq) / det;
    s = static_cast<float>(sd);
    o = static_cast<float>((sx - sd * sq) / sw);
  }
}

}  // namespace

// --- Q4_0 ----------------------------------------------------------------------------------

void dequantize_q4_0(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ4_0*>(src);
  for (int64_t i = 0; i < n / kQK4_0; ++i, dst += kQK4_0) {
    const float d = fp16_to_fp32(b[i].d);
    for (int j = 0; j < 16; ++j) {
      dst[j] = static_cast<float>((b[i].qs[j] & 0xF) - 8) * d;
      dst[j + 16] = static_cast<float>((b[i].qs[j] >> 4) - 8) * d;
    }
  }
}

void quantize_q4_0(const float* src, void* dst, int64_t n) { quantize_q4_0_w(src, dst, n, nullptr); }

void quantize_q4_0_w(const float* src, void* dst, int64_t n, const float* w) {
  auto* b = static_cast<BlockQ4_0*>(dst);
  for (int64_t i = 0; i < n / kQK4_0; ++i, src += kQK4_0, w = w ? w + kQK4_0 : nullptr) {
    uint8_t q[32];
    b[i].d = quantize_scale_block(src, w, 4, q);
    pack_nibbles(q, b[i].qs);
  }
}

// --- Q4_1 ----------------------------------------------------------------------------------

void dequantize_q4_1(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ4_1*>(src);
  for (int64_t i = 0; i < n / kQK4_1; ++i, dst += kQK4_1) {
    const float d = fp16_to_fp32(b[i].d), m = fp16_to_fp32(b[i].m);
    for (int j = 0; j < 16; ++j) {
      dst[j] = static_cast<float>(b[i].qs[j] & 0xF) * d + m;
      dst[j + 16] = static_cast<float>(b[i].qs[j] >> 4) * d + m;
    }
  }
}

void quantize_q4_1(const float* src, void* dst, int64_t n) { quantize_q4_1_w(src, dst, n, nullptr); }

void quantize_q4_1_w(const float* src, void* dst, int64_t n, const float* w) {
  auto* b = static_cast<BlockQ4_1*>(dst);
  for (int64_t i = 0; i < n / kQK4_1; ++i, src += kQK4_1, w = w ? w + kQK4_1 : nullptr) {
    uint8_t q[32];
    quantize_affine_block(src, w, 15, q, &b[i].d, &b[i].m);
    pack_nibbles(q, b[i].qs);
  }
}

// --- Q5_0 ----------------------------------------------------------------------------------

void dequantize_q5_0(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ5_0*>(src);
  for (int64_t i = 0; i < n / kQK5_0; ++i, dst += kQK5_0) {
    const float d = fp16_to_fp32(b[i].d);
    for (int j = 0; j < 32; ++j) dst[j] = static_cast<float>(q5_code(b[i].qs, b[i].qh, j) - 16) * d;
  }
}

void quantize_q5_0(const float* src, void* dst, int64_t n) { quantize_q5_0_w(src, dst, n, nullptr); }

void quantize_q5_0_w(const float* src, void* dst, int64_t n, const float* w) {
  auto* b = static_cast<BlockQ5_0*>(dst);
  for (int64_t i = 0; i < n / kQK5_0; ++i, src += kQK5_0, w = w ? w + kQK5_0 : nullptr) {
    uint8_t q[32];
    b[i].d = quantize_scale_block(src, w, 5, q);
    pack_nibbles(q, b[i].qs);
    pack_high_bits(q, b[i].qh);
  }
}

// --- Q5_1 ----------------------------------------------------------------------------------

void dequantize_q5_1(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ5_1*>(src);
  for (int64_t i = 0; i < n / kQK5_1; ++i, dst += kQK5_1) {
    const float d = fp16_to_fp32(b[i].d), m = fp16_to_fp32(b[i].m);
    for (int j = 0; j < 32; ++j) dst[j] = static_cast<float>(q5_code(b[i].qs, b[i].qh, j)) * d + m;
  }
}

void quantize_q5_1(const float* src, void* dst, int64_t n) { quantize_q5_1_w(src, dst, n, nullptr); }

void quantize_q5_1_w(const float* src, void* dst, int64_t n, const float* w) {
  auto* b = static_cast<BlockQ5_1*>(dst);
  for (int64_t i = 0; i < n / kQK5_1; ++i, src += kQK5_1, w = w ? w + kQK5_1 : nullptr) {
    uint8_t q[32];
    quantize_affine_block(src, w, 31, q, &b[i].d, &b[i].m);
    pack_nibbles(q, b[i].qs);
    pack_high_bits(q, b[i].qh);
  }
}

// --- Q8_0 ----------------------------------------------------------------------------------

void dequantize_q8_0(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ8_0*>(src);
  for (int64_t i = 0; i < n / kQK8_0; ++i, dst += kQK8_0) {
    const float d = fp16_to_fp32(b[i].d);
    for (int j = 0; j < 32; ++j) dst[j] = static_cast<float>(b[i].qs[j]) * d;
  }
}

// d = max|x| / 127, q = round(x / d) (halves away from zero), computed with 1/d as ggml does.
void quantize_q8_0(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ8_0*>(dst);
  for (int64_t i = 0; i < n / kQK8_0; ++i, src += kQK8_0) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(src[j]));
    const float d = amax / 127;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    b[i].d = fp32_to_fp16(d);
    for (int j = 0; j < 32; ++j) b[i].qs[j] = static_cast<int8_t>(std::round(src[j] * id));
  }
}

// --- Q8_1 ----------------------------------------------------------------------------------

void dequantize_q8_1(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ8_1*>(src);
  for (int64_t i = 0; i < n / kQK8_1; ++i, dst += kQK8_1) {
    const float d = fp16_to_fp32(b[i].d);
    for (int j = 0; j < 32; ++j) dst[j] = static_cast<float>(b[i].qs[j]) * d;
  }
}

// As Q8_0, plus s = d * sum(q) (with the float d, before it is rounded to half).
void quantize_q8_1(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ8_1*>(dst);
  for (int64_t i = 0; i < n / kQK8_1; ++i, src += kQK8_1) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(src[j]));
    const float d = amax / 127;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    int sum = 0;
    for (int j = 0; j < 32; ++j) {
      b[i].qs[j] = static_cast<int8_t>(std::round(src[j] * id));
      sum += b[i].qs[j];
    }
    b[i].d = fp32_to_fp16(d);
    b[i].s = fp32_to_fp16(static_cast<float>(sum) * d);
  }
}

}  // namespace kite::quant::ref

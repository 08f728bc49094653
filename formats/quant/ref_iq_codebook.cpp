// The codebook types IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS and IQ3_S: decoding only (kite
// runs files that llama.cpp quantized to them; it has no quantizer for them).
#include <cstring>

#include "formats/quant/iq_grids.h"
#include "formats/quant/ref.h"
#include "src/base/half.h"

namespace kite::quant {
namespace {

// 8 elements of group point `p` (bytes) with sign bits `signs` into q.
void put8(uint64_t p, uint8_t signs, int8_t* q) {
  for (int j = 0; j < 8; ++j) {
    const auto g = static_cast<int8_t>(p >> (8 * j) & 0xff);
    q[j] = static_cast<int8_t>(signs >> j & 1 ? -g : g);
  }
}

uint16_t word(const uint8_t* p) {
  uint16_t w;
  std::memcpy(&w, p, 2);
  return w;
}

// IQ1: point p (int8 -1/0/1 bytes) plus delta (+-1/8), times 8.
void put8_iq1(uint64_t p, bool minus, int8_t* q) {
  for (int j = 0; j < 8; ++j) q[j] = static_cast<int8_t>(8 * static_cast<int8_t>(p >> (8 * j) & 0xff) + (minus ? -1 : 1));
}

}  // namespace

float iq_sub(const BlockIQ2_XXS& b, int s, IqSub* out) {
  uint32_t aux[2];
  std::memcpy(aux, b.qs + 4 * s, sizeof aux);
  const IqGrids& g = iq_grids();
  for (int l = 0; l < 4; ++l) put8(g.iq2xxs[aux[0] >> (8 * l) & 0xff], iq_signs8(aux[1] >> (7 * l)), out->q + 8 * l);
  out->scale[0] = out->scale[1] = 1 + 2 * static_cast<int32_t>(aux[1] >> 28);
  return fp16_to_fp32(b.d) * 0.125f;
}

float iq_sub(const BlockIQ2_XS& b, int s, IqSub* out) {
  const IqGrids& g = iq_grids();
  for (int l = 0; l < 4; ++l) {
    const uint16_t v = b.qs[4 * s + l];
    put8(g.iq2xs[v & 511], iq_signs8(v >> 9), out->q + 8 * l);
  }
  out->scale[0] = 1 + 2 * (b.scales[s] & 0xf), out->scale[1] = 1 + 2 * (b.scales[s] >> 4);
  return fp16_to_fp32(b.d) * 0.125f;
}

float iq_sub(const BlockIQ2_S& b, int s, IqSub* out) {
  const IqGrids& g = iq_grids();
  for (int l = 0; l < 4; ++l) {
    const int idx = b.qs[4 * s + l] | (b.qh[s] >> (2 * l) & 3) << 8;
    put8(g.iq2s[idx], b.qs[kQK_K / 8 + 4 * s + l], out->q + 8 * l);
  }
  out->scale[0] = 1 + 2 * (b.scales[s] & 0xf), out->scale[1] = 1 + 2 * (b.scales[s] >> 4);
  return fp16_to_fp32(b.d) * 0.125f;
}

float iq_sub(const BlockIQ3_XXS& b, int s, IqSub* out) {
  uint32_t aux;
  std::memcpy(&aux, b.qs + kQK_K / 4 + 4 * s, sizeof aux);
  const IqGrids& g = iq_grids();
  for (int l = 0; l < 4; ++l) {
    const uint64_t p = g.iq3xxs[b.qs[8 * s + 2 * l]] | uint64_t{g.iq3xxs[b.qs[8 * s + 2 * l + 1]]} << 32;
    put8(p, iq_signs8(aux >> (7 * l)), out->q + 8 * l);
  }
  out->scale[0] = out->scale[1] = 1 + 2 * static_cast<int32_t>(aux >> 28);
  return fp16_to_fp32(b.d) * 0.25f;
}

float iq_sub(const BlockIQ3_S& b, int s, IqSub* out) {
  const IqGrids& g = iq_grids();
  for (int l = 0; l < 4; ++l) {
    const int i0 = 8 * s + 2 * l, i1 = i0 + 1;
    const uint64_t p = g.iq3s[b.qs[i0] | (b.qh[s] >> (i0 % 8) & 1) << 8] |
                       uint64_t{g.iq3s[b.qs[i1] | (b.qh[s] >> (i1 % 8) & 1) << 8]} << 32;
    put8(p, b.signs[4 * s + l], out->q + 8 * l);
  }
  out->scale[0] = out->scale[1] = 1 + 2 * (b.scales[s / 2] >> (4 * (s % 2)) & 0xf);
  return fp16_to_fp32(b.d);
}

float iq_sub(const BlockIQ1_S& b, int s, IqSub* out) {
  const IqGrids& g = iq_grids();
  const uint16_t qh = b.qh[s];
  for (int l = 0; l < 4; ++l) put8_iq1(g.iq1s[b.qs[4 * s + l] | (qh >> (3 * l) & 7) << 8], qh >> 15, out->q + 8 * l);
  out->scale[0] = out->scale[1] = 1 + 2 * (qh >> 12 & 7);
  return fp16_to_fp32(b.d) * 0.125f;
}

uint16_t iq1_m_d(const BlockIQ1_M& b) {
  uint16_t d = 0;
  for (int w = 0; w < 4; ++w) d |= static_cast<uint16_t>((word(b.scales + 2 * w) >> 12) << (4 * w));
  return d;
}

float iq_sub(const BlockIQ1_M& b, int s, IqSub* out) {
  const IqGrids& g = iq_grids();
  for (int l = 0; l < 4; ++l) {
    const int nib = b.qh[2 * s + l / 2] >> (4 * (l % 2)) & 0xf;
    put8_iq1(g.iq1s[b.qs[4 * s + l] | (nib & 7) << 8], (nib & 8) != 0, out->q + 8 * l);
  }
  const uint16_t sc = word(b.scales + 2 * (s / 2));
  out->scale[0] = 1 + 2 * (sc >> (6 * (s % 2)) & 7), out->scale[1] = 1 + 2 * (sc >> (6 * (s % 2) + 3) & 7);
  return fp16_to_fp32(iq1_m_d(b)) * 0.125f;
}

namespace ref {
namespace {

template <typename Block>
void dequantize_codebook(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const Block*>(src);
  IqSub sub;
  for (int64_t i = 0; i < n / kQK_K; ++i)
    for (int s = 0; s < kQK_K / 32; ++s, dst += 32) {
      const float d = iq_sub(b[i], s, &sub);
      for (int j = 0; j < 32; ++j) dst[j] = d * static_cast<float>(sub.scale[j / 16]) * static_cast<float>(sub.q[j]);
    }
}

}  // namespace

void dequantize_iq2_xxs(const void* src, float* dst, int64_t n) { dequantize_codebook<BlockIQ2_XXS>(src, dst, n); }
void dequantize_iq2_xs(const void* src, float* dst, int64_t n) { dequantize_codebook<BlockIQ2_XS>(src, dst, n); }
void dequantize_iq2_s(const void* src, float* dst, int64_t n) { dequantize_codebook<BlockIQ2_S>(src, dst, n); }
void dequantize_iq3_xxs(const void* src, float* dst, int64_t n) { dequantize_codebook<BlockIQ3_XXS>(src, dst, n); }
void dequantize_iq3_s(const void* src, float* dst, int64_t n) { dequantize_codebook<BlockIQ3_S>(src, dst, n); }
void dequantize_iq1_s(const void* src, float* dst, int64_t n) { dequantize_codebook<BlockIQ1_S>(src, dst, n); }
void dequantize_iq1_m(const void* src, float* dst, int64_t n) { dequantize_codebook<BlockIQ1_M>(src, dst, n); }

}  // namespace ref
}  // namespace kite::quant

// kite/formats/quant/iq_grids.h — the codebooks of the IQ1_S..IQ3_S types (blocks.h).
//
// Each codebook is a fixed list of points: 8 coordinates on the levels {8, 25, 43} (IQ2_*), or
// {-1, 0, 1} (IQ1_*), or 4 coordinates on 8 levels (IQ3_*). Entry i of a table holds point i's
// coordinates as bytes, coordinate 0 in the lowest byte, exactly as ggml's iq*_grid tables do
// (a block's index means the same point in both).
#pragma once

#include <cstdint>

#include "formats/quant/blocks.h"
#include "formats/quant/types.h"

namespace kite::quant {

struct IqGrids {
  uint64_t iq2xxs[256];
  uint64_t iq2xs[512];
  uint64_t iq2s[1024];
  uint32_t iq3xxs[256];
  uint32_t iq3s[512];
  uint64_t iq1s[2048];  // bytes 0xff, 0x00, 0x01 (int8 -1, 0, 1)
  // sign_mask7[b]: the 8 signs that 7 stored bits b stand for (iq_signs8 below) as a mask, byte j
  // 0xff where element j is negative.
  uint64_t sign_mask7[128];
};

// Expanded at compile time (iq_codebooks.h).
const IqGrids& iq_grids();

// The types whose values are points of these codebooks (IQ1_S..IQ3_S).
bool is_codebook_type(Type t);

// IQ2_XXS/IQ2_XS/IQ3_XXS store 7 sign bits a group of 8: the 8th makes the count of minus signs
// even. The group's 8 sign bits from the stored 7.
constexpr uint8_t iq_signs8(uint32_t seven) {
  seven &= 127;
  uint32_t parity = seven;
  parity ^= parity >> 4;
  parity ^= parity >> 2;
  parity ^= parity >> 1;
  return static_cast<uint8_t>(seven | (parity & 1) << 7);
}

// Element j of sub-block s (elements 32s..32s+31) of a block is (D * scale[j / 16]) * q[j]: D =
// d * kIqDFactor, scale = 1 + 2 sc (iq_scales), q = g * sign (IQ1: 8 g + 8 delta, in -9..9).
// Computed in that order the values are ggml's to the bit (its formulas, blocks.h, regrouped by
// powers of two).

// The two scales (1 + 2 sc) of sub-block s: elements 0-15, 16-31.
inline void iq_scales(const BlockIQ2_XXS& b, int s, int32_t sc[2]) {
  sc[0] = sc[1] = 1 + 2 * (b.qs[4 * s + 3] >> 12);
}
inline void iq_scales(const BlockIQ2_XS& b, int s, int32_t sc[2]) {
  sc[0] = 1 + 2 * (b.scales[s] & 0xf), sc[1] = 1 + 2 * (b.scales[s] >> 4);
}
inline void iq_scales(const BlockIQ2_S& b, int s, int32_t sc[2]) {
  sc[0] = 1 + 2 * (b.scales[s] & 0xf), sc[1] = 1 + 2 * (b.scales[s] >> 4);
}
inline void iq_scales(const BlockIQ3_XXS& b, int s, int32_t sc[2]) {
  sc[0] = sc[1] = 1 + 2 * (b.qs[kQK_K / 4 + 4 * s + 3] >> 4);
}
inline void iq_scales(const BlockIQ3_S& b, int s, int32_t sc[2]) {
  sc[0] = sc[1] = 1 + 2 * (b.scales[s / 2] >> (4 * (s % 2)) & 0xf);
}
inline void iq_scales(const BlockIQ1_S& b, int s, int32_t sc[2]) {
  sc[0] = sc[1] = 1 + 2 * (b.qh[s] >> 12 & 7);
}
inline void iq_scales(const BlockIQ1_M& b, int s, int32_t sc[2]) {
  const int w = b.scales[2 * (s / 2)] | b.scales[2 * (s / 2) + 1] << 8;
  sc[0] = 1 + 2 * (w >> (6 * (s % 2)) & 7), sc[1] = 1 + 2 * (w >> (6 * (s % 2) + 3) & 7);
}

// The block's d as stored (binary16 bits; IQ1_M's is spread over the top nibbles of its four scale
// words, word 0 the lowest), and the power of two D / d.
template <typename Block>
half_bits iq_d_bits(const Block& b) {
  return b.d;
}
inline half_bits iq_d_bits(const BlockIQ1_M& b) {
  unsigned d = 0;
  for (int w = 0; w < 4; ++w) d |= static_cast<unsigned>(b.scales[2 * w + 1] >> 4) << (4 * w);
  return static_cast<half_bits>(d);
}
template <typename Block>
inline constexpr float kIqDFactor = 0.125f;  // IQ2: (0.5 + sc) * 0.25 = (1 + 2 sc) / 8; IQ1: codes 8x
template <>
inline constexpr float kIqDFactor<BlockIQ3_XXS> = 0.25f;
template <>
inline constexpr float kIqDFactor<BlockIQ3_S> = 1.0f;

}  // namespace kite::quant

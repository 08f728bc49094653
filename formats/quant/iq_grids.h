// kite/formats/quant/iq_grids.h — the codebooks of the IQ1_S..IQ3_S types (blocks.h).
//
// Each codebook is a fixed list of points: 8 coordinates on the levels {8, 25, 43} (IQ2_*), or
// {-1, 0, 1} (IQ1_*), or 4 coordinates on 8 levels (IQ3_*). Entry i of a table holds point i's
// coordinates as bytes, coordinate 0 in the lowest byte, exactly as ggml's iq*_grid tables do
// (a block's index means the same point in both).
#pragma once

#include <cstdint>

#include "formats/quant/blocks.h"

namespace kite::quant {

struct IqGrids {
  uint64_t iq2xxs[256];
  uint64_t iq2xs[512];
  uint64_t iq2s[1024];
  uint32_t iq3xxs[256];
  uint32_t iq3s[512];
  uint64_t iq1s[2048];  // bytes 0xff, 0x00, 0x01 (int8 -1, 0, 1)
  // sign_mask[b]: byte j is 0xff where bit j of b is set (the 8 signs of a group as a mask).
  uint64_t sign_mask[256];
};

// Built once, on first use (thread-safe).
const IqGrids& iq_grids();

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

// Sub-block s (elements 32s..32s+31) of a block as integer codes and scales: element j's value is
// (D * scale[j / 16]) * q[j], D the returned float (per block). Computed in that order the values
// are ggml's to the bit (its formulas, blocks.h, regrouped by powers of two). q is g * sign (IQ1:
// 8 g + 8 delta, in -9..9); scales are 1 + 2 sc.
struct IqSub {
  int8_t q[32];
  int32_t scale[2];
};
float iq_sub(const BlockIQ2_XXS& b, int s, IqSub* out);
float iq_sub(const BlockIQ2_XS& b, int s, IqSub* out);
float iq_sub(const BlockIQ2_S& b, int s, IqSub* out);
float iq_sub(const BlockIQ3_XXS& b, int s, IqSub* out);
float iq_sub(const BlockIQ3_S& b, int s, IqSub* out);
float iq_sub(const BlockIQ1_S& b, int s, IqSub* out);
float iq_sub(const BlockIQ1_M& b, int s, IqSub* out);

// IQ1_M's d, gathered from the top nibbles of its scale words.
uint16_t iq1_m_d(const BlockIQ1_M& b);

}  // namespace kite::quant

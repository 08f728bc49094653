// kite/formats/quant/blocks.h — byte layouts of the quantized block types (identical to ggml's).
//
// A row of a quantized tensor is a sequence of blocks; each block covers `kQK*` consecutive
// elements of the row. The structs below are plain bytes (no padding, 2-byte alignment at most),
// so a row can be reinterpreted in place from a mapped GGUF file. Half-precision fields hold
// IEEE binary16 bits: convert with kite::fp16_to_fp32 (src/base/half.h).
//
// Each struct's comment gives the formula that reconstructs element i of the block. These
// formulas, written out in the scalar reference (ref_*.cpp), define the value of every block;
// fast kernels must agree with them (bit for bit where they use the same float operations).
//
// Conventions in the formulas: d, m, dmin are the half fields converted to float; q is the
// unsigned integer code stored for the element; sc/mc are the unpacked sub-block scale/min codes.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kite::quant {

using half_bits = uint16_t;  // IEEE binary16, as stored

inline constexpr int kQK4_0 = 32;
inline constexpr int kQK4_1 = 32;
inline constexpr int kQK5_0 = 32;
inline constexpr int kQK5_1 = 32;
inline constexpr int kQK8_0 = 32;
inline constexpr int kQK8_1 = 32;
inline constexpr int kQK4_NL = 32;
inline constexpr int kQK_K = 256;        // super-block size of the K-quants and IQ4_XS
inline constexpr int kKScaleSize = 12;   // bytes of packed 6-bit scales in Q3_K/Q4_K/Q5_K

// ---------------------------------------------------------------------------------------------
// Legacy 32-element blocks. Element j (0..15) is in the low nibble of qs[j], element j+16 in the
// high nibble (the first and second halves of the block share bytes).

// Q4_0: y = (q - 8) * d, q in 0..15.
struct BlockQ4_0 {
  half_bits d;              // scale
  uint8_t qs[kQK4_0 / 2];   // 4-bit codes: qs[j] = q[j] | q[j+16] << 4
};
static_assert(sizeof(BlockQ4_0) == 18);

// Q4_1: y = q * d + m, q in 0..15.
struct BlockQ4_1 {
  half_bits d;              // scale
  half_bits m;              // offset (the block minimum)
  uint8_t qs[kQK4_1 / 2];   // as in Q4_0
};
static_assert(sizeof(BlockQ4_1) == 20);

// Q5_0: y = (q - 16) * d, q in 0..31; the low 4 bits of q as in Q4_0, bit 4 of q[j] is bit j
// of qh (qh read as a little-endian uint32).
struct BlockQ5_0 {
  half_bits d;              // scale
  uint8_t qh[4];            // 5th bits, element j -> bit j
  uint8_t qs[kQK5_0 / 2];   // low 4 bits, as in Q4_0
};
static_assert(sizeof(BlockQ5_0) == 22);

// Q5_1: y = q * d + m, q in 0..31; bits stored as in Q5_0.
struct BlockQ5_1 {
  half_bits d;              // scale
  half_bits m;              // offset
  uint8_t qh[4];            // 5th bits
  uint8_t qs[kQK5_1 / 2];   // low 4 bits
};
static_assert(sizeof(BlockQ5_1) == 24);

// Q8_0: y = qs[j] * d (qs signed).
struct BlockQ8_0 {
  half_bits d;              // scale
  int8_t qs[kQK8_0];        // codes, -127..127 from the quantizer
};
static_assert(sizeof(BlockQ8_0) == 34);

// Q8_1: y = qs[j] * d; s caches d * sum(qs) for dot products with Q4_1/Q5_1 (an activation type).
struct BlockQ8_1 {
  half_bits d;              // scale
  half_bits s;              // d * sum(qs[j])
  int8_t qs[kQK8_1];
};
static_assert(sizeof(BlockQ8_1) == 36);

// ---------------------------------------------------------------------------------------------
// K-quants: 256-element super-blocks split into sub-blocks (16 of 16 or 8 of 32 elements), each
// with its own small integer scale (and min) multiplied by the super-block's half scale(s).

// Q2_K: 16 sub-blocks of 16. scales[s] = sc | mc << 4 (4 bits each) for sub-block s.
//   y = (d * sc) * q - (dmin * mc), q in 0..3.
// Element e: chunk c = e / 128, r = e % 128, shift = 2 * (r / 32), l = r % 32;
//   q = (qs[32*c + l] >> shift) & 3; sub-block s = e / 16.
struct BlockQ2_K {
  uint8_t scales[kQK_K / 16];  // 4-bit scale (low) and min (high) per sub-block
  uint8_t qs[kQK_K / 4];       // 2-bit codes
  half_bits d;                 // super-block scale for the scales
  half_bits dmin;              // super-block scale for the mins
};
static_assert(sizeof(BlockQ2_K) == 84);

// Q3_K: 16 sub-blocks of 16 with signed 6-bit scales sc in -32..31 (stored sc + 32).
//   y = (d * sc) * (q - 4), q in 0..7.
// Low 2 bits of q as in Q2_K (qs); bit 2 of q for element e is bit (e / 32) of hmask[e % 32].
// Scale code of sub-block s (6 bits): low 4 bits in scales[s] (s < 8) or scales[s - 8] >> 4
// (s >= 8); high 2 bits are bits 2*(s/4)..+1 of scales[8 + s % 4]. See unpack_q3_k_scales().
struct BlockQ3_K {
  uint8_t hmask[kQK_K / 8];    // high bit of each 3-bit code
  uint8_t qs[kQK_K / 4];       // low 2 bits
  uint8_t scales[12];          // 16 packed 6-bit scales
  half_bits d;                 // super-block scale
};
static_assert(sizeof(BlockQ3_K) == 110);

// Q4_K: 8 sub-blocks of 32 with 6-bit scale sc and min mc (see unpack_q4_k_scale_min()).
//   y = (d * sc) * q - (dmin * mc), q in 0..15.
// Element e: pair p = e / 64, l = e % 64; q = qs[32*p + l % 32] low nibble if l < 32 else high.
struct BlockQ4_K {
  half_bits d;                 // super-block scale for the scales
  half_bits dmin;              // super-block scale for the mins
  uint8_t scales[kKScaleSize]; // 8 scales + 8 mins, 6 bits each
  uint8_t qs[kQK_K / 2];       // 4-bit codes
};
static_assert(sizeof(BlockQ4_K) == 144);

// Q5_K: as Q4_K with a 5th bit: q = low4 + 16 * bit, q in 0..31, where the bit of element e is
// bit (2 * (e / 64) + (e % 64) / 32) of qh[e % 32].
//   y = (d * sc) * q - (dmin * mc).
struct BlockQ5_K {
  half_bits d;
  half_bits dmin;
  uint8_t scales[kKScaleSize];
  uint8_t qh[kQK_K / 8];       // 5th bits
  uint8_t qs[kQK_K / 2];       // low 4 bits, laid out as in Q4_K
};
static_assert(sizeof(BlockQ5_K) == 176);

// Q6_K: 16 sub-blocks of 16 with signed 8-bit scales.
//   y = d * scales[s] * (q - 32), q in 0..63 (evaluated as (d * scales[s]) * (q - 32)).
// Element e: chunk c = e / 128, r = e % 128, quarter k = r / 32, l = r % 32;
//   low 4 bits: ql[64*c + l + 32*(k & 1)], low nibble for k < 2 else high nibble;
//   high 2 bits: (qh[32*c + l] >> (2*k)) & 3.
struct BlockQ6_K {
  uint8_t ql[kQK_K / 2];       // low 4 bits
  uint8_t qh[kQK_K / 4];       // high 2 bits
  int8_t scales[kQK_K / 16];   // sub-block scales
  half_bits d;                 // super-block scale
};
static_assert(sizeof(BlockQ6_K) == 210);

// Q8_K: y = d * qs[j] with a float scale; bsums[g] = sum of qs over elements 16g..16g+15. It is
// the activation type the K-quant dot products pair with, not a storage type for weights.
struct BlockQ8_K {
  float d;
  int8_t qs[kQK_K];
  int16_t bsums[kQK_K / 16];
};
static_assert(sizeof(BlockQ8_K) == 292);

// ---------------------------------------------------------------------------------------------
// Non-linear 4-bit types: codes index a fixed table of 16 values.

// IQ4_NL's code book: a non-uniform grid, denser near zero.
inline constexpr int8_t kIq4nlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};

// IQ4_NL: y = d * kIq4nlValues[q], nibbles laid out as in Q4_0.
struct BlockIQ4_NL {
  half_bits d;
  uint8_t qs[kQK4_NL / 2];
};
static_assert(sizeof(BlockIQ4_NL) == 18);

// IQ4_XS: 8 sub-blocks of 32 with 6-bit scales ls (0..63), each laid out as an IQ4_NL block:
//   y = (d * (ls - 32)) * kIq4nlValues[q]
// ls of sub-block s = ((scales_l[s/2] >> 4*(s%2)) & 0xf) | ((scales_h >> 2*s) & 3) << 4.
// Sub-block s's nibbles are qs[16*s .. 16*s+15] (low nibble: element j, high: element j+16).
struct BlockIQ4_XS {
  half_bits d;
  uint16_t scales_h;           // high 2 bits of the 8 scales
  uint8_t scales_l[kQK_K / 64];// low 4 bits, two scales a byte
  uint8_t qs[kQK_K / 2];
};
static_assert(sizeof(BlockIQ4_XS) == 136);

// ---------------------------------------------------------------------------------------------
// The codebook types IQ1_S..IQ3_S (256-element super-blocks; quantizers in
// ref_iq_codebook_quant.cpp). Each group of 8 (IQ3: 4) elements is one point of a fixed codebook (iq_grids.h)
// times signs; a 32-element sub-block s has a scale code. In the formulas g is the grid point's
// value for the element, sign its sign (+-1), and sc the 4-bit (IQ1: 3-bit) scale code.

// IQ2_XXS: per sub-block s, qs[4s..4s+3] as two 32-bit words a, b: bytes of a index 4 points of
// iq2xxs (8 elements each); b holds 4 x 7 sign bits (the 8th sign of a group makes the count of
// minus signs even) and sc = b >> 28. y = d * (0.5 + sc) * 0.25 * g * sign.
struct BlockIQ2_XXS {
  half_bits d;
  uint16_t qs[kQK_K / 8];
};
static_assert(sizeof(BlockIQ2_XXS) == 66);

// IQ2_XS: qs[i] = 9-bit index into iq2xs | 7 sign bits << 9 for group i (8 elements); scales[s]:
// two 4-bit codes, low for elements 0-15 of sub-block s, high for 16-31. y = d * (0.5 + sc) * 0.25 *
// g * sign.
struct BlockIQ2_XS {
  half_bits d;
  uint16_t qs[kQK_K / 8];
  uint8_t scales[kQK_K / 32];
};
static_assert(sizeof(BlockIQ2_XS) == 74);

// IQ2_S: group i (8 elements) of sub-block s indexes iq2s with qs[i] | (qh[s] >> 2(i%4) & 3) << 8;
// its 8 signs are the bits of qs[32 + i]; scales as IQ2_XS. y = d * (0.5 + sc) * 0.25 * g * sign.
struct BlockIQ2_S {
  half_bits d;
  uint8_t qs[kQK_K / 4];  // 32 grid index bytes, then 32 sign bytes
  uint8_t qh[kQK_K / 32];
  uint8_t scales[kQK_K / 32];
};
static_assert(sizeof(BlockIQ2_S) == 82);

// IQ3_XXS: qs[0..63] index iq3xxs (4 elements each); per sub-block s, the 32-bit word at qs[64 +
// 4s] holds 4 x 7 sign bits (as IQ2_XXS) and sc = word >> 28. y = d * (0.5 + sc) * 0.5 * g * sign.
struct BlockIQ3_XXS {
  half_bits d;
  uint8_t qs[3 * kQK_K / 8];
};
static_assert(sizeof(BlockIQ3_XXS) == 98);

// IQ3_S: quad i (4 elements) indexes iq3s with qs[i] | (qh[i / 8] >> (i % 8) & 1) << 8; the signs
// are the bits of signs[] in element order; scales[s / 2] holds sub-block s's code in its low
// (even s) or high (odd s) nibble. y = d * (1 + 2 sc) * g * sign.
struct BlockIQ3_S {
  half_bits d;
  uint8_t qs[kQK_K / 4];
  uint8_t qh[kQK_K / 32];
  uint8_t signs[kQK_K / 8];
  uint8_t scales[kQK_K / 64];
};
static_assert(sizeof(BlockIQ3_S) == 110);

// IQ1_S: group l of sub-block s indexes iq1s (values -1, 0, 1) with qs[4s + l] | (qh[s] >> 3l & 7)
// << 8; sc = qh[s] >> 12 & 7; delta = -0.125 if qh[s] bit 15, else +0.125. y = d * (2 sc + 1) *
// (g + delta).
struct BlockIQ1_S {
  half_bits d;
  uint8_t qs[kQK_K / 8];
  uint16_t qh[kQK_K / 32];
};
static_assert(sizeof(BlockIQ1_S) == 50);

// IQ1_M: no d field: the four 16-bit words of scales[] carry d's 16 bits in their top nibbles
// (word 0 the lowest) and 3-bit codes for each 16 elements below them (sub-block s: word s / 2,
// bits 6(s % 2) for elements 0-15 and 6(s % 2) + 3 for 16-31). Group l (8 elements) of sub-block
// s indexes iq1s with qs[4s + l] | (qh[2s + l / 2] >> 4(l % 2) & 7) << 8, and bit 3 of that nibble
// makes its delta -0.125 (else +0.125). y = d * (2 sc + 1) * (g + delta).
struct BlockIQ1_M {
  uint8_t qs[kQK_K / 8];
  uint8_t qh[kQK_K / 16];
  uint8_t scales[kQK_K / 32];
};
static_assert(sizeof(BlockIQ1_M) == 56);

// ---------------------------------------------------------------------------------------------
// Scale unpacking shared by the reference and the kernels.

// Q4_K/Q5_K: scale code sc and min code mc (0..63) of sub-block j (0..7). Sub-blocks 0..3 use
// the low 6 bits of bytes j and j+4; 4..7 combine a nibble of byte j+4 with the top 2 bits of
// bytes j-4 (scale) and j (min).
inline void unpack_q4_k_scale_min(int j, const uint8_t* scales, uint8_t* sc, uint8_t* mc) {
  if (j < 4) {
    *sc = scales[j] & 63;
    *mc = scales[j + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((scales[j + 4] & 0xF) | ((scales[j - 4] >> 6) << 4));
    *mc = static_cast<uint8_t>((scales[j + 4] >> 4) | ((scales[j] >> 6) << 4));
  }
}

// Inverse of unpack_q4_k_scale_min for all 8 sub-blocks (codes must be < 64).
inline void pack_q4_k_scale_min(const uint8_t sc[8], const uint8_t mc[8], uint8_t* scales) {
  for (int j = 0; j < 4; ++j) {
    scales[j] = static_cast<uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
    scales[j + 4] = static_cast<uint8_t>(mc[j] | ((mc[j + 4] >> 4) << 6));
    scales[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0xF) | ((mc[j + 4] & 0xF) << 4));
  }
}

// Q3_K: the 16 scale codes as signed values sc - 32 (in -32..31).
inline void unpack_q3_k_scales(const uint8_t* scales, int8_t out[16]) {
  for (int s = 0; s < 16; ++s) {
    const int low = s < 8 ? (scales[s] & 0xF) : (scales[s - 8] >> 4);
    const int high = (scales[8 + s % 4] >> (2 * (s / 4))) & 3;
    out[s] = static_cast<int8_t>((low | (high << 4)) - 32);
  }
}

// Inverse of unpack_q3_k_scales (values in -32..31).
inline void pack_q3_k_scales(const int8_t sc[16], uint8_t* scales) {
  for (int i = 0; i < 12; ++i) scales[i] = 0;
  for (int s = 0; s < 16; ++s) {
    const int code = sc[s] + 32;
    if (s < 8) scales[s] |= static_cast<uint8_t>(code & 0xF);
    else scales[s - 8] |= static_cast<uint8_t>((code & 0xF) << 4);
    scales[8 + s % 4] |= static_cast<uint8_t>((code >> 4) << (2 * (s / 4)));
  }
}

// IQ4_XS: scale code ls (0..63) of sub-block s (0..7).
inline int unpack_iq4_xs_scale(const BlockIQ4_XS& b, int s) {
  return ((b.scales_l[s / 2] >> (4 * (s % 2))) & 0xF) | (((b.scales_h >> (2 * s)) & 3) << 4);
}

}  // namespace kite::quant

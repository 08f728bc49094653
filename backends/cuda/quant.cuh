// kite/backends/cuda/quant.cuh — device-side decoding of the quantized block types.
//
// Every supported type is read in units of 32 consecutive elements of a row: a Unit holds the
// 32 integer codes q (packed four int8 a word, elements 4i..4i+3 in q[i]) and, for each half of
// 16 elements, a scale d and an offset m such that element e = d * q[e] + m. The formulas are
// those of formats/quant/blocks.h and the scalar reference (ref_*.cpp): the dequantizer and the
// int8 dot products both start from this one decoding, so they agree with each other and with
// the CPU.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "backends/cuda/kernels.h"
#include "formats/quant/blocks.h"
#include "formats/quant/iq_codebooks.h"

namespace kite::cuda {

struct Unit {
  int32_t q[8];
  float d0, d1;  // scales of elements 0..15 and 16..31
  float m0, m1;  // offsets of the same halves
};

__device__ __forceinline__ float ld_half(const uint8_t* p) {
  return __half2float(__ushort_as_half(*reinterpret_cast<const uint16_t*>(p)));
}

// A 32-bit word at a 4-byte aligned address.
__device__ __forceinline__ uint32_t ld32a(const uint8_t* p) { return *reinterpret_cast<const uint32_t*>(p); }

// N little-endian words at a 2-byte aligned address (blocks of 18, 34, 110 or 210 bytes): N
// aligned 4-byte loads and, when p is not 4-byte aligned, a 2-byte one, joined by funnel
// shifts (two 2-byte loads a word would take 2N loads). Reads nothing outside [p & ~3, p + 4N).
template <int N>
__device__ __forceinline__ void ld_words_a2(const uint8_t* p, uint32_t (&w)[N]) {
  const unsigned off = static_cast<unsigned>(reinterpret_cast<uintptr_t>(p) & 2u);  // 0 or 2
  // (pointer arithmetic on p, not an integer round trip, so nvcc still sees global memory)
  const auto* base = reinterpret_cast<const uint32_t*>(p - off);
  const unsigned shift = off * 8u;
  uint32_t r[N + 1];
#pragma unroll
  for (int i = 0; i < N; ++i) r[i] = base[i];
  r[N] = shift != 0 ? *reinterpret_cast<const uint16_t*>(base + N) : 0u;
#pragma unroll
  for (int i = 0; i < N; ++i) w[i] = __funnelshift_r(r[i], r[i + 1], shift);
}

// 32 bytes at a 16-byte aligned address as eight little-endian words, in two 16-byte loads.
__device__ __forceinline__ void ld32x8(const uint8_t* p, uint32_t (&w)[8]) {
  const int4 a = reinterpret_cast<const int4*>(p)[0], b = reinterpret_cast<const int4*>(p)[1];
  w[0] = static_cast<uint32_t>(a.x), w[1] = static_cast<uint32_t>(a.y);
  w[2] = static_cast<uint32_t>(a.z), w[3] = static_cast<uint32_t>(a.w);
  w[4] = static_cast<uint32_t>(b.x), w[5] = static_cast<uint32_t>(b.y);
  w[6] = static_cast<uint32_t>(b.z), w[7] = static_cast<uint32_t>(b.w);
}

// Bits 0..3 of b moved to bit 4 of bytes 0..3.
__device__ __forceinline__ uint32_t spread4(uint32_t b) {
  return ((b & 1u) << 4) | ((b & 2u) << 11) | ((b & 4u) << 18) | ((b & 8u) << 25);
}

constexpr uint32_t pack_bytes(int a, int b, int c, int d) {
  return static_cast<uint32_t>(a & 0xff) | (static_cast<uint32_t>(b & 0xff) << 8) |
         (static_cast<uint32_t>(c & 0xff) << 16) | (static_cast<uint32_t>(d & 0xff) << 24);
}
constexpr uint32_t kIq4Tab0 = pack_bytes(quant::kIq4nlValues[0], quant::kIq4nlValues[1], quant::kIq4nlValues[2],
                                         quant::kIq4nlValues[3]);
constexpr uint32_t kIq4Tab1 = pack_bytes(quant::kIq4nlValues[4], quant::kIq4nlValues[5], quant::kIq4nlValues[6],
                                         quant::kIq4nlValues[7]);
constexpr uint32_t kIq4Tab2 = pack_bytes(quant::kIq4nlValues[8], quant::kIq4nlValues[9], quant::kIq4nlValues[10],
                                         quant::kIq4nlValues[11]);
constexpr uint32_t kIq4Tab3 = pack_bytes(quant::kIq4nlValues[12], quant::kIq4nlValues[13], quant::kIq4nlValues[14],
                                         quant::kIq4nlValues[15]);

// Four 4-bit indices (the low nibbles of the bytes of v) looked up in the IQ4_NL table.
__device__ __forceinline__ uint32_t iq4_lookup(uint32_t v) {
  const uint32_t lo3 = v & 0x07070707u;
  const uint32_t x = lo3 | (lo3 >> 4);
  const uint32_t sel = (x & 0xffu) | ((x >> 8) & 0xff00u);
  const uint32_t r0 = __byte_perm(kIq4Tab0, kIq4Tab1, sel);
  const uint32_t r1 = __byte_perm(kIq4Tab2, kIq4Tab3, sel);
  const uint32_t mask = ((v >> 3) & 0x01010101u) * 0xffu;
  return (r1 & mask) | (r0 & ~mask);
}

__device__ __forceinline__ void set_scales(Unit& u, float d, float m) {
  u.d0 = u.d1 = d;
  u.m0 = u.m1 = m;
}

// Unit `un` (0-based, 32 elements each) of a row of type T.
template <int T>
__device__ __forceinline__ void load_unit(const uint8_t* row, int un, Unit& u);

template <>
__device__ __forceinline__ void load_unit<kQ4_0>(const uint8_t* row, int un, Unit& u) {
  const uint8_t* b = row + static_cast<size_t>(un) * sizeof(quant::BlockQ4_0);
  set_scales(u, ld_half(b), 0.f);
  uint32_t qs[4];
  ld_words_a2(b + 2, qs);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    u.q[i] = static_cast<int32_t>(__vsub4(qs[i] & 0x0f0f0f0fu, 0x08080808u));
    u.q[4 + i] = static_cast<int32_t>(__vsub4((qs[i] >> 4) & 0x0f0f0f0fu, 0x08080808u));
  }
}

template <>
__device__ __forceinline__ void load_unit<kQ4_1>(const uint8_t* row, int un, Unit& u) {
  const uint8_t* b = row + static_cast<size_t>(un) * sizeof(quant::BlockQ4_1);
  set_scales(u, ld_half(b), ld_half(b + 2));
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t w = ld32a(b + 4 + 4 * i);
    u.q[i] = static_cast<int32_t>(w & 0x0f0f0f0fu);
    u.q[4 + i] = static_cast<int32_t>((w >> 4) & 0x0f0f0f0fu);
  }
}

template <>
__device__ __forceinline__ void load_unit<kQ5_0>(const uint8_t* row, int un, Unit& u) {
  const uint8_t* b = row + static_cast<size_t>(un) * sizeof(quant::BlockQ5_0);
  set_scales(u, ld_half(b), 0.f);
  uint32_t words[5];  // qh, then the 16 quant bytes
  ld_words_a2(b + 2, words);
  const uint32_t qh = words[0];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t w = words[1 + i];
    u.q[i] = static_cast<int32_t>(__vsub4((w & 0x0f0f0f0fu) | spread4(qh >> (4 * i)), 0x10101010u));
    u.q[4 + i] = static_cast<int32_t>(__vsub4(((w >> 4) & 0x0f0f0f0fu) | spread4(qh >> (16 + 4 * i)), 0x10101010u));
  }
}

template <>
__device__ __forceinline__ void load_unit<kQ5_1>(const uint8_t* row, int un, Unit& u) {
  const uint8_t* b = row + static_cast<size_t>(un) * sizeof(quant::BlockQ5_1);
  set_scales(u, ld_half(b), ld_half(b + 2));
  const uint32_t qh = ld32a(b + 4);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t w = ld32a(b + 8 + 4 * i);
    u.q[i] = static_cast<int32_t>((w & 0x0f0f0f0fu) | spread4(qh >> (4 * i)));
    u.q[4 + i] = static_cast<int32_t>(((w >> 4) & 0x0f0f0f0fu) | spread4(qh >> (16 + 4 * i)));
  }
}

template <>
__device__ __forceinline__ void load_unit<kQ8_0>(const uint8_t* row, int un, Unit& u) {
  const uint8_t* b = row + static_cast<size_t>(un) * sizeof(quant::BlockQ8_0);
  set_scales(u, ld_half(b), 0.f);
  uint32_t qs[8];
  ld_words_a2(b + 2, qs);
#pragma unroll
  for (int i = 0; i < 8; ++i) u.q[i] = static_cast<int32_t>(qs[i]);
}

template <>
__device__ __forceinline__ void load_unit<kIQ4_NL>(const uint8_t* row, int un, Unit& u) {
  const uint8_t* b = row + static_cast<size_t>(un) * sizeof(quant::BlockIQ4_NL);
  set_scales(u, ld_half(b), 0.f);
  uint32_t qs[4];
  ld_words_a2(b + 2, qs);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    u.q[i] = static_cast<int32_t>(iq4_lookup(qs[i] & 0x0f0f0f0fu));
    u.q[4 + i] = static_cast<int32_t>(iq4_lookup((qs[i] >> 4) & 0x0f0f0f0fu));
  }
}

template <>
__device__ __forceinline__ void load_unit<kIQ4_XS>(const uint8_t* row, int un, Unit& u) {
  const uint8_t* b = row + static_cast<size_t>(un / 8) * sizeof(quant::BlockIQ4_XS);
  const int s = un % 8;
  const uint32_t sh = *reinterpret_cast<const uint16_t*>(b + 2);
  const int ls = ((b[4 + s / 2] >> (4 * (s % 2))) & 0xF) | (((sh >> (2 * s)) & 3) << 4);
  set_scales(u, __fmul_rn(ld_half(b), static_cast<float>(ls - 32)), 0.f);
  const uint8_t* qs = b + 8 + 16 * s;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t w = ld32a(qs + 4 * i);
    u.q[i] = static_cast<int32_t>(iq4_lookup(w & 0x0f0f0f0fu));
    u.q[4 + i] = static_cast<int32_t>(iq4_lookup((w >> 4) & 0x0f0f0f0fu));
  }
}

// A Q4_K/Q5_K superblock's scales for sub-block j: d * scale code and -dmin * min code
// (blocks.h unpack_q4_k_scale_min), from its 16-byte header (d, dmin, 12 code bytes) read in one
// 16-byte load (superblocks of 144 and 176 bytes stay 16-byte aligned in a row of a weight).
__device__ __forceinline__ void k_header_scales(const uint8_t* b, int j, Unit& u) {
  const int4 h = *reinterpret_cast<const int4*>(b);
  const unsigned sh = 8u * static_cast<unsigned>(j & 3);
  const unsigned lo = (static_cast<unsigned>(h.y) >> sh) & 0xffu;  // code byte j % 4
  const unsigned mid = (static_cast<unsigned>(h.z) >> sh) & 0xffu;  // code byte 4 + j % 4
  const unsigned hi = (static_cast<unsigned>(h.w) >> sh) & 0xffu;   // code byte 8 + j % 4
  const unsigned sc = j < 4 ? lo & 63u : (hi & 0xFu) | ((lo >> 6) << 4);
  const unsigned mc = j < 4 ? mid & 63u : (hi >> 4) | ((mid >> 6) << 4);
  const float d = __half2float(__ushort_as_half(static_cast<unsigned short>(static_cast<unsigned>(h.x) & 0xffffu)));
  const float dmin = __half2float(__ushort_as_half(static_cast<unsigned short>(static_cast<unsigned>(h.x) >> 16)));
  set_scales(u, __fmul_rn(d, static_cast<float>(sc)), -__fmul_rn(dmin, static_cast<float>(mc)));
}

template <>
__device__ __forceinline__ void load_unit<kQ4_K>(const uint8_t* row, int un, Unit& u) {
  const uint8_t* b = row + static_cast<size_t>(un / 8) * sizeof(quant::BlockQ4_K);
  const int s = un % 8;
  k_header_scales(b, s, u);
  uint32_t w[8];
  ld32x8(b + 16 + 32 * (s / 2), w);
  const int shift = 4 * (s % 2);
#pragma unroll
  for (int i = 0; i < 8; ++i) u.q[i] = static_cast<int32_t>((w[i] >> shift) & 0x0f0f0f0fu);
}

template <>
__device__ __forceinline__ void load_unit<kQ5_K>(const uint8_t* row, int un, Unit& u) {
  const uint8_t* b = row + static_cast<size_t>(un / 8) * sizeof(quant::BlockQ5_K);
  const int s = un % 8;
  k_header_scales(b, s, u);
  uint32_t qh[8], qs[8];
  ld32x8(b + 16, qh);
  ld32x8(b + 48 + 32 * (s / 2), qs);
  const int shift = 4 * (s % 2);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint32_t lo = (qs[i] >> shift) & 0x0f0f0f0fu;
    const uint32_t hi = (qh[i] >> s) & 0x01010101u;
    u.q[i] = static_cast<int32_t>(lo | (hi << 4));
  }
}

template <>
__device__ __forceinline__ void load_unit<kQ6_K>(const uint8_t* row, int un, Unit& u) {
  const uint8_t* b = row + static_cast<size_t>(un / 8) * sizeof(quant::BlockQ6_K);
  const int s = un % 8, c = s / 4, k = s % 4;
  const float d = ld_half(b + 208);
  const auto* scales = reinterpret_cast<const int8_t*>(b + 192);
  u.d0 = __fmul_rn(d, static_cast<float>(scales[2 * s]));
  u.d1 = __fmul_rn(d, static_cast<float>(scales[2 * s + 1]));
  u.m0 = u.m1 = 0.f;
  const uint8_t* ql = b + 64 * c + 32 * (k & 1);
  const uint8_t* qh = b + 128 + 32 * c;
  const int lshift = 4 * (k >> 1), hshift = 2 * k;
  uint32_t lw[8], hw[8];
  ld_words_a2(ql, lw);
  ld_words_a2(qh, hw);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint32_t lo = (lw[i] >> lshift) & 0x0f0f0f0fu;
    const uint32_t hi = (hw[i] >> hshift) & 0x03030303u;
    u.q[i] = static_cast<int32_t>(__vsub4(lo | (hi << 4), 0x20202020u));
  }
}

template <>
__device__ __forceinline__ void load_unit<kQ3_K>(const uint8_t* row, int un, Unit& u) {
  const uint8_t* b = row + static_cast<size_t>(un / 8) * sizeof(quant::BlockQ3_K);
  const int s = un % 8, c = s / 4, j = s % 4;
  const float d = ld_half(b + 108);
  const uint8_t* sc = b + 96;
  auto scale = [&](int sb) {  // blocks.h unpack_q3_k_scales
    const int low = sb < 8 ? (sc[sb] & 0xF) : (sc[sb - 8] >> 4);
    const int high = (sc[8 + sb % 4] >> (2 * (sb / 4))) & 3;
    return (low | (high << 4)) - 32;
  };
  u.d0 = __fmul_rn(d, static_cast<float>(scale(2 * s)));
  u.d1 = __fmul_rn(d, static_cast<float>(scale(2 * s + 1)));
  u.m0 = u.m1 = 0.f;
  uint32_t qs[8], hm[8];
  ld_words_a2(b + 32 + 32 * c, qs);
  ld_words_a2(b, hm);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint32_t lo = (qs[i] >> (2 * j)) & 0x03030303u;
    const uint32_t hi = (hm[i] >> s) & 0x01010101u;
    u.q[i] = static_cast<int32_t>(__vsub4(lo | (hi << 2), 0x04040404u));
  }
}

template <>
__device__ __forceinline__ void load_unit<kQ2_K>(const uint8_t* row, int un, Unit& u) {
  const uint8_t* b = row + static_cast<size_t>(un / 8) * sizeof(quant::BlockQ2_K);
  const int s = un % 8, c = s / 4, j = s % 4;
  const float d = ld_half(b + 80), dmin = ld_half(b + 82);
  const uint8_t s0 = b[2 * s], s1 = b[2 * s + 1];
  u.d0 = __fmul_rn(d, static_cast<float>(s0 & 0xF));
  u.d1 = __fmul_rn(d, static_cast<float>(s1 & 0xF));
  u.m0 = -__fmul_rn(dmin, static_cast<float>(s0 >> 4));
  u.m1 = -__fmul_rn(dmin, static_cast<float>(s1 >> 4));
  const uint8_t* qs = b + 16 + 32 * c;
#pragma unroll
  for (int i = 0; i < 8; ++i) u.q[i] = static_cast<int32_t>((ld32a(qs + 4 * i) >> (2 * j)) & 0x03030303u);
}

// ---- the codebook types (IQ1_S..IQ3_S): a unit is a sub-block of a 256-element super-block ----
// As the reference regroups ggml's formulas (formats/quant/iq_grids.h): element j is (D * scale)
// * q, D = d * kIqDFactor, scale = 1 + 2 sc per 16 elements, q = grid value * sign (IQ1: 8 g + 8
// delta), so d0 / d1 = D * scale give the CPU's values to the bit. The codebooks lie in device
// memory (one copy per .cu file, built at compile time by the function the host's is), read
// through the read-only cache.
static __device__ const quant::IqGrids kIqGrids = quant::make_iq_grids();

// Bytes 0..3 are 0xff where bits 0..3 of b are set, else 0.
__device__ __forceinline__ uint32_t bit_bytes4(uint32_t b) { return __vcmpne4((b * 0x01010101u) & 0x08040201u, 0u); }

// An 8-element group: grid bytes g (element j in byte j) with element j negated where bit j of
// signs is set, into q[0] (elements 0..3) and q[1] (4..7).
__device__ __forceinline__ void signed_group(uint64_t g, uint32_t signs, int32_t* q) {
  const uint32_t m0 = bit_bytes4(signs & 15u), m1 = bit_bytes4((signs >> 4) & 15u);
  q[0] = static_cast<int32_t>(__vsub4(static_cast<uint32_t>(g) ^ m0, m0));  // (x ^ -1) + 1 = -x
  q[1] = static_cast<int32_t>(__vsub4(static_cast<uint32_t>(g >> 32) ^ m1, m1));
}

// The 8 signs of a group from the 7 stored bits (quant::iq_signs8: the count of minus signs is even).
__device__ __forceinline__ uint32_t iq_signs8(uint32_t seven) {
  seven &= 127u;
  return seven | (static_cast<uint32_t>(__popc(seven)) & 1u) << 7;
}

// IQ1: grid bytes g (-1, 0, 1) as 8 g + delta, delta -1 if minus else +1, into q[0], q[1].
__device__ __forceinline__ void iq1_group(uint64_t g, bool minus, int32_t* q) {
  const uint32_t delta = minus ? 0x01010101u : 0xffffffffu;  // subtracted: -1 or +1 a byte
  q[0] = static_cast<int32_t>(__vsub4((static_cast<uint32_t>(g) << 3) & 0xf8f8f8f8u, delta));
  q[1] = static_cast<int32_t>(__vsub4((static_cast<uint32_t>(g >> 32) << 3) & 0xf8f8f8f8u, delta));
}

__device__ __forceinline__ void iq_set_scales(Unit& u, float dd, int sc0, int sc1) {
  u.d0 = __fmul_rn(dd, static_cast<float>(1 + 2 * sc0));
  u.d1 = __fmul_rn(dd, static_cast<float>(1 + 2 * sc1));
  u.m0 = u.m1 = 0.f;
}

template <>
__device__ __forceinline__ void load_unit<kIQ2_XXS>(const uint8_t* row, int un, Unit& u) {
  const uint8_t* b = row + static_cast<size_t>(un / 8) * sizeof(quant::BlockIQ2_XXS);
  const int s = un % 8;
  uint32_t w[2];  // 4 grid indices; 4 x 7 sign bits and the scale code
  ld_words_a2(b + 2 + 8 * s, w);
  const int sc = static_cast<int>(w[1] >> 28);
  iq_set_scales(u, __fmul_rn(ld_half(b), quant::kIqDFactor<quant::BlockIQ2_XXS>), sc, sc);
#pragma unroll
  for (int l = 0; l < 4; ++l)
    signed_group(__ldg(&kIqGrids.iq2xxs[(w[0] >> (8 * l)) & 0xffu]), iq_signs8(w[1] >> (7 * l)), &u.q[2 * l]);
}

template <>
__device__ __forceinline__ void load_unit<kIQ2_XS>(const uint8_t* row, int un, Unit& u) {
  const uint8_t* b = row + static_cast<size_t>(un / 8) * sizeof(quant::BlockIQ2_XS);
  const int s = un % 8;
  uint32_t w[2];  // 4 x (9-bit index | 7 sign bits << 9)
  ld_words_a2(b + 2 + 8 * s, w);
  const uint32_t sc = b[offsetof(quant::BlockIQ2_XS, scales) + s];
  iq_set_scales(u, __fmul_rn(ld_half(b), quant::kIqDFactor<quant::BlockIQ2_XS>), static_cast<int>(sc & 15u),
                static_cast<int>(sc >> 4));
#pragma unroll
  for (int l = 0; l < 4; ++l) {
    const uint32_t v = (w[l / 2] >> (16 * (l % 2))) & 0xffffu;
    signed_group(__ldg(&kIqGrids.iq2xs[v & 511u]), iq_signs8(v >> 9), &u.q[2 * l]);
  }
}

template <>
__device__ __forceinline__ void load_unit<kIQ2_S>(const uint8_t* row, int un, Unit& u) {
  const uint8_t* b = row + static_cast<size_t>(un / 8) * sizeof(quant::BlockIQ2_S);
  const int s = un % 8;
  uint32_t idx[1], sg[1];  // 4 low index bytes; 4 sign bytes
  ld_words_a2(b + 2 + 4 * s, idx);
  ld_words_a2(b + 2 + quant::kQK_K / 8 + 4 * s, sg);
  const uint32_t qh = b[offsetof(quant::BlockIQ2_S, qh) + s];
  const uint32_t sc = b[offsetof(quant::BlockIQ2_S, scales) + s];
  iq_set_scales(u, __fmul_rn(ld_half(b), quant::kIqDFactor<quant::BlockIQ2_S>), static_cast<int>(sc & 15u),
                static_cast<int>(sc >> 4));
#pragma unroll
  for (int l = 0; l < 4; ++l) {
    const uint32_t i = ((idx[0] >> (8 * l)) & 0xffu) | ((qh >> (2 * l)) & 3u) << 8;
    signed_group(__ldg(&kIqGrids.iq2s[i]), (sg[0] >> (8 * l)) & 0xffu, &u.q[2 * l]);
  }
}

template <>
__device__ __forceinline__ void load_unit<kIQ3_XXS>(const uint8_t* row, int un, Unit& u) {
  const uint8_t* b = row + static_cast<size_t>(un / 8) * sizeof(quant::BlockIQ3_XXS);
  const int s = un % 8;
  uint32_t idx[2], aux[1];  // 8 grid indices (4 elements each); 4 x 7 sign bits and the scale code
  ld_words_a2(b + 2 + 8 * s, idx);
  ld_words_a2(b + 2 + quant::kQK_K / 4 + 4 * s, aux);
  const int sc = static_cast<int>(aux[0] >> 28);
  iq_set_scales(u, __fmul_rn(ld_half(b), quant::kIqDFactor<quant::BlockIQ3_XXS>), sc, sc);
#pragma unroll
  for (int l = 0; l < 4; ++l) {
    const uint32_t w = idx[l / 2] >> (16 * (l % 2));
    const uint64_t g = __ldg(&kIqGrids.iq3xxs[w & 0xffu]) | uint64_t{__ldg(&kIqGrids.iq3xxs[(w >> 8) & 0xffu])} << 32;
    signed_group(g, iq_signs8(aux[0] >> (7 * l)), &u.q[2 * l]);
  }
}

template <>
__device__ __forceinline__ void load_unit<kIQ3_S>(const uint8_t* row, int un, Unit& u) {
  const uint8_t* b = row + static_cast<size_t>(un / 8) * sizeof(quant::BlockIQ3_S);
  const int s = un % 8;
  uint32_t idx[2], sg[1];  // 8 low index bytes (4 elements each); 4 sign bytes
  ld_words_a2(b + 2 + 8 * s, idx);
  ld_words_a2(b + offsetof(quant::BlockIQ3_S, signs) + 4 * s, sg);
  const uint32_t qh = b[offsetof(quant::BlockIQ3_S, qh) + s];
  const int sc = (b[offsetof(quant::BlockIQ3_S, scales) + s / 2] >> (4 * (s % 2))) & 15;
  iq_set_scales(u, __fmul_rn(ld_half(b), quant::kIqDFactor<quant::BlockIQ3_S>), sc, sc);
#pragma unroll
  for (int l = 0; l < 4; ++l) {
    const uint32_t w = idx[l / 2] >> (16 * (l % 2));
    const uint32_t i0 = (w & 0xffu) | ((qh >> (2 * l)) & 1u) << 8;
    const uint32_t i1 = ((w >> 8) & 0xffu) | ((qh >> (2 * l + 1)) & 1u) << 8;
    const uint64_t g = __ldg(&kIqGrids.iq3s[i0]) | uint64_t{__ldg(&kIqGrids.iq3s[i1])} << 32;
    signed_group(g, (sg[0] >> (8 * l)) & 0xffu, &u.q[2 * l]);
  }
}

template <>
__device__ __forceinline__ void load_unit<kIQ1_S>(const uint8_t* row, int un, Unit& u) {
  const uint8_t* b = row + static_cast<size_t>(un / 8) * sizeof(quant::BlockIQ1_S);
  const int s = un % 8;
  uint32_t idx[1];
  ld_words_a2(b + 2 + 4 * s, idx);
  const uint32_t qh = *reinterpret_cast<const uint16_t*>(b + offsetof(quant::BlockIQ1_S, qh) + 2 * s);
  const int sc = static_cast<int>((qh >> 12) & 7u);
  iq_set_scales(u, __fmul_rn(ld_half(b), quant::kIqDFactor<quant::BlockIQ1_S>), sc, sc);
#pragma unroll
  for (int l = 0; l < 4; ++l)
    iq1_group(__ldg(&kIqGrids.iq1s[((idx[0] >> (8 * l)) & 0xffu) | ((qh >> (3 * l)) & 7u) << 8]), (qh >> 15) != 0,
              &u.q[2 * l]);
}

template <>
__device__ __forceinline__ void load_unit<kIQ1_M>(const uint8_t* row, int un, Unit& u) {
  const uint8_t* b = row + static_cast<size_t>(un / 8) * sizeof(quant::BlockIQ1_M);
  const int s = un % 8;
  uint32_t idx[1], sw[2];  // 4 low index bytes; the four scale words, two a word
  ld_words_a2(b + 4 * s, idx);
  ld_words_a2(b + offsetof(quant::BlockIQ1_M, scales), sw);
  // d's 16 bits: the top nibbles of the scale words (quant::iq_d_bits)
  const uint32_t d = ((sw[0] >> 12) & 0xfu) | ((sw[0] >> 24) & 0xf0u) | ((sw[1] >> 4) & 0xf00u) | ((sw[1] >> 16) & 0xf000u);
  const uint32_t w = ((s < 4 ? sw[0] : sw[1]) >> (16 * ((s / 2) % 2))) >> (6 * (s % 2));
  iq_set_scales(u, __fmul_rn(__half2float(__ushort_as_half(static_cast<unsigned short>(d))),
                             quant::kIqDFactor<quant::BlockIQ1_M>),
                static_cast<int>(w & 7u), static_cast<int>((w >> 3) & 7u));
  const uint32_t qh = *reinterpret_cast<const uint16_t*>(b + offsetof(quant::BlockIQ1_M, qh) + 2 * s);
#pragma unroll
  for (int l = 0; l < 4; ++l) {
    const uint32_t nib = (qh >> (4 * l)) & 0xfu;
    iq1_group(__ldg(&kIqGrids.iq1s[((idx[0] >> (8 * l)) & 0xffu) | (nib & 7u) << 8]), (nib & 8u) != 0, &u.q[2 * l]);
  }
}

// Whether a unit of type T has two scales (d0 != d1 in general): the halves' int8 sums are scaled
// apart (mmq's two k16 products), else one d0 * (s0 + s1).
template <int T>
constexpr bool kUnitTwoScales =
    T == kQ2_K || T == kQ3_K || T == kQ6_K || T == kIQ2_XS || T == kIQ2_S || T == kIQ1_M;

// Element e (0..31) of a decoded unit as the reference computes it: d * q + m, rounded after
// each operation (no fused multiply-add), so dequantized values equal the CPU's bit for bit.
__device__ __forceinline__ float unit_value(const Unit& u, int e) {
  const int8_t q = static_cast<int8_t>((u.q[e / 4] >> (8 * (e % 4))) & 0xff);
  const bool hi = e >= 16;
  return __fadd_rn(__fmul_rn(hi ? u.d1 : u.d0, static_cast<float>(q)), hi ? u.m1 : u.m0);
}

// Calls fn(std::integral_constant<int, T>{}) with the type id as a compile-time constant; false
// if the type has no decoder.
template <class Fn>
__host__ bool dispatch_quant(int type, Fn&& fn) {
  switch (type) {
    case kQ4_0: fn(std::integral_constant<int, kQ4_0>{}); return true;
    case kQ4_1: fn(std::integral_constant<int, kQ4_1>{}); return true;
    case kQ5_0: fn(std::integral_constant<int, kQ5_0>{}); return true;
    case kQ5_1: fn(std::integral_constant<int, kQ5_1>{}); return true;
    case kQ8_0: fn(std::integral_constant<int, kQ8_0>{}); return true;
    case kIQ4_NL: fn(std::integral_constant<int, kIQ4_NL>{}); return true;
    case kQ2_K: fn(std::integral_constant<int, kQ2_K>{}); return true;
    case kQ3_K: fn(std::integral_constant<int, kQ3_K>{}); return true;
    case kQ4_K: fn(std::integral_constant<int, kQ4_K>{}); return true;
    case kQ5_K: fn(std::integral_constant<int, kQ5_K>{}); return true;
    case kQ6_K: fn(std::integral_constant<int, kQ6_K>{}); return true;
    case kIQ4_XS: fn(std::integral_constant<int, kIQ4_XS>{}); return true;
    case kIQ2_XXS: fn(std::integral_constant<int, kIQ2_XXS>{}); return true;
    case kIQ2_XS: fn(std::integral_constant<int, kIQ2_XS>{}); return true;
    case kIQ2_S: fn(std::integral_constant<int, kIQ2_S>{}); return true;
    case kIQ3_XXS: fn(std::integral_constant<int, kIQ3_XXS>{}); return true;
    case kIQ3_S: fn(std::integral_constant<int, kIQ3_S>{}); return true;
    case kIQ1_S: fn(std::integral_constant<int, kIQ1_S>{}); return true;
    case kIQ1_M: fn(std::integral_constant<int, kIQ1_M>{}); return true;
    default: return false;
  }
}

// Float element i of a row of a float type (F32/F16/BF16).
__device__ __forceinline__ float load_float(int type, const void* row, int64_t i) {
  if (type == kF32) return static_cast<const float*>(row)[i];
  const uint16_t h = static_cast<const uint16_t*>(row)[i];
  if (type == kF16) return __half2float(__ushort_as_half(h));
  return __uint_as_float(static_cast<uint32_t>(h) << 16);  // BF16
}

// Float to BF16 bits, round to nearest even (src/base/half.h fp32_to_bf16).
__device__ __forceinline__ uint16_t to_bf16(float f) {
  uint32_t x = __float_as_uint(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

// Row r of a 4-D row walk.
__device__ __forceinline__ uint8_t* row_ptr(const Rows& t, int64_t r) {
  const int64_t i1 = r % t.ne1, i2 = (r / t.ne1) % t.ne2, i3 = r / (t.ne1 * t.ne2);
  return static_cast<uint8_t*>(t.p) + i1 * t.nb1 + i2 * t.nb2 + i3 * t.nb3;
}

}  // namespace kite::cuda

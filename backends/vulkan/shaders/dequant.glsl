// kite/backends/vulkan/shaders/dequant.glsl — decoding of a weight row of one element type, in
// chunks of 8 elements. Include after common.glsl, with exactly one of W_F32, W_F16, W_BF16,
// W_Q4_0, W_Q4_1, W_Q5_0, W_Q5_1, W_Q8_0, W_Q2_K, W_Q3_K, W_Q4_K, W_Q5_K, W_Q6_K, W_IQ4_NL,
// W_IQ4_XS, W_IQ2_XXS, W_IQ2_XS, W_IQ2_S, W_IQ3_XXS, W_IQ3_S, W_IQ1_S, W_IQ1_M defined (the last
// seven, the codebook types, read their codebooks at codebooks_address(), which the including
// shader defines from its push constants).
//
// A chunk is two runs of 4 consecutive elements (e0..e0+3 and e1..e1+3 of the row), chosen per
// type so that its codes sit in the same bytes (e.g. the low and high nibbles of 4 bytes of a
// Q4_0 block): chunk_elems() says where the runs are, decode_chunk() returns their 8 values
// (w[0..3] for run 0, w[4..7] for run 1). A row of n elements has chunk_count(n) chunks; for the
// quantized types n is a whole number of blocks and every chunk is full, for the float types
// (W_FLOAT) the last chunk may hold fewer than 8 elements and the rest of w is 0. Loops over a
// row read each group of GROUP chunks' block scales once (group_scales) and decode the group's
// chunks with them (decode_in_group); decode_chunk does both for one chunk.
//
// Values are those of the scalar reference (formats/quant/ref_*.cpp, blocks.h), computed with
// the same float operations in the same order; `precise` keeps the compiler from fusing a
// multiply and an add into one rounding, so a dequantized element equals the CPU's bit for bit.
//
// Block bytes are read as 16-bit words (blocks are only 2-byte aligned; W_ALIGNED16 float rows
// as 16-byte vectors); everything is widened to 32 bits at once.

uint ld_u8(uint64_t a) { return uint(U8s(a).v[0]); }
uint ld_u16(uint64_t a) { return uint(U16s(a).v[0]); }
// A little-endian 32-bit word at a 2-byte aligned address.
uint ld_u32(uint64_t a) { return ld_u16(a) | (ld_u16(a + 2) << 16); }
float ld_f16(uint64_t a) { return f16_to_f32(ld_u16(a)); }
// Byte i (0..3) of word v.
uint byte_of(uint v, uint i) { return (v >> (8 * i)) & 0xffu; }
// Byte i of v as a signed int8.
int sbyte_of(uint v, uint i) { return int(v << (24 - 8 * i)) >> 24; }

#if defined(W_IQ2_XXS) || defined(W_IQ2_XS) || defined(W_IQ2_S) || defined(W_IQ3_XXS) || defined(W_IQ3_S) || \
    defined(W_IQ1_S) || defined(W_IQ1_M)
#define W_IQ_CODEBOOK 1
#endif

#if defined(W_F32) || defined(W_F16) || defined(W_BF16)
#define W_FLOAT 1
const uint QK = 1;
#elif defined(W_Q2_K) || defined(W_Q3_K) || defined(W_Q4_K) || defined(W_Q5_K) || defined(W_Q6_K) || \
    defined(W_IQ4_XS) || defined(W_IQ_CODEBOOK)
const uint QK = 256;
#else
const uint QK = 32;
#endif

#if defined(W_Q4_0) || defined(W_IQ4_NL)
const uint BLOCK_BYTES = 18;
#elif defined(W_Q4_1)
const uint BLOCK_BYTES = 20;
#elif defined(W_Q5_0)
const uint BLOCK_BYTES = 22;
#elif defined(W_Q5_1)
const uint BLOCK_BYTES = 24;
#elif defined(W_Q8_0)
const uint BLOCK_BYTES = 34;
#elif defined(W_Q2_K)
const uint BLOCK_BYTES = 84;
#elif defined(W_Q3_K)
const uint BLOCK_BYTES = 110;
#elif defined(W_Q4_K)
const uint BLOCK_BYTES = 144;
#elif defined(W_Q5_K)
const uint BLOCK_BYTES = 176;
#elif defined(W_Q6_K)
const uint BLOCK_BYTES = 210;
#elif defined(W_IQ4_XS)
const uint BLOCK_BYTES = 136;
#elif defined(W_IQ2_XXS)
const uint BLOCK_BYTES = 66;
#elif defined(W_IQ2_XS)
const uint BLOCK_BYTES = 74;
#elif defined(W_IQ2_S)
const uint BLOCK_BYTES = 82;
#elif defined(W_IQ3_XXS)
const uint BLOCK_BYTES = 98;
#elif defined(W_IQ3_S)
const uint BLOCK_BYTES = 110;
#elif defined(W_IQ1_S)
const uint BLOCK_BYTES = 50;
#elif defined(W_IQ1_M)
const uint BLOCK_BYTES = 56;
#elif defined(W_F32)
const uint BLOCK_BYTES = 4;
#elif defined(W_F16) || defined(W_BF16)
const uint BLOCK_BYTES = 2;
#else
#error "dequant.glsl: no weight type defined"
#endif

#if defined(W_ALIGNED16)
// W_ALIGNED16 (float types, mul_mat only): every row starts 16-byte aligned and n is a multiple
// of 8, so a chunk is one or two 16-byte loads.
layout(buffer_reference, scalar, buffer_reference_align = 16) buffer WVec4s { vec4 v[]; };
layout(buffer_reference, scalar, buffer_reference_align = 16) buffer WUVec4s { uvec4 v[]; };
#endif

#if defined(W_IQ4_NL) || defined(W_IQ4_XS)
// IQ4_NL's code book (blocks.h kIq4nlValues).
const float kIq4[16] = float[](-127.0, -104.0, -83.0, -65.0, -49.0, -35.0, -22.0, -10.0, 1.0, 13.0, 25.0, 38.0,
                               53.0, 69.0, 89.0, 113.0);
#endif

#if defined(W_IQ_CODEBOOK)
// The codebook types (blocks.h, formats/quant/iq_grids.h): a chunk is one group of 8 elements (a
// codebook point, IQ3: two), a sub-block of 32 has one scale per 16 elements, and element j is
// (D * (1 + 2 sc)) * q with D = d * kIqDFactor and q = grid value * sign (IQ1: 8 g + 8 delta),
// the reference's order of operations. The codebooks are quant::IqGrids in device memory
// (Stream::codebooks); these are its members' byte offsets (checked in ops_matmul.cpp).
uint64_t codebooks_address();  // (defined by the including shader)
const uint kIq2xxsOffset = 0, kIq2xsOffset = 2048, kIq2sOffset = 6144, kIq3xxsOffset = 14336, kIq3sOffset = 15360,
           kIq1sOffset = 17408;
#if defined(W_IQ2_XXS) || defined(W_IQ2_XS) || defined(W_IQ2_S) || defined(W_IQ1_S) || defined(W_IQ1_M)
const float kIqDFactor = 0.125;
#elif defined(W_IQ3_XXS)
const float kIqDFactor = 0.25;
#else
const float kIqDFactor = 1.0;
#endif
// Entry i of the 8-byte codebook at `offset`: bytes 0..3, 4..7.
uvec2 grid8(uint offset, uint i) {
  U32s p = U32s(codebooks_address() + offset + 8 * i);
  return uvec2(p.v[0], p.v[1]);
}
// Entry i of the 4-byte codebook at `offset`.
uint grid4(uint offset, uint i) { return U32s(codebooks_address() + offset + 4 * i).v[0]; }
// The 8 signs of a group from its 7 stored bits (the count of minus signs is even).
uint iq_signs8(uint seven) {
  seven &= 127u;
  return seven | ((uint(bitCount(seven)) & 1u) << 7);
}
#endif

uint chunk_count(uint n) { return (n + 7) / 8; }

// Where chunk ch's two runs start in the row.
void chunk_elems(uint ch, out uint e0, out uint e1) {
#if defined(W_FLOAT)
  e0 = 8 * ch;
  e1 = e0 + 4;
#elif defined(W_Q4_0) || defined(W_Q4_1) || defined(W_Q5_0) || defined(W_Q5_1) || defined(W_IQ4_NL)
  // Nibble types: bytes 4c..4c+3 of the block, low nibbles elements 4c.., high 16+4c..
  e0 = 32 * (ch / 4) + 4 * (ch % 4);
  e1 = e0 + 16;
#elif defined(W_Q8_0) || defined(W_IQ_CODEBOOK)
  e0 = 8 * ch;
  e1 = e0 + 4;
#elif defined(W_Q2_K) || defined(W_Q3_K)
  // Bytes qs[32c + 4i ..] at shifts 2j and 2j+2: elements 128c + 32j + 4i and 32 further.
  const uint cb = ch % 32, c = cb / 16, j = 2 * ((cb / 8) % 2), i = cb % 8;
  e0 = 256 * (ch / 32) + 128 * c + 32 * j + 4 * i;
  e1 = e0 + 32;
#elif defined(W_Q4_K) || defined(W_Q5_K)
  // Bytes qs[32p + 4i ..]: low nibbles sub-block 2p, high nibbles sub-block 2p+1.
  const uint cb = ch % 32, p = cb / 8, i = cb % 8;
  e0 = 256 * (ch / 32) + 64 * p + 4 * i;
  e1 = e0 + 32;
#elif defined(W_Q6_K)
  // Bytes ql[64c + 32h + 4i ..]: low nibbles quarter h, high nibbles quarter h+2.
  const uint cb = ch % 32, c = cb / 16, h = (cb / 8) % 2, i = cb % 8;
  e0 = 256 * (ch / 32) + 128 * c + 32 * h + 4 * i;
  e1 = e0 + 64;
#elif defined(W_IQ4_XS)
  // Sub-block s laid out as an IQ4_NL block.
  const uint cb = ch % 32, s = cb / 4, c = cb % 4;
  e0 = 256 * (ch / 32) + 32 * s + 4 * c;
  e1 = e0 + 16;
#endif
}

#if defined(W_Q2_K) || defined(W_Q3_K)
// Q2_K/Q3_K chunk position inside its super-block: chunk c (0..1), shift pair j (0 or 2),
// byte group i (0..7).
void k16_pos(uint ch, out uint c, out uint j, out uint i) {
  const uint cb = ch % 32;
  c = cb / 16;
  j = 2 * ((cb / 8) % 2);
  i = cb % 8;
}
#endif

#if defined(W_Q3_K)
// Signed scale of sub-block s (blocks.h unpack_q3_k_scales); sc = the 12 scale bytes' address.
int q3_k_scale(uint64_t sc, uint s) {
  const uint low = s < 8 ? (ld_u8(sc + s) & 0xfu) : (ld_u8(sc + s - 8) >> 4);
  const uint high = (ld_u8(sc + 8 + s % 4) >> (2 * (s / 4))) & 3u;
  return int(low | (high << 4)) - 32;
}
#endif

#if defined(W_Q4_K) || defined(W_Q5_K)
// Scale and min codes of sub-block j (blocks.h unpack_q4_k_scale_min); sc = the scale bytes.
void q4_k_scale_min(uint64_t sc, uint j, out uint s, out uint m) {
  if (j < 4) {
    s = ld_u8(sc + j) & 63u;
    m = ld_u8(sc + j + 4) & 63u;
  } else {
    const uint b = ld_u8(sc + j + 4);
    s = (b & 0xfu) | ((ld_u8(sc + j - 4) >> 6) << 4);
    m = (b >> 4) | ((ld_u8(sc + j) >> 6) << 4);
  }
}
#endif

// Chunks come in groups of GROUP consecutive chunks that share their block scales (a legacy
// block, a Q4_K sub-block pair, ...): group_scales() reads them once for the group,
// decode_in_group() decodes one chunk of the group with them.
#if defined(W_FLOAT)
const uint GROUP = 1;
#elif defined(W_Q4_0) || defined(W_Q4_1) || defined(W_Q5_0) || defined(W_Q5_1) || defined(W_Q8_0) || \
    defined(W_IQ4_NL) || defined(W_IQ4_XS) || defined(W_IQ_CODEBOOK)
const uint GROUP = 4;
#else
const uint GROUP = 8;
#endif

// A group's scales: d[i] multiplies and m[i] offsets (or is subtracted, per type) the codes of
// the group's sub-block i (see decode_in_group for which); aux holds Q5_0/Q5_1's fifth bits.
struct Scales {
  vec4 d;
  vec4 m;
  uint aux;
};

void group_scales(uint64_t row, uint grp, out Scales s) {
  s.d = vec4(0.0);
  s.m = vec4(0.0);
  s.aux = 0;
#if !defined(W_FLOAT)
  const uint ch = grp * GROUP;
  const uint64_t b = row + uint64_t(ch / (QK / 8)) * BLOCK_BYTES;
#if defined(W_Q4_0) || defined(W_IQ4_NL) || defined(W_Q8_0)
  s.d.x = ld_f16(b);
#elif defined(W_Q4_1)
  s.d.x = ld_f16(b);
  s.m.x = ld_f16(b + 2);
#elif defined(W_Q5_0)
  s.d.x = ld_f16(b);
  s.aux = ld_u32(b + 2);
#elif defined(W_Q5_1)
  s.d.x = ld_f16(b);
  s.m.x = ld_f16(b + 2);
  s.aux = ld_u32(b + 4);
#elif defined(W_Q2_K)
  // Sub-blocks s0 .. s0+3 (run 0 of the group's two halves, then run 1's).
  uint c, j, i;
  k16_pos(ch, c, j, i);
  const float d = ld_f16(b + 80), dmin = ld_f16(b + 82);
  const uint s0 = 8 * c + 2 * j;
  for (uint t = 0; t < 4; ++t) {
    const uint sc = ld_u8(b + s0 + t);
    precise float dl = d * float(sc & 0xfu);
    precise float ml = dmin * float(sc >> 4);
    s.d[t] = dl;
    s.m[t] = ml;
  }
#elif defined(W_Q3_K)
  uint c, j, i;
  k16_pos(ch, c, j, i);
  const float d = ld_f16(b + 108);
  const uint s0 = 8 * c + 2 * j;
  for (uint t = 0; t < 4; ++t) {
    precise float dl = d * float(q3_k_scale(b + 96, s0 + t));
    s.d[t] = dl;
  }
#elif defined(W_Q4_K) || defined(W_Q5_K)
  // Sub-blocks 2p (run 0) and 2p+1 (run 1).
  const uint p = (ch % 32) / 8;
  const float d = ld_f16(b), dmin = ld_f16(b + 2);
  for (uint t = 0; t < 2; ++t) {
    uint sc, mc;
    q4_k_scale_min(b + 4, 2 * p + t, sc, mc);
    precise float dl = d * float(sc);
    precise float ml = dmin * float(mc);
    s.d[t] = dl;
    s.m[t] = ml;
  }
#elif defined(W_Q6_K)
  // Sub-blocks s0, s0+1 (run 0 of the two halves), s0+4, s0+5 (run 1).
  const uint cb = ch % 32, c = cb / 16, h = (cb / 8) % 2;
  const float d = ld_f16(b + 208);
  const uint s0 = 8 * c + 2 * h;
  for (uint t = 0; t < 4; ++t) {
    precise float dl = d * float(sbyte_of(ld_u8(b + 192 + s0 + (t & 1u) + 4 * (t >> 1)), 0));
    s.d[t] = dl;
  }
#elif defined(W_IQ4_XS)
  const uint sb = (ch % 32) / 4;
  const float d = ld_f16(b);
  const uint ls = ((ld_u8(b + 4 + sb / 2) >> (4 * (sb % 2))) & 0xfu) | (((ld_u16(b + 2) >> (2 * sb)) & 3u) << 4);
  precise float dl = d * float(int(ls) - 32);
  s.d.x = dl;
#elif defined(W_IQ_CODEBOOK)
  // Sub-block sb: d.x scales its chunks 0, 1 (elements 0..15), d.y chunks 2, 3; aux holds what
  // its chunks share (IQ2_XXS/IQ3_XXS: the sign and scale word; IQ2_S/IQ3_S: the high index
  // bits; IQ1_S/IQ1_M: the 16-bit qh word).
  const uint sb = (ch % 32) / 4;
  uint sc0, sc1;
#if defined(W_IQ1_M)
  uint dbits = 0;
  for (uint i = 0; i < 4; ++i) dbits |= (ld_u16(b + 48 + 2 * i) >> 12) << (4 * i);
  const float d = f16_to_f32(dbits);
  const uint sw = ld_u16(b + 48 + 2 * (sb / 2)) >> (6 * (sb % 2));
  sc0 = sw & 7u;
  sc1 = (sw >> 3) & 7u;
  s.aux = ld_u16(b + 32 + 2 * sb);
#else
  const float d = ld_f16(b);
#if defined(W_IQ2_XXS)
  s.aux = ld_u32(b + 2 + 8 * sb + 4);
  sc0 = sc1 = s.aux >> 28;
#elif defined(W_IQ3_XXS)
  s.aux = ld_u32(b + 2 + 64 + 4 * sb);
  sc0 = sc1 = s.aux >> 28;
#elif defined(W_IQ2_XS)
  const uint sc = ld_u8(b + 66 + sb);
  sc0 = sc & 15u;
  sc1 = sc >> 4;
#elif defined(W_IQ2_S)
  const uint sc = ld_u8(b + 74 + sb);
  sc0 = sc & 15u;
  sc1 = sc >> 4;
  s.aux = ld_u8(b + 66 + sb);
#elif defined(W_IQ3_S)
  sc0 = sc1 = (ld_u8(b + 106 + sb / 2) >> (4 * (sb % 2))) & 15u;
  s.aux = ld_u8(b + 66 + sb);
#elif defined(W_IQ1_S)
  s.aux = ld_u16(b + 34 + 2 * sb);
  sc0 = sc1 = (s.aux >> 12) & 7u;
#endif
#endif
  precise float dd = d * kIqDFactor;
  precise float dl0 = dd * float(1 + 2 * sc0);
  precise float dl1 = dd * float(1 + 2 * sc1);
  s.d.x = dl0;
  s.d.y = dl1;
#endif
#endif
}

// The 8 values of chunk ch (of group ch / GROUP, whose scales are s) of the row at `row` (n
// elements in the row).
void decode_in_group(uint64_t row, uint ch, uint n, Scales s, out float w[8]) {
#if defined(W_FLOAT) && defined(W_ALIGNED16)
#if defined(W_F32)
  const vec4 a = WVec4s(row).v[2 * ch], b = WVec4s(row).v[2 * ch + 1];
  [[unroll]] for (uint i = 0; i < 4; ++i) {
    w[i] = a[i];
    w[4 + i] = b[i];
  }
#else
  const uvec4 q = WUVec4s(row).v[ch];
  [[unroll]] for (uint i = 0; i < 4; ++i) {
#if defined(W_F16)
    const vec2 v = unpackHalf2x16(q[i]);
#else
    const vec2 v = vec2(uintBitsToFloat(q[i] << 16), uintBitsToFloat(q[i] & 0xffff0000u));
#endif
    w[2 * i] = v.x;
    w[2 * i + 1] = v.y;
  }
#endif
#elif defined(W_FLOAT)
  const uint e = 8 * ch;
  for (uint i = 0; i < 8; ++i) {
    if (e + i < n) {
#if defined(W_F32)
      w[i] = F32s(row).v[e + i];
#elif defined(W_F16)
      w[i] = f16_to_f32(uint(U16s(row).v[e + i]));
#else
      w[i] = bf16_to_f32(uint(U16s(row).v[e + i]));
#endif
    } else {
      w[i] = 0.0;
    }
  }
#else
  const uint64_t b = row + uint64_t(ch / (QK / 8)) * BLOCK_BYTES;
#if defined(W_Q4_0) || defined(W_Q4_1) || defined(W_IQ4_NL)
  const uint c = ch % 4;
  const float d = s.d.x;
#if defined(W_Q4_1)
  const float m = s.m.x;
  const uint qs = ld_u32(b + 4 + 4 * c);
#else
  const uint qs = ld_u32(b + 2 + 4 * c);
#endif
  for (uint i = 0; i < 4; ++i) {
    const uint lo = byte_of(qs, i) & 0xfu, hi = byte_of(qs, i) >> 4;
#if defined(W_Q4_0)
    precise float v0 = float(int(lo) - 8) * d;
    precise float v1 = float(int(hi) - 8) * d;
#elif defined(W_Q4_1)
    precise float v0 = float(lo) * d + m;
    precise float v1 = float(hi) * d + m;
#else
    precise float v0 = d * kIq4[lo];
    precise float v1 = d * kIq4[hi];
#endif
    w[i] = v0;
    w[4 + i] = v1;
  }
#elif defined(W_Q5_0) || defined(W_Q5_1)
  const uint c = ch % 4;
  const float d = s.d.x;
  const uint qh = s.aux;
#if defined(W_Q5_1)
  const float m = s.m.x;
  const uint qs = ld_u32(b + 8 + 4 * c);
#else
  const uint qs = ld_u32(b + 6 + 4 * c);
#endif
  for (uint i = 0; i < 4; ++i) {
    const uint j = 4 * c + i;  // element j and j + 16
    const uint lo = (byte_of(qs, i) & 0xfu) | (((qh >> j) & 1u) << 4);
    const uint hi = (byte_of(qs, i) >> 4) | (((qh >> (j + 16)) & 1u) << 4);
#if defined(W_Q5_0)
    precise float v0 = float(int(lo) - 16) * d;
    precise float v1 = float(int(hi) - 16) * d;
#else
    precise float v0 = float(lo) * d + m;
    precise float v1 = float(hi) * d + m;
#endif
    w[i] = v0;
    w[4 + i] = v1;
  }
#elif defined(W_Q8_0)
  const uint c = ch % 4;
  const float d = s.d.x;
  const uint q0 = ld_u32(b + 2 + 8 * c), q1 = ld_u32(b + 6 + 8 * c);
  for (uint i = 0; i < 4; ++i) {
    precise float v0 = float(sbyte_of(q0, i)) * d;
    precise float v1 = float(sbyte_of(q1, i)) * d;
    w[i] = v0;
    w[4 + i] = v1;
  }
#elif defined(W_Q2_K)
  uint c, j, i;
  k16_pos(ch, c, j, i);
  const uint half_ = i / 4;  // run 0: sub-block s0 + half_, run 1: s0 + 2 + half_
  const float dl0 = s.d[half_], ml0 = s.m[half_], dl1 = s.d[2 + half_], ml1 = s.m[2 + half_];
  const uint qs = ld_u32(b + 16 + 32 * c + 4 * i);
  for (uint t = 0; t < 4; ++t) {
    const uint by = byte_of(qs, t);
    precise float v0 = dl0 * float((by >> (2 * j)) & 3u) - ml0;
    precise float v1 = dl1 * float((by >> (2 * j + 2)) & 3u) - ml1;
    w[t] = v0;
    w[4 + t] = v1;
  }
#elif defined(W_Q3_K)
  uint c, j, i;
  k16_pos(ch, c, j, i);
  const uint half_ = i / 4;
  const float dl0 = s.d[half_], dl1 = s.d[2 + half_];
  const uint qs = ld_u32(b + 32 + 32 * c + 4 * i);
  const uint hm = ld_u32(b + 4 * i);
  const uint hb = 4 * c + j;  // hmask bit of run 0 (element / 32); run 1 is the next bit
  for (uint t = 0; t < 4; ++t) {
    const uint by = byte_of(qs, t), h = byte_of(hm, t);
    const int q0 = int((by >> (2 * j)) & 3u) - (((h >> hb) & 1u) != 0 ? 0 : 4);
    const int q1 = int((by >> (2 * j + 2)) & 3u) - (((h >> (hb + 1)) & 1u) != 0 ? 0 : 4);
    precise float v0 = dl0 * float(q0);
    precise float v1 = dl1 * float(q1);
    w[t] = v0;
    w[4 + t] = v1;
  }
#elif defined(W_Q4_K) || defined(W_Q5_K)
  const uint cb = ch % 32, p = cb / 8, i = cb % 8;
  const float d0 = s.d.x, m0 = s.m.x, d1 = s.d.y, m1 = s.m.y;
#if defined(W_Q4_K)
  const uint qs = ld_u32(b + 16 + 32 * p + 4 * i);
#else
  const uint qs = ld_u32(b + 48 + 32 * p + 4 * i);
  const uint qh = ld_u32(b + 16 + 4 * i);
#endif
  for (uint t = 0; t < 4; ++t) {
    uint lo = byte_of(qs, t) & 0xfu, hi = byte_of(qs, t) >> 4;
#if defined(W_Q5_K)
    lo += ((byte_of(qh, t) >> (2 * p)) & 1u) << 4;
    hi += ((byte_of(qh, t) >> (2 * p + 1)) & 1u) << 4;
#endif
    precise float v0 = d0 * float(lo) - m0;
    precise float v1 = d1 * float(hi) - m1;
    w[t] = v0;
    w[4 + t] = v1;
  }
#elif defined(W_Q6_K)
  const uint cb = ch % 32, c = cb / 16, h = (cb / 8) % 2, i = cb % 8;
  const uint half_ = i / 4;  // run 0: s.d[half_], run 1: s.d[2 + half_]
  const float dl0 = s.d[half_], dl1 = s.d[2 + half_];
  const uint ql = ld_u32(b + 64 * c + 32 * h + 4 * i);
  const uint qh = ld_u32(b + 128 + 32 * c + 4 * i);
  for (uint t = 0; t < 4; ++t) {
    const uint lb = byte_of(ql, t), hb = byte_of(qh, t);
    const int q0 = int((lb & 0xfu) | (((hb >> (2 * h)) & 3u) << 4)) - 32;
    const int q1 = int((lb >> 4) | (((hb >> (2 * h + 4)) & 3u) << 4)) - 32;
    precise float v0 = dl0 * float(q0);
    precise float v1 = dl1 * float(q1);
    w[t] = v0;
    w[4 + t] = v1;
  }
#elif defined(W_IQ4_XS)
  const uint cb = ch % 32, sb = cb / 4, c = cb % 4;
  const float dl = s.d.x;
  const uint qs = ld_u32(b + 8 + 16 * sb + 4 * c);
  for (uint t = 0; t < 4; ++t) {
    precise float v0 = dl * kIq4[byte_of(qs, t) & 0xfu];
    precise float v1 = dl * kIq4[byte_of(qs, t) >> 4];
    w[t] = v0;
    w[4 + t] = v1;
  }
#elif defined(W_IQ_CODEBOOK)
  const uint sb = (ch % 32) / 4, l = ch % 4;  // group l of sub-block sb
  const float dl = l < 2 ? s.d.x : s.d.y;
  uvec2 g;  // the group's 8 grid bytes
#if defined(W_IQ1_S) || defined(W_IQ1_M)
#if defined(W_IQ1_S)
  const uint hi = (s.aux >> (3 * l)) & 7u;
  const bool minus = (s.aux >> 15) != 0;
  g = grid8(kIq1sOffset, ld_u8(b + 2 + 4 * sb + l) | (hi << 8));
#else
  const uint nib = (s.aux >> (4 * l)) & 15u;
  const bool minus = (nib & 8u) != 0;
  g = grid8(kIq1sOffset, ld_u8(b + 4 * sb + l) | ((nib & 7u) << 8));
#endif
  for (uint t = 0; t < 4; ++t) {
    precise float v0 = dl * float(8 * sbyte_of(g.x, t) + (minus ? -1 : 1));
    precise float v1 = dl * float(8 * sbyte_of(g.y, t) + (minus ? -1 : 1));
    w[t] = v0;
    w[4 + t] = v1;
  }
#else
  uint signs;
#if defined(W_IQ2_XXS)
  g = grid8(kIq2xxsOffset, ld_u8(b + 2 + 8 * sb + l));
  signs = iq_signs8(s.aux >> (7 * l));
#elif defined(W_IQ2_XS)
  const uint v = ld_u16(b + 2 + 8 * sb + 2 * l);
  g = grid8(kIq2xsOffset, v & 511u);
  signs = iq_signs8(v >> 9);
#elif defined(W_IQ2_S)
  g = grid8(kIq2sOffset, ld_u8(b + 2 + 4 * sb + l) | (((s.aux >> (2 * l)) & 3u) << 8));
  signs = ld_u8(b + 34 + 4 * sb + l);
#elif defined(W_IQ3_XXS)
  g = uvec2(grid4(kIq3xxsOffset, ld_u8(b + 2 + 8 * sb + 2 * l)), grid4(kIq3xxsOffset, ld_u8(b + 3 + 8 * sb + 2 * l)));
  signs = iq_signs8(s.aux >> (7 * l));
#elif defined(W_IQ3_S)
  g = uvec2(grid4(kIq3sOffset, ld_u8(b + 2 + 8 * sb + 2 * l) | (((s.aux >> (2 * l)) & 1u) << 8)),
            grid4(kIq3sOffset, ld_u8(b + 3 + 8 * sb + 2 * l) | (((s.aux >> (2 * l + 1)) & 1u) << 8)));
  signs = ld_u8(b + 74 + 4 * sb + l);
#endif
  for (uint t = 0; t < 4; ++t) {
    const int q0 = int(byte_of(g.x, t)), q1 = int(byte_of(g.y, t));
    precise float v0 = dl * float(((signs >> t) & 1u) != 0 ? -q0 : q0);
    precise float v1 = dl * float(((signs >> (4 + t)) & 1u) != 0 ? -q1 : q1);
    w[t] = v0;
    w[4 + t] = v1;
  }
#endif
#endif
#endif
}

// The 8 values of chunk ch of the row at `row` (n elements in the row).
void decode_chunk(uint64_t row, uint ch, uint n, out float w[8]) {
  Scales s;
  group_scales(row, ch / GROUP, s);
  decode_in_group(row, ch, n, s, w);
}

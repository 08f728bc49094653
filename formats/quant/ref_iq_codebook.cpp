// The codebook types IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS and IQ3_S: decoding (quantizers
// in ref_iq_codebook_quant.cpp), and random blocks for synthetic models.
#include <cmath>
#include <cstring>
#include <vector>

#include "formats/quant/iq_grids.h"
#include "formats/quant/ref.h"
#include "formats/quant/types.h"
#include "src/base/half.h"

namespace kite::quant {
namespace {

// Sub-block s as codes and scales (iq_grids.h).
struct IqSub {
  int8_t q[32];
  int32_t scale[2];
};

// 8 elements of group point `p` (bytes) with sign bits `signs` into q.
void put8(uint64_t p, uint8_t signs, int8_t* q) {
  for (int j = 0; j < 8; ++j) {
    const auto g = static_cast<int8_t>(p >> (8 * j) & 0xff);
    q[j] = static_cast<int8_t>(signs >> j & 1 ? -g : g);
  }
}

// IQ1: point p (int8 -1/0/1 bytes) plus delta (+-1/8), times 8.
void put8_iq1(uint64_t p, bool minus, int8_t* q) {
  for (int j = 0; j < 8; ++j)
    q[j] = static_cast<int8_t>(8 * static_cast<int8_t>(p >> (8 * j) & 0xff) + (minus ? -1 : 1));
}

void iq_sub(const BlockIQ2_XXS& b, int s, IqSub* out) {
  uint32_t aux[2];
  std::memcpy(aux, b.qs + 4 * s, sizeof aux);
  const IqGrids& g = iq_grids();
  for (int l = 0; l < 4; ++l) put8(g.iq2xxs[aux[0] >> (8 * l) & 0xff], iq_signs8(aux[1] >> (7 * l)), out->q + 8 * l);
  iq_scales(b, s, out->scale);
}

void iq_sub(const BlockIQ2_XS& b, int s, IqSub* out) {
  const IqGrids& g = iq_grids();
  for (int l = 0; l < 4; ++l) {
    const uint16_t v = b.qs[4 * s + l];
    put8(g.iq2xs[v & 511], iq_signs8(v >> 9), out->q + 8 * l);
  }
  iq_scales(b, s, out->scale);
}

void iq_sub(const BlockIQ2_S& b, int s, IqSub* out) {
  const IqGrids& g = iq_grids();
  for (int l = 0; l < 4; ++l) {
    const int idx = b.qs[4 * s + l] | (b.qh[s] >> (2 * l) & 3) << 8;
    put8(g.iq2s[idx], b.qs[kQK_K / 8 + 4 * s + l], out->q + 8 * l);
  }
  iq_scales(b, s, out->scale);
}

void iq_sub(const BlockIQ3_XXS& b, int s, IqSub* out) {
  uint32_t aux;
  std::memcpy(&aux, b.qs + kQK_K / 4 + 4 * s, sizeof aux);
  const IqGrids& g = iq_grids();
  for (int l = 0; l < 4; ++l) {
    const uint64_t p = g.iq3xxs[b.qs[8 * s + 2 * l]] | uint64_t{g.iq3xxs[b.qs[8 * s + 2 * l + 1]]} << 32;
    put8(p, iq_signs8(aux >> (7 * l)), out->q + 8 * l);
  }
  iq_scales(b, s, out->scale);
}

void iq_sub(const BlockIQ3_S& b, int s, IqSub* out) {
  const IqGrids& g = iq_grids();
  for (int l = 0; l < 4; ++l) {
    const int i0 = 8 * s + 2 * l, i1 = i0 + 1;
    const uint64_t p = g.iq3s[b.qs[i0] | (b.qh[s] >> (i0 % 8) & 1) << 8] |
                       uint64_t{g.iq3s[b.qs[i1] | (b.qh[s] >> (i1 % 8) & 1) << 8]} << 32;
    put8(p, b.signs[4 * s + l], out->q + 8 * l);
  }
  iq_scales(b, s, out->scale);
}

void iq_sub(const BlockIQ1_S& b, int s, IqSub* out) {
  const IqGrids& g = iq_grids();
  const uint16_t qh = b.qh[s];
  for (int l = 0; l < 4; ++l) put8_iq1(g.iq1s[b.qs[4 * s + l] | (qh >> (3 * l) & 7) << 8], qh >> 15, out->q + 8 * l);
  iq_scales(b, s, out->scale);
}

void iq_sub(const BlockIQ1_M& b, int s, IqSub* out) {
  const IqGrids& g = iq_grids();
  for (int l = 0; l < 4; ++l) {
    const int nib = b.qh[2 * s + l / 2] >> (4 * (l % 2)) & 0xf;
    put8_iq1(g.iq1s[b.qs[4 * s + l] | (nib & 7) << 8], (nib & 8) != 0, out->q + 8 * l);
  }
  iq_scales(b, s, out->scale);
}

}  // namespace

namespace ref {
namespace {

template <typename Block>
void dequantize_codebook(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const Block*>(src);
  IqSub sub;
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float d = fp16_to_fp32(iq_d_bits(b[i])) * kIqDFactor<Block>;
    for (int s = 0; s < kQK_K / 32; ++s, dst += 32) {
      iq_sub(b[i], s, &sub);
      for (int j = 0; j < 32; ++j) dst[j] = d * static_cast<float>(sub.scale[j / 16]) * static_cast<float>(sub.q[j]);
    }
  }
}

}  // namespace

void dequantize_iq2_xxs(const void* src, float* dst, int64_t n) {
  dequantize_codebook<BlockIQ2_XXS>(src, dst, n);
}
void dequantize_iq2_xs(const void* src, float* dst, int64_t n) {
  dequantize_codebook<BlockIQ2_XS>(src, dst, n);
}
void dequantize_iq2_s(const void* src, float* dst, int64_t n) {
  dequantize_codebook<BlockIQ2_S>(src, dst, n);
}
void dequantize_iq3_xxs(const void* src, float* dst, int64_t n) {
  dequantize_codebook<BlockIQ3_XXS>(src, dst, n);
}
void dequantize_iq3_s(const void* src, float* dst, int64_t n) {
  dequantize_codebook<BlockIQ3_S>(src, dst, n);
}
void dequantize_iq1_s(const void* src, float* dst, int64_t n) {
  dequantize_codebook<BlockIQ1_S>(src, dst, n);
}
void dequantize_iq1_m(const void* src, float* dst, int64_t n) {
  dequantize_codebook<BlockIQ1_M>(src, dst, n);
}

}  // namespace ref
namespace {

void set_d(BlockIQ1_M& b, half_bits d) {  // d's nibbles on top of the four scale words
  for (int w = 0; w < 4; ++w)
    b.scales[2 * w + 1] = static_cast<uint8_t>((b.scales[2 * w + 1] & 0x0f) | ((d >> (4 * w)) & 0xf) << 4);
}
template <typename Block>
void set_d(Block& b, half_bits d) {
  b.d = d;
}

template <typename Block>
void randomize(void* dst, int64_t n, uint64_t seed, float rms) {
  auto* b = static_cast<Block*>(dst);
  float y[kQK_K];
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    auto* bytes = reinterpret_cast<uint8_t*>(&b[i]);
    for (size_t j = 0; j < sizeof(Block); ++j) {  // splitmix64, a byte a step
      uint64_t z = (seed += 0x9e3779b97f4a7c15ull);
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      bytes[j] = static_cast<uint8_t>(z ^ (z >> 31));
    }
    set_d(b[i], fp32_to_fp16(1.f));
    ref::dequantize_codebook<Block>(&b[i], y, kQK_K);
    double s2 = 0;
    for (float v : y) s2 += static_cast<double>(v) * v;
    set_d(b[i], fp32_to_fp16(rms / static_cast<float>(std::sqrt(s2 / kQK_K))));
  }
}

}  // namespace

// Calls fn(Block{}) with the block struct of codebook type t; false for any other type.
template <class Fn>
bool with_codebook_block(Type t, Fn&& fn) {
  switch (t) {
    case Type::IQ2_XXS: fn(BlockIQ2_XXS{}); return true;
    case Type::IQ2_XS: fn(BlockIQ2_XS{}); return true;
    case Type::IQ2_S: fn(BlockIQ2_S{}); return true;
    case Type::IQ3_XXS: fn(BlockIQ3_XXS{}); return true;
    case Type::IQ3_S: fn(BlockIQ3_S{}); return true;
    case Type::IQ1_S: fn(BlockIQ1_S{}); return true;
    case Type::IQ1_M: fn(BlockIQ1_M{}); return true;
    default: return false;
  }
}

bool is_codebook_type(Type t) {
  return with_codebook_block(t, [](auto) {});
}

bool can_randomize(Type t) {
  return is_codebook_type(t);
}

Status random_blocks(Type t, void* dst, int64_t n, uint64_t seed, float rms) {
  KITE_ASSIGN_OR_RETURN(size_t bytes, row_size(t, n));  // (an unknown type or partial blocks)
  (void)bytes;
  if (!with_codebook_block(t, [&](auto block) { randomize<decltype(block)>(dst, n, seed, rms); }))
    return make_error("cannot make random blocks of type ", find_traits(t)->name);
  return ok_status();
}

}  // namespace kite::quant

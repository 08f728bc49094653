// Non-linear 4-bit types: IQ4_NL (32-element blocks) and IQ4_XS (256-element super-blocks).
//
// Both store indices into kIq4nlValues. Quantizers: IQ4_NL uses the exact scale sweep on the
// non-uniform grid; IQ4_XS the symmetric two-level search of superblock.h with that grid.
#include <algorithm>
#include <cstring>

#include "formats/quant/blocks.h"
#include "formats/quant/fit.h"
#include "formats/quant/ref.h"
#include "formats/quant/superblock.h"
#include "src/base/half.h"

namespace kite::quant::ref {
namespace {

const fit::Grid& iq4_grid() {
  static const fit::Grid grid = fit::table_grid(kIq4nlValues, 16);
  return grid;
}

// 32 indices as nibbles: element j low in qs[j], element j+16 high.
void pack_nibbles(const uint8_t* q, uint8_t* qs) {
  for (int j = 0; j < 16; ++j) qs[j] = static_cast<uint8_t>((q[j] & 0xF) | ((q[j + 16] & 0xF) << 4));
}

}  // namespace

// --- IQ4_NL --------------------------------------------------------------------------------

void dequantize_iq4_nl(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockIQ4_NL*>(src);
  for (int64_t i = 0; i < n / kQK4_NL; ++i, dst += kQK4_NL) {
    const float d = fp16_to_fp32(b[i].d);
    for (int j = 0; j < 16; ++j) {
      dst[j] = d * static_cast<float>(kIq4nlValues[b[i].qs[j] & 0xF]);
      dst[j + 16] = d * static_cast<float>(kIq4nlValues[b[i].qs[j] >> 4]);
    }
  }
}

void quantize_iq4_nl(const float* src, void* dst, int64_t n) { quantize_iq4_nl_w(src, dst, n, nullptr); }

void quantize_iq4_nl_w(const float* src, void* dst, int64_t n, const float* w) {
  auto* b = static_cast<BlockIQ4_NL*>(dst);
  const fit::Grid& g = iq4_grid();
  for (int64_t i = 0; i < n / kQK4_NL; ++i, src += kQK4_NL, w = w ? w + kQK4_NL : nullptr) {
    uint8_t q[32];
    const float d = fit::fit_grid_scale(src, w, 32, g, q, window_for(g));
    b[i].d = finalize_half_scale(src, w, 32, g, d, q);
    pack_nibbles(q, b[i].qs);
  }
}

// --- IQ4_XS --------------------------------------------------------------------------------

void dequantize_iq4_xs(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockIQ4_XS*>(src);
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float d = fp16_to_fp32(b[i].d);
    for (int s = 0; s < 8; ++s, dst += 32) {
      const float dl = d * static_cast<float>(unpack_iq4_xs_scale(b[i], s) - 32);
      const uint8_t* qs = b[i].qs + 16 * s;
      for (int j = 0; j < 16; ++j) {
        dst[j] = dl * static_cast<float>(kIq4nlValues[qs[j] & 0xF]);
        dst[j + 16] = dl * static_cast<float>(kIq4nlValues[qs[j] >> 4]);
      }
    }
  }
}

void quantize_iq4_xs(const float* src, void* dst, int64_t n) { quantize_iq4_xs_w(src, dst, n, nullptr); }

void quantize_iq4_xs_w(const float* src, void* dst, int64_t n, const float* w) {
  auto* b = static_cast<BlockIQ4_XS*>(dst);
  static const fit::Grid codes = fit::uniform_grid(-32, 31);
  const SymmetricSpec spec{8, 32, &iq4_grid(), -32, 31, &codes};
  for (int64_t i = 0; i < n / kQK_K; ++i, src += kQK_K, w = w ? w + kQK_K : nullptr) {
    SymmetricCodes c;
    quantize_symmetric_superblock(src, w, spec, &c);
    b[i].d = c.d;
    // Scale codes ls = sc + 32 (6 bits): low nibbles two per byte, high 2 bits in scales_h.
    b[i].scales_h = 0;
    std::memset(b[i].scales_l, 0, sizeof(b[i].scales_l));
    for (int s = 0; s < 8; ++s) {
      const int ls = c.sc[s] + 32;
      b[i].scales_l[s / 2] |= static_cast<uint8_t>((ls & 0xF) << (4 * (s % 2)));
      b[i].scales_h |= static_cast<uint16_t>((ls >> 4) << (2 * s));
    }
    for (int s = 0; s < 8; ++s) pack_nibbles(c.q + 32 * s, b[i].qs + 16 * s);
  }
}

}  // namespace kite::quant::ref

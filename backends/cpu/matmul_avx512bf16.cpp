// BF16 weights against BF16 activations for CPUs with AVX512-BF16 (Zen 4 and later, Cooper Lake,
// Sapphire Rapids): compiled with the AVX-512 level's flags plus -mavx512bf16, and installed by
// that level (add_avx512bf16_kernels) only where the CPU has the extension. vdpbf16ps multiplies
// 32 pairs where an FMA multiplies 16, and the weights need no widening: twice the prefill of
// BF16 weights on f32 FMAs. The activations are rounded to bf16 first (8 significant bits, as
// llama.cpp and PyTorch's bf16 matmuls do; KITE_CPU_BF16_ACT=f32 keeps them f32, ops_matmul.cpp).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "backends/cpu/matmul.h"

namespace {

inline uint16_t bf16_rne(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  if ((b & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((b >> 16) | 0x40);  // quiet NaN
  return static_cast<uint16_t>((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}

inline float bf16_f32(uint16_t h) {
  const uint32_t b = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

inline __m512bh bf16x32(const void* p) {
  const __m512i t = _mm512_loadu_si512(p);
  return reinterpret_cast<const __m512bh&>(t);
}

// ActFormat::kBF16: k values rounded to nearest even.
void quantize_bf16(const float* x, void* dst, int64_t k) {
  auto* o = static_cast<uint16_t*>(dst);
  int64_t i = 0;
  for (; i + 32 <= k; i += 32) {
    const __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(x + i));
    _mm512_storeu_si512(o + i, reinterpret_cast<const __m512i&>(v));
  }
  for (; i < k; ++i) o[i] = bf16_rne(x[i]);
}

// fgemm's policy (matmul_x86_fgemm.inc): 32 bf16 pairs a step into 16 f32 lanes.
struct BMul {
  using Act = uint16_t;
  using Acc = __m512;
  using W = __m512bh;
  using A = __m512bh;
  static constexpr int kStep = 32;
  static constexpr int kWBytes = 2;
  static __m512 zero() { return _mm512_setzero_ps(); }
  static __m512bh load_w(const uint8_t* w, int64_t i) { return bf16x32(w + 2 * i); }
  static __m512bh load_a(const uint16_t* a, int64_t i) { return bf16x32(a + i); }
  static __m512 madd(__m512 acc, __m512bh w, __m512bh a) { return _mm512_dpbf16_ps(acc, w, a); }
  static float finish(__m512 acc, const uint8_t* w, const uint16_t* a, int64_t i, int64_t k) {
    float v = _mm512_reduce_add_ps(acc);
    const auto* wr = reinterpret_cast<const uint16_t*>(w);
    for (; i < k; ++i) v += bf16_f32(wr[i]) * bf16_f32(a[i]);
    return v;
  }
};

#include "backends/cpu/matmul_x86_fgemm.inc"

}  // namespace

namespace kite::cpu {

void add_avx512bf16_kernels(MatmulKernels* m) {
  m->quantize_bf16 = quantize_bf16;
  m->bgemm = fgemm<BMul>;
}

}  // namespace kite::cpu

// kite/src/base/fast_exp.h — exp over a whole row of logits, in loops the compiler vectorizes.
//
// std::exp is a call per element (~2-4 ns); a softmax or a draw over a 128K vocabulary makes
// 128K of them per row. exp_approx is branch-free float and integer arithmetic that GCC and
// Clang vectorize at -O3 (every select is an integer mask: a float compare in a select keeps
// GCC from if-converting while FP traps are on). The CPU top_k op and the host sampler both draw
// with it, so their weights — and tokens — are bit-identical.
#pragma once

#include <bit>
#include <cstdint>
#include <limits>

namespace kite {

// exp(x) within 1 ulp of std::exp for x in [-87.33, 88.3] (Cody-Waite range reduction by ln 2
// in two parts, then Cephes' degree-6 polynomial for expf); 0 below -87.33 (no subnormals),
// -inf and NaNs with the sign bit included; exp(88.3) above 88.3. A NaN without the sign bit
// gives a garbage value: callers mask NaN themselves (exp_masked).
inline float exp_approx(float x) {
  const int32_t xi = std::bit_cast<int32_t>(x);
  constexpr int32_t lo = std::bit_cast<int32_t>(-87.33f), hi = std::bit_cast<int32_t>(88.3f);
  // All ones where x < -87.33: as unsigned, negative floats order by magnitude above positives.
  const int32_t under = -static_cast<int32_t>(static_cast<uint32_t>(xi) > static_cast<uint32_t>(lo));
  x = std::bit_cast<float>(((xi > hi ? hi : xi) & ~under) | (lo & under));
  constexpr float kMagic = 12582912.f;  // 1.5 * 2^23: adding it rounds to an integer
  const float t = x * 1.44269504088896341f + kMagic;
  const float n = t - kMagic;
  const int32_t k = std::bit_cast<int32_t>(t) - std::bit_cast<int32_t>(kMagic);
  const float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;  // x - n ln 2, in two parts
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3333465755e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.f;
  const int32_t e = std::bit_cast<int32_t>(y * std::bit_cast<float>((k + 127) << 23));
  return std::bit_cast<float>(e & ~under);
}

// exp((v - m) * s) for an allowed logit v (above -inf, not NaN), else 0: a sampling weight.
inline float exp_masked(float v, float m, float s) {
  const int32_t keep = -static_cast<int32_t>(v > -std::numeric_limits<float>::infinity());  // (false for NaN)
  return std::bit_cast<float>(std::bit_cast<int32_t>(exp_approx((v - m) * s)) & keep);
}

}  // namespace kite

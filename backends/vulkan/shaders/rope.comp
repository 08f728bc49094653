// kite/backends/vulkan/shaders/rope.comp — rotary position embedding (semantics: the CPU's
// op_rope). One invocation per (rotated pair or passed-through element, head, token).
//
// Accuracy: theta = pos * inv_freq reaches thousands of radians, so neither pow() nor sin/cos
// builtins (whose precision Vulkan barely bounds) are used. inv_freq(i) = 2^(-2i * M) with
// M = log2(base) / n_rot given as three floats m1 + m2 + m3 (m1, m2 of 11 bits, so 2i * m1 and
// 2i * m2 are exact); the integer part of the exponent is split off exactly and 2^frac is a
// Taylor polynomial. sin/cos reduce theta by pi/2 in four parts (Cody-Waite: the first two
// subtractions are exact) and evaluate Taylor polynomials on [-pi/4, pi/4].
#version 460
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = 256) in;

layout(push_constant, scalar) uniform P {
  uint64_t src, dst, pos, ff;  // ff: F32 [n_rot / 2] frequency divisors, or 0
  uint src_nb1, src_nb2, dst_nb1, dst_nb2;
  int hd, n_head, n_tok, n_rot;
  int mode;     // 0 norm (adjacent pairs), 2 neox (halves)
  int scaling;  // 0 none, 1 linear, 2 llama3, 3 yarn (llama3 already cleared when ff is given)
  uint n_items;
  float m1, m2, m3;
  float factor, mscale;
  float s0, s1, s2, s3, s4;  // llama3: orig_ctx, low_freq, high_freq, low_wavelen, high_wavelen;
                             // yarn: low, high
  uint pad;
} pc;

// 2^x for |x| <= ~0.6: e^(x ln2) as a degree-9 Taylor polynomial (error < 1e-9 relative).
float exp2_small(float x) {
  precise float y = x * 0.69314718055994531;
  precise float p = 1.0 / 362880.0;
  p = p * y + 1.0 / 40320.0;
  p = p * y + 1.0 / 5040.0;
  p = p * y + 1.0 / 720.0;
  p = p * y + 1.0 / 120.0;
  p = p * y + 1.0 / 24.0;
  p = p * y + 1.0 / 6.0;
  p = p * y + 0.5;
  p = p * y + 1.0;
  p = p * y + 1.0;
  return p;
}

// base^(-k / n_rot) for the even integer k = 2i.
float base_inv_freq(uint k) {
  const float kf = float(k);
  precise float e1 = kf * pc.m1;  // exact
  const float n = floor(e1 + 0.5);
  precise float frac = (e1 - n) + kf * pc.m2 + kf * pc.m3;
  return ldexp(exp2_small(-frac), -int(n));
}

// sin and cos of theta (any magnitude below ~1e5 to about 1e-7 absolute).
vec2 sin_cos(float theta) {
  const float k = floor(theta * 0.636619772367581343 + 0.5);
  precise float x = theta - k * 1.5703125;           // exact (8-bit constant)
  x = x - k * 0.000484466552734375;                   // exact (8-bit constant)
  x = x - k * -6.407499313354492e-07;
  x = x - k * 9.920935796805404e-10;
  precise float x2 = x * x;
  precise float s = -1.0 / 39916800.0;
  s = s * x2 + 1.0 / 362880.0;
  s = s * x2 - 1.0 / 5040.0;
  s = s * x2 + 1.0 / 120.0;
  s = s * x2 - 1.0 / 6.0;
  s = s * x2 * x + x;
  precise float c = 1.0 / 479001600.0;
  c = c * x2 - 1.0 / 3628800.0;
  c = c * x2 + 1.0 / 40320.0;
  c = c * x2 - 1.0 / 720.0;
  c = c * x2 + 1.0 / 24.0;
  c = c * x2 - 0.5;
  c = c * x2 + 1.0;
  const uint q = uint(int(k) & 3);
  if (q == 0u) return vec2(s, c);
  if (q == 1u) return vec2(c, -s);
  if (q == 2u) return vec2(-s, -c);
  return vec2(-c, s);
}

// Inverse frequency of pair i with the model's scaling (as the CPU's rope_inv_freq).
float inv_freq(uint i) {
  float f = base_inv_freq(2u * i);
  if (pc.scaling == 1) {
    f /= pc.factor;
  } else if (pc.scaling == 2) {
    const float wavelen = 6.283185307179586 / f;
    if (wavelen > pc.s3) {
      f /= pc.factor;
    } else if (wavelen >= pc.s4) {
      const float smooth_ = (pc.s0 / wavelen - pc.s1) / (pc.s2 - pc.s1);
      f = (1.0 - smooth_) * f / pc.factor + smooth_ * f;
    }
  } else if (pc.scaling == 3) {
    const float ramp = clamp((float(i) - pc.s0) / (pc.s1 - pc.s0), 0.0, 1.0);
    const float extrapolation = 1.0 - ramp;
    f = f / pc.factor * (1.0 - extrapolation) + f * extrapolation;
  }
  if (pc.ff != 0ul) f /= F32s(pc.ff).v[i];
  return f;
}

void main() {
  const uint idx = group_index() * 256u + gl_LocalInvocationID.x;
  if (idx >= pc.n_items) return;
  const uint half_ = uint(pc.n_rot / 2);
  const uint per_row = uint(pc.hd) - half_;  // half pairs + (hd - n_rot) copied elements
  const uint e = idx % per_row;
  const uint h = (idx / per_row) % uint(pc.n_head);
  const uint t = idx / (per_row * uint(pc.n_head));
  F32s x = F32s(pc.src + uint64_t(h) * pc.src_nb1 + uint64_t(t) * pc.src_nb2);
  F32s y = F32s(pc.dst + uint64_t(h) * pc.dst_nb1 + uint64_t(t) * pc.dst_nb2);
  if (e >= half_) {
    const uint i = uint(pc.n_rot) + (e - half_);
    y.v[i] = x.v[i];
    return;
  }
  const float p = float(I32s(pc.pos).v[t]);
  const float theta = p * inv_freq(e);
  const vec2 sc = sin_cos(theta) * pc.mscale;
  const uint i0 = pc.mode == 0 ? 2u * e : e;
  const uint i1 = pc.mode == 0 ? 2u * e + 1u : e + half_;
  const float x0 = x.v[i0], x1 = x.v[i1];
  y.v[i0] = x0 * sc.y - x1 * sc.x;
  y.v[i1] = x0 * sc.x + x1 * sc.y;
}

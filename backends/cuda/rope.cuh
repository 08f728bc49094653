// kite/backends/cuda/rope.cuh — rope and float cache writes, item by item: what the rope and
// kv_write kernels compute (k_elementwise.cu), shared with the mat-vec launch that ropes its own
// q and k rows (matvec.cuh matvec_rope_tail), so that both give the same bits. Internal to
// backends/cuda.
#pragma once

#include <cuda_fp16.h>

#include <cmath>

#include "backends/cuda/kernels.h"
#include "backends/cuda/quant.cuh"

namespace kite::cuda {

// Inverse frequency of rotary pair i with the model's scaling (ops_norm_rope.cpp rope_inv_freq),
// evaluated in double: the same formulas, closer to exact.
__device__ inline double rope_inv_freq(const RopeArgs& a, int i, double* mscale) {
  const double base = a.base, factor = a.factor, orig = a.orig_ctx, n_rot = a.n_rot;
  const double two_pi = 6.283185307179586;
  double f = pow(base, -2.0 * i / n_rot);
  *mscale = 1.0;
  switch (a.scaling) {
    case 1: f /= factor; break;  // linear
    case 2: {                    // llama3
      const double low_wavelen = orig / a.low_freq, high_wavelen = orig / a.high_freq;
      const double wavelen = two_pi / f;
      if (wavelen > low_wavelen) {
        f /= factor;
      } else if (wavelen >= high_wavelen) {
        const double smooth = (orig / wavelen - a.low_freq) / (a.high_freq - a.low_freq);
        f = (1.0 - smooth) * f / factor + smooth * f;
      }
      break;
    }
    case 3: {  // yarn
      auto corr_dim = [&](double rot) { return n_rot * log(orig / (rot * two_pi)) / (2.0 * log(base)); };
      const double low = fmax(0.0, floor(corr_dim(a.beta_fast)));
      double high = fmin(n_rot - 1, ceil(corr_dim(a.beta_slow)));
      if (high == low) high += 0.001;
      const double ramp = fmin(fmax((i - low) / (high - low), 0.0), 1.0);
      const double extrapolation = 1.0 - ramp;
      f = f / factor * (1.0 - extrapolation) + f * extrapolation;
      *mscale = a.attn_factor * (factor > 1.0 ? 0.1 * log(factor) + 1.0 : 1.0);
      break;
    }
    default: break;
  }
  return a.freq_factors != nullptr ? f / static_cast<double>(a.freq_factors[i]) : f;
}

// Elements a thread of rope_kernel takes in one tensor: a pair or passthrough element, a head, a token.
__host__ __device__ __forceinline__ int64_t rope_items(const RopeArgs& a) {
  return (a.hd - a.n_rot / 2) * a.n_head * a.n_tok;
}

// cos and sin (times yarn's mscale) of rotary pair e at token t's position, and the pair's two
// results: every step rounded on its own, so that each call site gives the same bits.
__device__ __forceinline__ float2 rope_cs(const RopeArgs& a, int64_t t, int64_t e) {
  double mscale;
  const double theta = static_cast<double>(a.pos[t]) * rope_inv_freq(a, static_cast<int>(e), &mscale);
  return make_float2(static_cast<float>(cos(theta) * mscale), static_cast<float>(sin(theta) * mscale));
}
__device__ __forceinline__ float rope_first(float x0, float x1, float2 c) {
  return __fsub_rn(__fmul_rn(x0, c.x), __fmul_rn(x1, c.y));
}
__device__ __forceinline__ float rope_second(float x0, float x1, float2 c) {
  return __fadd_rn(__fmul_rn(x0, c.y), __fmul_rn(x1, c.x));
}

// The elements of rotary pair e: adjacent (mode 0, llama's GGUF layout) or half a rotation apart.
__device__ __forceinline__ int64_t rope_pair_first(const RopeArgs& a, int64_t e) { return a.mode == 0 ? 2 * e : e; }
__device__ __forceinline__ int64_t rope_pair_second(const RopeArgs& a, int64_t e) {
  return a.mode == 0 ? 2 * e + 1 : e + a.n_rot / 2;
}

// Element i of head h, token t of a's rope: what rope_item writes there (which computes it with
// its pair's other element).
__device__ __forceinline__ float rope_element(const RopeArgs& a, int64_t i, int64_t h, int64_t t) {
  const float* x = reinterpret_cast<const float*>(static_cast<const uint8_t*>(a.src.p) + h * a.src.nb1 + t * a.src.nb2);
  if (i >= a.n_rot) return x[i];
  const int64_t e = a.mode == 0 ? i / 2 : i % (a.n_rot / 2);
  const int64_t i0 = rope_pair_first(a, e), i1 = rope_pair_second(a, e);
  const float2 c = rope_cs(a, t, e);
  return i == i0 ? rope_first(x[i0], x[i1], c) : rope_second(x[i0], x[i1], c);
}

// Element i of row r of a float-typed conversion's destination (F32/F16/BF16) set to v.
__device__ __forceinline__ void store_converted(const RowConversion& c, int64_t r, int64_t i, float v) {
  uint8_t* out = row_ptr(c.dst, c.dst_rows != nullptr ? c.dst_rows[r] : r);
  if (c.dst_type == kF32) reinterpret_cast<float*>(out)[i] = v;
  else if (c.dst_type == kF16) reinterpret_cast<__half*>(out)[i] = __float2half_rn(v);
  else reinterpret_cast<uint16_t*>(out)[i] = to_bf16(v);
}

// Item idx of one tensor (rope_items). With `cache` (a float-typed kv_write of the result, its
// rows the tokens: row t = heads' elements one after another) the values go there too.
__device__ __forceinline__ void rope_item(const RopeArgs& a, int64_t idx, const RowConversion* cache = nullptr) {
  const int64_t half = a.n_rot / 2;
  const int64_t per_row = a.hd - half;  // half pairs + (hd - n_rot) copied elements
  const int64_t e = idx % per_row, h = (idx / per_row) % a.n_head, t = idx / (per_row * a.n_head);
  const float* x = reinterpret_cast<const float*>(static_cast<const uint8_t*>(a.src.p) + h * a.src.nb1 + t * a.src.nb2);
  float* y = reinterpret_cast<float*>(static_cast<uint8_t*>(a.dst.p) + h * a.dst.nb1 + t * a.dst.nb2);
  if (e >= half) {  // beyond the rotated dimensions
    const int64_t i = a.n_rot + (e - half);
    y[i] = x[i];
    if (cache != nullptr) store_converted(*cache, t, h * a.hd + i, x[i]);
    return;
  }
  const float2 c = rope_cs(a, t, e);
  const int64_t i0 = rope_pair_first(a, e), i1 = rope_pair_second(a, e);
  const float x0 = x[i0], x1 = x[i1];
  const float y0 = rope_first(x0, x1, c), y1 = rope_second(x0, x1, c);
  y[i0] = y0;
  y[i1] = y1;
  if (cache != nullptr) {
    store_converted(*cache, t, h * a.hd + i0, y0);
    store_converted(*cache, t, h * a.hd + i1, y1);
  }
}

// Element idx (row idx / ne0) of a float-typed conversion: its F32/F16/BF16 store.
__device__ __forceinline__ void convert_float_item(const RowConversion& a, int64_t idx) {
  const int64_t r = idx / a.ne0, i = idx % a.ne0;
  store_converted(a, r, i, load_float(a.src_type, row_ptr(a.src, r), i));
}

}  // namespace kite::cuda

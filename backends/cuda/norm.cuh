// kite/backends/cuda/norm.cuh — rms_norm's row arithmetic, shared by the norm kernels
// (k_elementwise.cu) and the mat-vec launch that normalizes its residual sum (matvec.cuh), so
// that both give a row the same bits. Internal to backends/cuda.
#pragma once

#include <cstdint>

#include "backends/cuda/launch.cuh"
#include "backends/cuda/warp.cuh"

namespace kite::cuda {

// Threads of a row's sum of squares: the order of its additions depends on this count, so every
// kernel that normalizes a row sums as if it ran this many threads (rms_scale).
__host__ __device__ constexpr int rms_norm_threads(int64_t ne0) { return ne0 >= 1024 ? 1024 : ne0 >= 256 ? 256 : 64; }

// 1 / sqrt(mean(x^2) + eps) of a row, for every thread of the block, summed in the order of
// V = rms_norm_threads(ne0) threads: "virtual" thread v adds x[v], x[v + V], ..., each warp of
// them sums by xor shuffles, and one warp sums the warps' totals. A block of fewer
// threads plays kPer virtual threads a thread (v = threadIdx.x + j * blockDim.x, which keeps a
// virtual warp's lanes in one real warp), with the same order, so the result does not depend on
// the block's size. kL2: the row is another block's output of the same launch (read from L2).
template <int kPer, bool kL2 = false>
__device__ __forceinline__ float rms_scale(const float* x, int64_t ne0, float eps) {
  KITE_SHARED(partial, float[32]);
  const int virt = rms_norm_threads(ne0);
  const int lane = threadIdx.x % 32;
  float sum[kPer];
#pragma unroll
  for (int j = 0; j < kPer; ++j) sum[j] = 0.f;
  for (int64_t base = 0; base < ne0; base += virt) {  // kPer independent loads in flight
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int v = static_cast<int>(threadIdx.x + j * blockDim.x);
      const int64_t i = base + v;
      if (v < virt && i < ne0) {
        const float xi = kL2 ? __ldcg(x + i) : x[i];
        sum[j] = fmaf(xi, xi, sum[j]);
      }
    }
  }
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int v = static_cast<int>(threadIdx.x + j * blockDim.x);
    const float w = warp_sum(sum[j]);  // (v < virt is the same for the whole warp)
    if (lane == 0 && v < virt) partial[v / 32] = w;
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    float t = lane < virt / 32 ? partial[lane] : 0.f;
    t = warp_sum(t);
    if (lane == 0) partial[0] = t;
  }
  __syncthreads();
  const float s = 1.f / sqrtf(partial[0] / static_cast<float>(ne0) + eps);
  __syncthreads();  // (partial is free again: a block may normalize row after row)
  return s;
}

// Element i of the normalized row: x * s, then * w (each rounded on its own).
__device__ __forceinline__ float rms_normed(float x, const float* w, float s, int64_t i) {
  const float v = __fmul_rn(x, s);
  return w != nullptr ? __fmul_rn(v, w[i]) : v;
}

}  // namespace kite::cuda

// kite/backends/cuda/mmvq.cuh — the int8 matrix-vector kernel for 1..8 activation columns.
//
// One warp per weight row; lane l takes 32-element units l, l+32, ... of the row (so a warp
// reads a contiguous stretch of blocks), decodes each once (quant.cuh) and dots it with every
// column's int8 activations by __dp4a. Included by one .cu file per type family.
#pragma once

#include "backends/cuda/kernels.h"
#include "backends/cuda/launch.cuh"
#include "backends/cuda/quant.cuh"
#include "backends/cuda/warp.cuh"

namespace kite::cuda {

inline constexpr int kMmvqWarps = 4;  // rows per block

template <int T, int NC>
__global__ void __launch_bounds__(kMmvqWarps * 32)
    mmvq_kernel(const uint8_t* w, size_t row_bytes, int64_t m, int n_units, const int8_t* q, const float4* ds,
                float* dst, int64_t ldd) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kMmvqWarps + warp;
  if (row >= m) return;
  const uint8_t* wr = w + row * row_bytes;
  float acc[NC];
#pragma unroll
  for (int c = 0; c < NC; ++c) acc[c] = 0.f;
  for (int un = lane; un < n_units; un += 32) {
    Unit u;
    load_unit<T>(wr, un, u);
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const int4* aq = reinterpret_cast<const int4*>(q + (static_cast<int64_t>(c) * n_units + un) * 32);
      const int4 a0 = aq[0], a1 = aq[1];
      int s0 = __dp4a(u.q[0], a0.x, 0);
      s0 = __dp4a(u.q[1], a0.y, s0);
      s0 = __dp4a(u.q[2], a0.z, s0);
      s0 = __dp4a(u.q[3], a0.w, s0);
      int s1 = __dp4a(u.q[4], a1.x, 0);
      s1 = __dp4a(u.q[5], a1.y, s1);
      s1 = __dp4a(u.q[6], a1.z, s1);
      s1 = __dp4a(u.q[7], a1.w, s1);
      const float4 d = ds[static_cast<int64_t>(c) * n_units + un];
      acc[c] += d.x * (u.d0 * static_cast<float>(s0) + u.d1 * static_cast<float>(s1)) + u.m0 * d.y + u.m1 * d.z;
    }
  }
#pragma unroll
  for (int c = 0; c < NC; ++c) {
    const float v = warp_sum(acc[c]);
    if (lane == 0) dst[c * ldd + row] = v;
  }
}

template <int T>
cudaError_t launch_mmvq_t(const void* w, size_t row_bytes, int64_t k, int64_t m, const int8_t* q, const float* ds,
                          int n, float* dst, int64_t ldd, cudaStream_t s) {
  const auto* wp = static_cast<const uint8_t*>(w);
  const auto* d4 = reinterpret_cast<const float4*>(ds);
  const int n_units = static_cast<int>(k / 32);
  const unsigned grid = static_cast<unsigned>((m + kMmvqWarps - 1) / kMmvqWarps);
  const int threads = kMmvqWarps * 32;
  switch (n) {
    case 1: KITE_KERNEL(grid, threads, 0, s, mmvq_kernel<T, 1>)(wp, row_bytes, m, n_units, q, d4, dst, ldd); break;
    case 2: KITE_KERNEL(grid, threads, 0, s, mmvq_kernel<T, 2>)(wp, row_bytes, m, n_units, q, d4, dst, ldd); break;
    case 3: KITE_KERNEL(grid, threads, 0, s, mmvq_kernel<T, 3>)(wp, row_bytes, m, n_units, q, d4, dst, ldd); break;
    case 4: KITE_KERNEL(grid, threads, 0, s, mmvq_kernel<T, 4>)(wp, row_bytes, m, n_units, q, d4, dst, ldd); break;
    case 5: KITE_KERNEL(grid, threads, 0, s, mmvq_kernel<T, 5>)(wp, row_bytes, m, n_units, q, d4, dst, ldd); break;
    case 6: KITE_KERNEL(grid, threads, 0, s, mmvq_kernel<T, 6>)(wp, row_bytes, m, n_units, q, d4, dst, ldd); break;
    case 7: KITE_KERNEL(grid, threads, 0, s, mmvq_kernel<T, 7>)(wp, row_bytes, m, n_units, q, d4, dst, ldd); break;
    case 8: KITE_KERNEL(grid, threads, 0, s, mmvq_kernel<T, 8>)(wp, row_bytes, m, n_units, q, d4, dst, ldd); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace kite::cuda

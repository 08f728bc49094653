// Matrix-vector support: activation quantization to int8 blocks, the float-weight mat-vec, F32 to
// F16 conversion for cuBLAS, and the dispatch of the int8 kernels by type family.
#include <cuda_fp16.h>

#include "backends/cuda/kernels.h"
#include "backends/cuda/launch.cuh"
#include "backends/cuda/quant.cuh"
#include "backends/cuda/warp.cuh"

namespace kite::cuda {
namespace {

constexpr int kThreads = 256;

unsigned grid_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 1048576 ? 1048576 : b));
}

// One warp per 32-element block of a column: d = amax / 127, q = round(x / d), and the scaled
// code sums of each half (for the weight types with offsets).
__global__ void quantize_act_kernel(const float* x, size_t ldx, int64_t k, int64_t n_blocks, int8_t* q,
                                    float4* ds) {
  const int lane = threadIdx.x % 32;
  const int64_t per_col = k / 32;
  for (int64_t b = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32; b < n_blocks;
       b += static_cast<int64_t>(gridDim.x) * blockDim.x / 32) {
    const int64_t c = b / per_col, ib = b % per_col;
    const float v = x[c * ldx + ib * 32 + lane];
    float amax = fabsf(v);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float d = amax / 127.f;
    const float id = d != 0.f ? 1.f / d : 0.f;
    const int qi = static_cast<int>(roundf(v * id));
    q[c * k + ib * 32 + lane] = static_cast<int8_t>(qi);
    const int s0 = warp_sum_i(lane < 16 ? qi : 0);
    const int s1 = warp_sum_i(lane < 16 ? 0 : qi);
    if (lane == 0) ds[b] = make_float4(d, d * static_cast<float>(s0), d * static_cast<float>(s1), 0.f);
  }
}

// Float weights: one warp per row, f32 accumulation.
template <int NC>
__global__ void __launch_bounds__(128)
    mmv_float_kernel(int type, const uint8_t* w, size_t row_bytes, int64_t k, int64_t m, const float* x, size_t ldx,
                     float* dst, int64_t ldd) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * 4 + warp;
  if (row >= m) return;
  const uint8_t* wr = w + row * row_bytes;
  float acc[NC];
#pragma unroll
  for (int c = 0; c < NC; ++c) acc[c] = 0.f;
  if (type == kF16 && k % 2 == 0) {
    const auto* w2 = reinterpret_cast<const __half2*>(wr);
    for (int64_t i = lane; i < k / 2; i += 32) {
      const float2 wv = __half22float2(w2[i]);
#pragma unroll
      for (int c = 0; c < NC; ++c) {
        const float* xc = x + c * ldx + 2 * i;
        acc[c] += wv.x * xc[0] + wv.y * xc[1];
      }
    }
  } else {
    for (int64_t i = lane; i < k; i += 32) {
      const float wv = load_float(type, wr, i);
#pragma unroll
      for (int c = 0; c < NC; ++c) acc[c] += wv * x[c * ldx + i];
    }
  }
#pragma unroll
  for (int c = 0; c < NC; ++c) {
    const float v = warp_sum(acc[c]);
    if (lane == 0) dst[c * ldd + row] = v;
  }
}

__global__ void f32_to_f16_kernel(const float* x, size_t ldx, int64_t k, int64_t n, __half* dst) {
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t c = idx / k, i = idx % k;
    dst[idx] = __float2half_rn(x[c * ldx + i]);
  }
}

}  // namespace

cudaError_t launch_quantize_act(const float* x, size_t ldx, int64_t k, int64_t n, int8_t* q, float* ds,
                                cudaStream_t s) {
  const int64_t n_blocks = k / 32 * n;
  if (n_blocks == 0) return cudaSuccess;
  KITE_KERNEL(grid_for(n_blocks * 32), kThreads, 0, s, quantize_act_kernel)(x, ldx, k, n_blocks, q,
                                                                    reinterpret_cast<float4*>(ds));
  return cudaGetLastError();
}

cudaError_t launch_mmvq(int type, const void* w, size_t row_bytes, int64_t k, int64_t m, const int8_t* q,
                        const float* ds, int n, float* dst, int64_t ldd, cudaStream_t s) {
  if (m == 0) return cudaSuccess;
  switch (type) {
    case kQ2_K: case kQ3_K: case kQ4_K: case kQ5_K: case kQ6_K: case kIQ4_XS:
      return launch_mmvq_kquant(type, w, row_bytes, k, m, q, ds, n, dst, ldd, s);
    default: return launch_mmvq_legacy(type, w, row_bytes, k, m, q, ds, n, dst, ldd, s);
  }
}

cudaError_t launch_mmv_float(int type, const void* w, size_t row_bytes, int64_t k, int64_t m, const float* x,
                             size_t ldx, int n, float* dst, int64_t ldd, cudaStream_t s) {
  if (m == 0) return cudaSuccess;
  const auto* wp = static_cast<const uint8_t*>(w);
  const unsigned grid = static_cast<unsigned>((m + 3) / 4);
  switch (n) {
    case 1: KITE_KERNEL(grid, 128, 0, s, mmv_float_kernel<1>)(type, wp, row_bytes, k, m, x, ldx, dst, ldd); break;
    case 2: KITE_KERNEL(grid, 128, 0, s, mmv_float_kernel<2>)(type, wp, row_bytes, k, m, x, ldx, dst, ldd); break;
    case 3: KITE_KERNEL(grid, 128, 0, s, mmv_float_kernel<3>)(type, wp, row_bytes, k, m, x, ldx, dst, ldd); break;
    case 4: KITE_KERNEL(grid, 128, 0, s, mmv_float_kernel<4>)(type, wp, row_bytes, k, m, x, ldx, dst, ldd); break;
    case 5: KITE_KERNEL(grid, 128, 0, s, mmv_float_kernel<5>)(type, wp, row_bytes, k, m, x, ldx, dst, ldd); break;
    case 6: KITE_KERNEL(grid, 128, 0, s, mmv_float_kernel<6>)(type, wp, row_bytes, k, m, x, ldx, dst, ldd); break;
    case 7: KITE_KERNEL(grid, 128, 0, s, mmv_float_kernel<7>)(type, wp, row_bytes, k, m, x, ldx, dst, ldd); break;
    case 8: KITE_KERNEL(grid, 128, 0, s, mmv_float_kernel<8>)(type, wp, row_bytes, k, m, x, ldx, dst, ldd); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t launch_f32_to_f16(const float* x, size_t ldx, int64_t k, int64_t n, void* dst, cudaStream_t s) {
  if (k * n == 0) return cudaSuccess;
  KITE_KERNEL(grid_for(k * n), kThreads, 0, s, f32_to_f16_kernel)(x, ldx, k, k * n, static_cast<__half*>(dst));
  return cudaGetLastError();
}

}  // namespace kite::cuda

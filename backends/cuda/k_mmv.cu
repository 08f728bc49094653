// Matrix-vector support: activation quantization to int8 blocks, the float-weight mat-vec, F32 to
// F16 conversion for cuBLAS, and the dispatch of the int8 kernels by type family.
#include <cuda_fp16.h>

#include "backends/cuda/kernels.h"
#include "backends/cuda/launch.cuh"
#include "backends/cuda/matvec.cuh"
#include "backends/cuda/quant.cuh"
#include "backends/cuda/warp.cuh"

namespace kite::cuda {
namespace {

constexpr int kThreads = 256;

unsigned grid_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 1048576 ? 1048576 : b));
}

// One warp per 32-element block of a column (quantize_act_block).
__global__ void quantize_act_kernel(const float* x, size_t ldx, int64_t k, int64_t n_blocks, int8_t* q,
                                    float4* ds) {
  KITE_GRID_DEPENDENCY();
  const int lane = threadIdx.x % 32;
  const int64_t per_col = k / 32;
  for (int64_t b = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32; b < n_blocks;
       b += static_cast<int64_t>(gridDim.x) * blockDim.x / 32) {
    const int64_t c = b / per_col, ib = b % per_col;
    quantize_act_block(x[c * ldx + ib * 32 + lane], lane, q + c * k + ib * 32, ds + b);
  }
}

// Float weights: one warp per row, f32 accumulation; acc[c] += this lane's share of row wr · column c.
template <int NC>
__device__ __forceinline__ void mmv_float_dot(int type, const uint8_t* wr, int64_t k, const float* x, size_t ldx,
                                              int lane, float (&acc)[NC]) {
  KITE_ASSUME_GLOBAL(wr);
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
}

template <int NC, bool GLU, int TAIL>
__device__ __forceinline__ void mmv_float_body(const MatVecGrid& g, int type, int64_t k, const float* x, size_t ldx) {
  matvec_body<NC, GLU, TAIL, false>(g, [&](const uint8_t* wr, int lane, float (&acc)[NC]) {
    mmv_float_dot<NC>(type, wr, k, x, ldx, lane, acc);
  });
}
template <int NC, bool GLU, int TAIL>
__global__ void __launch_bounds__(kMatVecWarps * 32)
    mmv_float_kernel(MatVecGrid g, int type, int64_t k, const float* x, size_t ldx) {
  mmv_float_body<NC, GLU, TAIL>(g, type, k, x, ldx);
}
template <int NC>  // (the head norms' tail: kHeadNormMinBlocks)
__global__ void __launch_bounds__(kMatVecWarps * 32, kHeadNormMinBlocks)
    mmv_float_head_norm_kernel(MatVecGrid g, int type, int64_t k, const float* x, size_t ldx) {
  mmv_float_body<NC, false, kTailHeadNormRope>(g, type, k, x, ldx);
}

__global__ void f32_to_f16_kernel(const float* x, size_t ldx, int64_t k, int64_t n, __half* dst) {
  KITE_GRID_DEPENDENCY();
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

cudaError_t launch_mmvq_id(int type, const MatVecIdArgs& a, cudaStream_t s) {
  if (a.k % 32 != 0 || a.n_used < 1 || (a.nx != 1 && a.nx != a.n_used)) return cudaErrorInvalidValue;
  if (a.m == 0 || a.n_tok == 0) return cudaSuccess;
  switch (type) {
    case kQ2_K: case kQ3_K: case kQ4_K: case kQ5_K: case kQ6_K: case kIQ4_XS:
      return launch_mmvq_id_kquant(type, a, s);
    case kIQ2_XXS: case kIQ2_XS: case kIQ2_S: case kIQ3_XXS: case kIQ3_S: case kIQ1_S: case kIQ1_M:
      return launch_mmvq_id_iq(type, a, s);
    default: return launch_mmvq_id_legacy(type, a, s);
  }
}

cudaError_t launch_mmvq(int type, const MatVecJob& job, int64_t k, const int8_t* q, const float* ds, int n,
                        cudaStream_t s) {
  if (!matvec_job_ok(job, n)) return cudaErrorInvalidValue;
  if (matvec_grid(job).blocks == 0) return cudaSuccess;
  switch (type) {
    case kQ2_K: case kQ3_K: case kQ4_K: case kQ5_K: case kQ6_K: case kIQ4_XS:
      return launch_mmvq_kquant(type, job, k, q, ds, n, s);
    case kIQ2_XXS: case kIQ2_XS: case kIQ2_S: case kIQ3_XXS: case kIQ3_S: case kIQ1_S: case kIQ1_M:
      return launch_mmvq_iq(type, job, k, q, ds, n, s);
    default: return launch_mmvq_legacy(type, job, k, q, ds, n, s);
  }
}

cudaError_t launch_mmv_float(int type, const MatVecJob& job, int64_t k, const float* x, size_t ldx, int n,
                             cudaStream_t s) {
  if (!matvec_job_ok(job, n)) return cudaErrorInvalidValue;
  const MatVecGrid g = matvec_grid(job);
  if (g.blocks == 0) return cudaSuccess;
  return matvec_dispatch(
      n, job.glu != nullptr, matvec_tail(job),
      [](auto nc, auto glu, auto tail) {
        constexpr int kNc = decltype(nc)::value;
        if constexpr (decltype(tail)::value == kTailHeadNormRope) return mmv_float_head_norm_kernel<kNc>;
        else return mmv_float_kernel<kNc, decltype(glu)::value, decltype(tail)::value>;
      },
      [&](auto mmv) { KITE_KERNEL(g.blocks, kMatVecWarps * 32, 0, s, mmv)(g, type, k, x, ldx); });
}

cudaError_t launch_f32_to_f16(const float* x, size_t ldx, int64_t k, int64_t n, void* dst, cudaStream_t s) {
  if (k * n == 0) return cudaSuccess;
  KITE_KERNEL(grid_for(k * n), kThreads, 0, s, f32_to_f16_kernel)(x, ldx, k, k * n, static_cast<__half*>(dst));
  return cudaGetLastError();
}

}  // namespace kite::cuda

// The int8 tensor-core matrix-matrix product for quantized weights (batched decode and short
// prompts: more columns than the mat-vec kernels take, too few for dequantizing the weights
// to F16 for cuBLAS to pay off).
//
// It reads the same int8 activations + float4 scales as the mat-vec kernels (launch_quantize_act)
// and decodes the weights with the same load_unit (quant.cuh), so its sums are mmvq_kernel's:
// per 32-element unit, d_x * (d0 * s0 + d1 * s1) + m0 * d_x * sum(x0) + m1 * d_x * sum(x1), where
// s0 / s1 are the int8 dot products of the unit's two 16-element halves.
//
// A block of kMmqWarps warps owns kMmqRows weight rows and 16 * NT columns. Per step of
// kMmqUnits units it decodes each weight unit of its rows once into shared memory (codes by
// half-unit, scales beside) and copies the columns' int8 codes and scales there; then each warp
// multiplies its 16 rows by the columns' 16-column tiles with WMMA (m16n16k16, signed char
// inputs, int accumulators; one k16 step is one half-unit, so a tile product is exactly an s0 or
// s1). The accumulator fragment's element layout is opaque, so the int32 tile goes to shared
// memory (store_matrix_sync) and each lane scales its 8 elements of it into float accumulators
// (lane l: row l % 16, columns 2i + l / 16). Rows past m, columns past n and units past k read
// as zeros and are never stored.
#include <mma.h>

#include "backends/cuda/kernels.h"
#include "backends/cuda/launch.cuh"
#include "backends/cuda/quant.cuh"

namespace kite::cuda {
namespace {

constexpr int kMmqWarps = 4;
constexpr int kMmqThreads = kMmqWarps * 32;
constexpr int kMmqRows = 16 * kMmqWarps;  // weight rows per block
constexpr int kMmqUnits = 4;              // 32-element units per step

// Types whose two 16-element halves share one scale and offset: both halves' products go into
// one accumulator tile. (Q2_K, Q3_K and Q6_K scale each half on its own.)
template <int T>
constexpr bool kOneScale = T != kQ2_K && T != kQ3_K && T != kQ6_K;

// Shared memory of a block with NT column tiles. WMMA wants 256-bit aligned tiles and a stride
// of a multiple of 16 bytes: every 16 x 16 int8 tile below is 256 contiguous bytes.
template <int NT>
struct MmqShared {
  alignas(32) int8_t wq[2 * kMmqUnits][kMmqRows][16];  // weight codes: [half-unit][row][element]
  alignas(32) int8_t xq[2 * kMmqUnits][16 * NT][16];   // activation codes: [half-unit][column][element]
  alignas(32) int tile[kMmqWarps][2][16 * 16];         // each warp's int32 products, column major
  float4 ws[kMmqRows][kMmqUnits];                      // weight {d0, d1, m0, m1}
  float4 xs[16 * NT][kMmqUnits];                       // activation {d, d * sum0, d * sum1, 0}
};

__device__ __forceinline__ void st16(int8_t* p, int4 v) { *reinterpret_cast<int4*>(p) = v; }

// Step u0's weight units of the block's rows into shared memory.
template <int T, int NT>
__device__ __forceinline__ void mmq_load_weights(MmqShared<NT>& sm, const uint8_t* w, size_t row_bytes, int64_t row0,
                                                 int64_t m, int u0, int n_units) {
  for (int i = threadIdx.x; i < kMmqRows * kMmqUnits; i += kMmqThreads) {
    const int r = i / kMmqUnits, uu = i % kMmqUnits;
    int4 lo = make_int4(0, 0, 0, 0), hi = lo;
    float4 sc = make_float4(0.f, 0.f, 0.f, 0.f);
    if (row0 + r < m && u0 + uu < n_units) {
      Unit u;
      load_unit<T>(w + static_cast<size_t>(row0 + r) * row_bytes, u0 + uu, u);
      lo = make_int4(u.q[0], u.q[1], u.q[2], u.q[3]);
      hi = make_int4(u.q[4], u.q[5], u.q[6], u.q[7]);
      sc = make_float4(u.d0, u.d1, u.m0, u.m1);
    }
    st16(sm.wq[2 * uu][r], lo);
    st16(sm.wq[2 * uu + 1][r], hi);
    sm.ws[r][uu] = sc;
  }
}

// Step u0's activation codes and scales of the block's columns into shared memory.
template <int NT>
__device__ __forceinline__ void mmq_load_acts(MmqShared<NT>& sm, const int8_t* q, const float4* ds, int64_t col0,
                                              int64_t n, int u0, int n_units) {
  constexpr int kCols = 16 * NT;
  const int64_t k = static_cast<int64_t>(n_units) * 32;
  for (int i = threadIdx.x; i < kCols * 2 * kMmqUnits; i += kMmqThreads) {
    const int c = i / (2 * kMmqUnits), h = i % (2 * kMmqUnits);
    int4 v = make_int4(0, 0, 0, 0);
    if (col0 + c < n && u0 + h / 2 < n_units)
      v = reinterpret_cast<const int4*>(q + (col0 + c) * k + static_cast<int64_t>(u0) * 32)[h];
    st16(sm.xq[h][c], v);
  }
  for (int i = threadIdx.x; i < kCols * kMmqUnits; i += kMmqThreads) {
    const int c = i / kMmqUnits, uu = i % kMmqUnits;
    float4 d = make_float4(0.f, 0.f, 0.f, 0.f);
    if (col0 + c < n && u0 + uu < n_units) d = ds[(col0 + c) * n_units + u0 + uu];
    sm.xs[c][uu] = d;
  }
}

template <int T, int NT>
__global__ void __launch_bounds__(kMmqThreads)
    mmq_kernel(const uint8_t* w, size_t row_bytes, int64_t m, int n_units, const int8_t* q, const float4* ds, int64_t n,
               float* dst, int64_t ldd) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 720
  using namespace nvcuda;
  __shared__ MmqShared<NT> sm;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int r = lane % 16, cpar = lane / 16;  // this lane's row of the warp's tiles, column parity
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kMmqRows;
  const int64_t col0 = static_cast<int64_t>(blockIdx.y) * 16 * NT;
  int* const tile0 = sm.tile[warp][0];
  int* const tile1 = sm.tile[warp][1];

  float acc[NT][8];
#pragma unroll
  for (int t = 0; t < NT; ++t)
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[t][i] = 0.f;

  for (int u0 = 0; u0 < n_units; u0 += kMmqUnits) {
    mmq_load_weights<T, NT>(sm, w, row_bytes, row0, m, u0, n_units);
    mmq_load_acts<NT>(sm, q, ds, col0, n, u0, n_units);
    __syncthreads();
    const int step_units = min(kMmqUnits, n_units - u0);
    for (int uu = 0; uu < step_units; ++uu) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, signed char, wmma::row_major> a0, a1;
      wmma::load_matrix_sync(a0, sm.wq[2 * uu][16 * warp], 16);
      wmma::load_matrix_sync(a1, sm.wq[2 * uu + 1][16 * warp], 16);
      const float4 wd = sm.ws[16 * warp + r][uu];
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        wmma::fragment<wmma::matrix_b, 16, 16, 16, signed char, wmma::col_major> b0, b1;
        wmma::load_matrix_sync(b0, sm.xq[2 * uu][16 * t], 16);
        wmma::load_matrix_sync(b1, sm.xq[2 * uu + 1][16 * t], 16);
        wmma::fragment<wmma::accumulator, 16, 16, 16, int> c0;
        wmma::fill_fragment(c0, 0);
        wmma::mma_sync(c0, a0, b0, c0);
        if constexpr (kOneScale<T>) {
          wmma::mma_sync(c0, a1, b1, c0);
          wmma::store_matrix_sync(tile0, c0, 16, wmma::mem_col_major);
        } else {
          wmma::fragment<wmma::accumulator, 16, 16, 16, int> c1;
          wmma::fill_fragment(c1, 0);
          wmma::mma_sync(c1, a1, b1, c1);
          wmma::store_matrix_sync(tile0, c0, 16, wmma::mem_col_major);
          wmma::store_matrix_sync(tile1, c1, 16, wmma::mem_col_major);
        }
        __syncwarp();
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const int c = 2 * i + cpar;
          const float4 xd = sm.xs[16 * t + c][uu];
          const float s0 = static_cast<float>(tile0[c * 16 + r]);
          const float dot = kOneScale<T> ? wd.x * s0 : wd.x * s0 + wd.y * static_cast<float>(tile1[c * 16 + r]);
          acc[t][i] += xd.x * dot + wd.z * xd.y + wd.w * xd.z;
        }
        __syncwarp();  // (the tile is rewritten by the next product)
      }
    }
    __syncthreads();  // (shared memory is rewritten by the next step)
  }

  const int64_t row = row0 + 16 * warp + r;
  if (row >= m) return;
#pragma unroll
  for (int t = 0; t < NT; ++t)
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int64_t col = col0 + 16 * t + 2 * i + cpar;
      if (col < n) dst[col * ldd + row] = acc[t][i];
    }
#else
  __trap();  // int8 WMMA needs sm_72 or newer
#endif
}

template <int T>
cudaError_t launch_mmq_t(const void* w, size_t row_bytes, int64_t k, int64_t m, const int8_t* q, const float* ds,
                         int64_t n, float* dst, int64_t ldd, cudaStream_t s) {
  const auto* wp = static_cast<const uint8_t*>(w);
  const auto* d4 = reinterpret_cast<const float4*>(ds);
  const int n_units = static_cast<int>(k / 32);
  // Column tiles per block: as many as the columns fill, up to 4 (64 columns).
  const int nt = n <= 16 ? 1 : (n <= 32 ? 2 : 4);
  const int64_t gy = (n + 16 * nt - 1) / (16 * nt);
  const int64_t gx = (m + kMmqRows - 1) / kMmqRows;
  if (gy > 65535 || gx > 0x7fffffff) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(gx), static_cast<unsigned>(gy));
  switch (nt) {
    case 1:
      KITE_KERNEL(grid, kMmqThreads, 0, s, mmq_kernel<T, 1>)(wp, row_bytes, m, n_units, q, d4, n, dst, ldd);
      break;
    case 2:
      KITE_KERNEL(grid, kMmqThreads, 0, s, mmq_kernel<T, 2>)(wp, row_bytes, m, n_units, q, d4, n, dst, ldd);
      break;
    default:
      KITE_KERNEL(grid, kMmqThreads, 0, s, mmq_kernel<T, 4>)(wp, row_bytes, m, n_units, q, d4, n, dst, ldd);
      break;
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_mmq(int type, const void* w, size_t row_bytes, int64_t k, int64_t m, const int8_t* q,
                       const float* ds, int64_t n, float* dst, int64_t ldd, cudaStream_t s) {
  if (m == 0 || n == 0) return cudaSuccess;
  if (k % 32 != 0 || k / 32 > 0x7fffffff) return cudaErrorInvalidValue;
  cudaError_t e = cudaErrorInvalidValue;
  dispatch_quant(type,
                 [&](auto t) { e = launch_mmq_t<decltype(t)::value>(w, row_bytes, k, m, q, ds, n, dst, ldd, s); });
  return e;
}

}  // namespace kite::cuda

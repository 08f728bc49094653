// The int8 tensor-core matrix-matrix product for quantized weights (batched decode and prompts:
// more columns than the mat-vec kernels take).
//
// It reads the same int8 activations + float4 scales as the mat-vec kernels (launch_quantize_act)
// and decodes the weights with the same load_unit (quant.cuh), so its sums are mmvq_kernel's:
// per 32-element unit, d_x * (d0 * s0 + d1 * s1) + m0 * d_x * sum(x0) + m1 * d_x * sum(x1), where
// s0 / s1 are the int8 dot products of the unit's two 16-element halves (d0 * (s0 + s1) for the
// types with one scale per unit).
//
// A block of kMmqWarps warps owns kMmqRows weight rows, NC columns (16, 32 or 64) and a range of
// k. Per step of kMmqUnits units its threads store the step's weight units (decoded: int8 codes
// and scales) and activation codes, held in registers, to shared memory, start loading the next
// step's from global memory, and each warp multiplies its 16 rows by the NC columns with
// mma.sync (mma.cuh): one m16n8k32 per unit and 8-column tile (two m16n8k16, one per half, for
// Q2_K, Q3_K and Q6_K, whose halves have scales of their own). The fragment layout is known, so
// each lane scales its four int32 products into float accumulators in registers. A row of codes
// in shared memory is kMmqStride words (the step's 4 units of 8 words, plus 4), so the 32 lanes'
// fragment loads hit 32 different banks. Rows past m, columns past n and units past the range
// read as zeros and are never stored.
//
// Split-k: when the blocks of rows x columns alone would leave SMs idle (batched decode: few
// column blocks), gridDim.z splits the units into ranges; each writes its partial sums to scratch
// and mmq_reduce_kernel adds them in a fixed order (results never depend on timing).
#include <algorithm>

#include "backends/cuda/kernels.h"
#include "backends/cuda/launch.cuh"
#include "backends/cuda/mma.cuh"
#include "backends/cuda/quant.cuh"

namespace kite::cuda {
namespace {

constexpr int kMmqWarps = 4;
constexpr int kMmqThreads = kMmqWarps * 32;
constexpr int kMmqRows = 16 * kMmqWarps;       // weight rows per block
constexpr int kMmqUnits = 4;                   // 32-element units per step
constexpr int kMmqStride = 8 * kMmqUnits + 4;  // words per row (or column) of a step's codes
constexpr int kMaxSplits = 16;
constexpr int kReduceThreads = 256;

// Types whose two 16-element halves share one scale and offset: one k32 product per unit.
template <int T>
constexpr bool kOneScale = !kUnitTwoScales<T>;

constexpr int ceil_div(int a, int b) { return (a + b - 1) / b; }

// Columns per block for n columns.
int mmq_cols(int64_t n) { return n <= 16 ? 16 : (n <= 32 ? 32 : 64); }

template <int NC>
struct MmqShared {
  alignas(16) int wq[kMmqRows][kMmqStride];  // weight codes: unit u of a row at words 8u..8u+7
  alignas(16) int xq[NC][kMmqStride];        // activation codes, the same by column
  float4 ws[kMmqRows][kMmqUnits];            // weight {d0, d1, m0, m1}
  float4 xs[NC][kMmqUnits];                  // activation {d, d * sum0, d * sum1, 0}
};

// One thread's share of a step's inputs, carried in registers from the global loads to the
// shared-memory stores (so a step's loads are in flight while the warps multiply the previous).
template <int NC>
struct MmqStage {
  static constexpr int kW = kMmqRows * kMmqUnits / kMmqThreads;     // weight units
  static constexpr int kX = NC * 2 * kMmqUnits / kMmqThreads;       // 16-code activation chunks
  static constexpr int kS = ceil_div(NC * kMmqUnits, kMmqThreads);  // activation scales
  static_assert(kW * kMmqThreads == kMmqRows * kMmqUnits && kX * kMmqThreads == NC * 2 * kMmqUnits);
  Unit w[kW];
  int4 x[kX];
  float4 s[kS];
};

// Units [u0, u0 + kMmqUnits) ∩ [.., u_end) of the block's rows and columns, into registers.
template <int T, int NC>
__device__ __forceinline__ void mmq_fetch(MmqStage<NC>& st, const uint8_t* w, size_t row_bytes, int64_t row0,
                                          int64_t m, const int8_t* q, const float4* ds, int64_t col0, int64_t n,
                                          int n_units, int u0, int u_end) {
#pragma unroll
  for (int j = 0; j < MmqStage<NC>::kW; ++j) {
    const int i = threadIdx.x + j * kMmqThreads, r = i / kMmqUnits, uu = i % kMmqUnits;
    Unit& u = st.w[j];
    if (row0 + r < m && u0 + uu < u_end) {
      load_unit<T>(w + static_cast<size_t>(row0 + r) * row_bytes, u0 + uu, u);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) u.q[e] = 0;
      u.d0 = u.d1 = u.m0 = u.m1 = 0.f;
    }
  }
  const int64_t k = static_cast<int64_t>(n_units) * 32;
#pragma unroll
  for (int j = 0; j < MmqStage<NC>::kX; ++j) {
    const int i = threadIdx.x + j * kMmqThreads, c = i / (2 * kMmqUnits), h = i % (2 * kMmqUnits);
    st.x[j] = col0 + c < n && u0 + h / 2 < u_end
                  ? reinterpret_cast<const int4*>(q + (col0 + c) * k + static_cast<int64_t>(u0) * 32)[h]
                  : make_int4(0, 0, 0, 0);
  }
#pragma unroll
  for (int j = 0; j < MmqStage<NC>::kS; ++j) {
    const int i = threadIdx.x + j * kMmqThreads, c = i / kMmqUnits, uu = i % kMmqUnits;
    st.s[j] = i < NC * kMmqUnits && col0 + c < n && u0 + uu < u_end ? ds[(col0 + c) * n_units + u0 + uu]
                                                                     : make_float4(0.f, 0.f, 0.f, 0.f);
  }
}

template <int NC>
__device__ __forceinline__ void mmq_store(MmqShared<NC>& sm, const MmqStage<NC>& st) {
#pragma unroll
  for (int j = 0; j < MmqStage<NC>::kW; ++j) {
    const int i = threadIdx.x + j * kMmqThreads, r = i / kMmqUnits, uu = i % kMmqUnits;
    const Unit& u = st.w[j];
    int4* p = reinterpret_cast<int4*>(&sm.wq[r][8 * uu]);
    p[0] = make_int4(u.q[0], u.q[1], u.q[2], u.q[3]);
    p[1] = make_int4(u.q[4], u.q[5], u.q[6], u.q[7]);
    sm.ws[r][uu] = make_float4(u.d0, u.d1, u.m0, u.m1);
  }
#pragma unroll
  for (int j = 0; j < MmqStage<NC>::kX; ++j) {
    const int i = threadIdx.x + j * kMmqThreads, c = i / (2 * kMmqUnits), h = i % (2 * kMmqUnits);
    *reinterpret_cast<int4*>(&sm.xq[c][4 * h]) = st.x[j];
  }
#pragma unroll
  for (int j = 0; j < MmqStage<NC>::kS; ++j) {
    const int i = threadIdx.x + j * kMmqThreads;
    if (i < NC * kMmqUnits) sm.xs[i / kMmqUnits][i % kMmqUnits] = st.s[j];
  }
}

// Block (x, y, z): rows 64x.., columns NC*y.., units [z * units_per_split, ..). Its sums go to
// dst + z * z_stride (column c, row i at [c * ldd + i]).
template <int T, int NC>
__global__ void __launch_bounds__(kMmqThreads)
    mmq_kernel(const uint8_t* w, size_t row_bytes, int64_t m, int n_units, int units_per_split, const int8_t* q,
               const float4* ds, int64_t n, float* dst, int64_t ldd, int64_t z_stride) {
  KITE_GRID_DEPENDENCY();
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  KITE_SHARED(sm, MmqShared<NC>);
  constexpr int kTiles = NC / 8;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;  // this lane's rows g, g + 8 and columns 2t, 2t + 1 of each tile
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kMmqRows;
  const int64_t col0 = static_cast<int64_t>(blockIdx.y) * NC;
  const int u_begin = static_cast<int>(blockIdx.z) * units_per_split;
  const int u_end = min(n_units, u_begin + units_per_split);

  float acc[kTiles][4];
#pragma unroll
  for (int nt = 0; nt < kTiles; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[nt][i] = 0.f;

  MmqStage<NC> st;
  mmq_fetch<T, NC>(st, w, row_bytes, row0, m, q, ds, col0, n, n_units, u_begin, u_end);
  const int* const wr0 = sm.wq[16 * warp + g];
  const int* const wr1 = sm.wq[16 * warp + g + 8];
  for (int u0 = u_begin; u0 < u_end; u0 += kMmqUnits) {
    mmq_store<NC>(sm, st);
    __syncthreads();
    if (u0 + kMmqUnits < u_end)
      mmq_fetch<T, NC>(st, w, row_bytes, row0, m, q, ds, col0, n, n_units, u0 + kMmqUnits, u_end);
#pragma unroll
    for (int uu = 0; uu < kMmqUnits; ++uu) {  // (units past the range are zeros)
      const int a[4] = {wr0[8 * uu + t], wr1[8 * uu + t], wr0[8 * uu + 4 + t], wr1[8 * uu + 4 + t]};
      const float4 w0 = sm.ws[16 * warp + g][uu], w1 = sm.ws[16 * warp + g + 8][uu];
#pragma unroll
      for (int nt = 0; nt < kTiles; ++nt) {
        const int* xc = sm.xq[8 * nt + g];
        const int b[2] = {xc[8 * uu + t], xc[8 * uu + 4 + t]};
        float s[4];  // d0 * s0 + d1 * s1 of (row g, col 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1)
        if constexpr (kOneScale<T>) {
          int c[4] = {0, 0, 0, 0};
          mma_s8_k32(c, a, b);
          s[0] = w0.x * static_cast<float>(c[0]), s[1] = w0.x * static_cast<float>(c[1]);
          s[2] = w1.x * static_cast<float>(c[2]), s[3] = w1.x * static_cast<float>(c[3]);
        } else {
          int lo[4] = {0, 0, 0, 0}, hi[4] = {0, 0, 0, 0};
          mma_s8_k16(lo, a[0], a[1], b[0]);
          mma_s8_k16(hi, a[2], a[3], b[1]);
          s[0] = w0.x * static_cast<float>(lo[0]) + w0.y * static_cast<float>(hi[0]);
          s[1] = w0.x * static_cast<float>(lo[1]) + w0.y * static_cast<float>(hi[1]);
          s[2] = w1.x * static_cast<float>(lo[2]) + w1.y * static_cast<float>(hi[2]);
          s[3] = w1.x * static_cast<float>(lo[3]) + w1.y * static_cast<float>(hi[3]);
        }
        const float4 x0 = sm.xs[8 * nt + 2 * t][uu], x1 = sm.xs[8 * nt + 2 * t + 1][uu];
        acc[nt][0] += x0.x * s[0] + w0.z * x0.y + w0.w * x0.z;
        acc[nt][1] += x1.x * s[1] + w0.z * x1.y + w0.w * x1.z;
        acc[nt][2] += x0.x * s[2] + w1.z * x0.y + w1.w * x0.z;
        acc[nt][3] += x1.x * s[3] + w1.z * x1.y + w1.w * x1.z;
      }
    }
    __syncthreads();  // (shared memory is rewritten by the next step)
  }

  float* const out = dst + static_cast<int64_t>(blockIdx.z) * z_stride;
#pragma unroll
  for (int nt = 0; nt < kTiles; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t row = row0 + 16 * warp + g + (i >= 2 ? 8 : 0);
      const int64_t col = col0 + 8 * nt + 2 * t + (i & 1);
      if (row < m && col < n) out[col * ldd + row] = acc[nt][i];
    }
#else
  __trap();  // mma.sync with 8-bit inputs needs sm_80 or newer
#endif
}

// dst[c * ldd + i] = the sum over z of part[z][c * m + i], z in order.
__global__ void mmq_reduce_kernel(const float* part, int splits, int64_t m, int64_t n, float* dst, int64_t ldd) {
  KITE_GRID_DEPENDENCY();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kReduceThreads + threadIdx.x;
  if (i >= m * n) return;
  float s = 0.f;
  for (int z = 0; z < splits; ++z) s += part[z * m * n + i];
  dst[(i / m) * ldd + i % m] = s;
}

// Units per split (a multiple of kMmqUnits) for `splits` wanted ranges of n_units.
int units_per_split(int n_units, int splits) {
  const int steps = ceil_div(n_units, kMmqUnits);
  return ceil_div(steps, splits) * kMmqUnits;
}

template <int T>
cudaError_t launch_mmq_t(const uint8_t* w, size_t row_bytes, int n_units, int64_t m, const int8_t* q,
                         const float4* ds, int64_t n, float* dst, int64_t ldd, int sm_count, float* partial,
                         cudaStream_t s) {
  const int nc = mmq_cols(n);
  const int splits = mmq_splits(static_cast<int64_t>(n_units) * 32, m, n, sm_count);
  const int ups = units_per_split(n_units, splits);
  const int64_t gy = (n + nc - 1) / nc;
  const int64_t gx = (m + kMmqRows - 1) / kMmqRows;
  if (gy > 65535 || gx > 0x7fffffff) return cudaErrorInvalidValue;
  if (splits > 1 && partial == nullptr) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(gx), static_cast<unsigned>(gy), static_cast<unsigned>(splits));
  float* out = splits > 1 ? partial : dst;
  const int64_t ld = splits > 1 ? m : ldd, z_stride = splits > 1 ? m * n : 0;
  switch (nc) {
    case 16:
      KITE_KERNEL(grid, kMmqThreads, 0, s, mmq_kernel<T, 16>)(w, row_bytes, m, n_units, ups, q, ds, n, out, ld,
                                                                z_stride);
      break;
    case 32:
      KITE_KERNEL(grid, kMmqThreads, 0, s, mmq_kernel<T, 32>)(w, row_bytes, m, n_units, ups, q, ds, n, out, ld,
                                                                z_stride);
      break;
    default:
      KITE_KERNEL(grid, kMmqThreads, 0, s, mmq_kernel<T, 64>)(w, row_bytes, m, n_units, ups, q, ds, n, out, ld,
                                                                z_stride);
      break;
  }
  if (splits > 1) {
    const int64_t blocks = (m * n + kReduceThreads - 1) / kReduceThreads;
    if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
    const auto grid_r = static_cast<unsigned>(blocks);
    KITE_KERNEL(grid_r, kReduceThreads, 0, s, mmq_reduce_kernel)(partial, splits, m, n, dst, ldd);
  }
  return cudaGetLastError();
}

}  // namespace

int mmq_splits(int64_t k, int64_t m, int64_t n, int sm_count) {
  const int n_units = static_cast<int>(k / 32);
  if (n_units <= 0) return 1;
  const int64_t blocks = ((m + kMmqRows - 1) / kMmqRows) * ((n + mmq_cols(n) - 1) / mmq_cols(n));
  const int64_t want = 2 * static_cast<int64_t>(sm_count) / blocks;  // up to two blocks per SM
  const int most = std::max(1, std::min(kMaxSplits, ceil_div(n_units, kMmqUnits) / 2));  // 2+ steps a split
  const int splits = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(want, most)));
  return ceil_div(n_units, units_per_split(n_units, splits));  // (no empty range)
}

cudaError_t launch_mmq(int type, const void* w, size_t row_bytes, int64_t k, int64_t m, const int8_t* q,
                       const float* ds, int64_t n, float* dst, int64_t ldd, int sm_count, float* partial,
                       cudaStream_t s) {
  if (m == 0 || n == 0) return cudaSuccess;
  if (k % 32 != 0 || k / 32 > 0x7fffffff || k == 0) return cudaErrorInvalidValue;
  cudaError_t e = cudaErrorInvalidValue;
  dispatch_quant(type, [&](auto t) {
    e = launch_mmq_t<decltype(t)::value>(static_cast<const uint8_t*>(w), row_bytes, static_cast<int>(k / 32), m, q,
                                         reinterpret_cast<const float4*>(ds), n, dst, ldd, sm_count, partial, s);
  });
  return e;
}

}  // namespace kite::cuda

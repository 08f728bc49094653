// Elementwise ops, rms_norm, rope and row conversion (copy, kv_write) on the device. Semantics
// are the CPU scalar references' (backends/cpu/ops_basic.cpp, ops_norm_rope.cpp).
#include <cuda_fp16.h>

#include <cmath>

#include "backends/cuda/kernels.h"
#include "backends/cuda/launch.cuh"
#include "backends/cuda/matvec.cuh"
#include "backends/cuda/norm.cuh"
#include "backends/cuda/quant.cuh"
#include "backends/cuda/rope.cuh"
#include "backends/cuda/warp.cuh"

namespace kite::cuda {
namespace {

constexpr int kThreads = 256;

int blocks_for(int64_t n, int per_block = kThreads) {
  const int64_t b = (n + per_block - 1) / per_block;
  return static_cast<int>(b < 65535 * 16 ? (b < 1 ? 1 : b) : 65535 * 16);
}

// Broadcast row walk: row r of the destination read from `b`, whose dims repeat.
__device__ __forceinline__ const float* bcast_row(const Rows& dst, const Rows& b, int64_t r) {
  const int64_t i1 = r % dst.ne1, i2 = (r / dst.ne1) % dst.ne2, i3 = r / (dst.ne1 * dst.ne2);
  return reinterpret_cast<const float*>(static_cast<const uint8_t*>(b.p) + (i1 % b.ne1) * b.nb1 +
                                        (i2 % b.ne2) * b.nb2 + (i3 % b.ne3) * b.nb3);
}

template <int Op>
__global__ void binary_kernel(Rows dst, Rows a, Rows b, int64_t ne0, int64_t n) {
  KITE_GRID_DEPENDENCY();
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = idx / ne0, i = idx % ne0;
    const float x = reinterpret_cast<const float*>(row_ptr(a, r))[i];
    const float z = bcast_row(dst, b, r)[i];
    float y;
    if (Op == 0) y = x + z;
    else if (Op == 1) y = x * z;
    else if (Op == 2) y = silu_mul(x, z);
    else y = gelu_mul(x, z);
    reinterpret_cast<float*>(row_ptr(dst, r))[i] = y;
  }
}

__global__ void scale_kernel(Rows dst, Rows a, float s, float cap, int64_t ne0, int64_t n) {
  KITE_GRID_DEPENDENCY();
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = idx / ne0, i = idx % ne0;
    const float x = reinterpret_cast<const float*>(row_ptr(a, r))[i];
    reinterpret_cast<float*>(row_ptr(dst, r))[i] = cap > 0.f ? cap * tanhf(x * s / cap) : x * s;
  }
}

// Row r, by the whole block: sum of squares in f32, then x * s (* w).
__device__ __forceinline__ void rms_norm_row(const Rows& dst, const Rows& a, const float* w, float eps, int64_t ne0,
                                             int64_t r) {
  const float* x = reinterpret_cast<const float*>(row_ptr(a, r));
  float* y = reinterpret_cast<float*>(row_ptr(dst, r));
  const float s = rms_scale<1>(x, ne0, eps);
  for (int64_t i = threadIdx.x; i < ne0; i += blockDim.x) y[i] = rms_normed(x[i], w, s, i);
}

// One block per row.
__global__ void rms_norm_kernel(Rows dst, Rows a, const float* w, float eps, int64_t ne0) {
  KITE_GRID_DEPENDENCY();
  rms_norm_row(dst, a, w, eps, ne0, blockIdx.x);
}

// One block per row of a, then of b.
__global__ void rms_norm_pair_kernel(NormArgs a, NormArgs b) {
  KITE_GRID_DEPENDENCY();
  const bool first = blockIdx.x < a.n_rows;
  const NormArgs& p = first ? a : b;
  rms_norm_row(p.dst, p.src, p.w, p.eps, p.ne0, first ? blockIdx.x : blockIdx.x - a.n_rows);
}

// The same row, then each warp quantizes whole 32-element blocks of it (launch_quantize_act's
// codes and scales of the values it writes).
__global__ void rms_norm_quantize_kernel(float* dst, Rows a, const float* w, float eps, int64_t ne0, int8_t* q,
                                         float4* ds) {
  KITE_GRID_DEPENDENCY();
  const int64_t r = blockIdx.x;
  const float* x = reinterpret_cast<const float*>(row_ptr(a, r));
  const float s = rms_scale<1>(x, ne0, eps);
  const int lane = threadIdx.x % 32;
  const int64_t n_blocks = ne0 / 32;
  for (int64_t b = threadIdx.x / 32; b < n_blocks; b += blockDim.x / 32) {
    const int64_t i = b * 32 + lane;
    const float y = rms_normed(x[i], w, s, i);
    dst[r * ne0 + i] = y;
    quantize_act_block(y, lane, q + r * ne0 + b * 32, ds + r * n_blocks + b);
  }
}

// One thread per item of a, then of b (b.n_head 0: none).
__global__ void rope_kernel(RopeArgs a, RopeArgs b) {
  KITE_GRID_DEPENDENCY();
  const int64_t na = rope_items(a), n = na + rope_items(b);
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (idx < na) rope_item(a, idx);
    else rope_item(b, idx - na);
  }
}

// A layer's two ropes and two cache writes, float caches: q's items, k's items (each also
// written to k's cache), then v's elements converted into its cache.
__global__ void rope_kv_kernel(RopeArgs q, RopeArgs k, RowConversion kc, RowConversion vc) {
  KITE_GRID_DEPENDENCY();
  const int64_t nq = rope_items(q), nqk = nq + rope_items(k), n = nqk + vc.ne0 * vc.n_rows;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (idx < nq) rope_item(q, idx);
    else if (idx < nqk) rope_item(k, idx - nq, &kc);
    else convert_float_item(vc, idx - nqk);
  }
}

// Float rows to F32/F16/BF16: one thread per element, of a's rows, then of b's.
__global__ void convert_float_kernel(RowConversion a, RowConversion b) {
  KITE_GRID_DEPENDENCY();
  const int64_t na = a.ne0 * a.n_rows, n = na + b.ne0 * b.n_rows;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (idx < na) convert_float_item(a, idx);
    else convert_float_item(b, idx - na);
  }
}

// Float rows to Q8_0, one warp per 32-element block, exactly as the reference quantizer
// (ref_legacy.cpp quantize_q8_0): d = amax / 127, q = round(x * (1 / d)); a's blocks, then b's.
// store_q8_0: block ib of row r of a's destination from element `lane` of it in each lane.
__device__ __forceinline__ void store_q8_0(const RowConversion& a, int64_t r, int64_t ib, float x, int lane) {
  const float amax = warp_max_abs(x);
  const float d = amax / 127.f;
  const float id = d != 0.f ? 1.f / d : 0.f;
  uint8_t* blk = row_ptr(a.dst, a.dst_rows != nullptr ? a.dst_rows[r] : r) + ib * sizeof(quant::BlockQ8_0);
  blk[2 + lane] = static_cast<uint8_t>(static_cast<int8_t>(roundf(__fmul_rn(x, id))));
  if (lane == 0) *reinterpret_cast<uint16_t*>(blk) = __half_as_ushort(__float2half_rn(d));
}
__device__ __forceinline__ void quantize_q8_0_block(const RowConversion& a, int64_t b, int lane) {
  const int64_t per_row = a.ne0 / 32;
  const int64_t r = b / per_row, ib = b % per_row;
  store_q8_0(a, r, ib, load_float(a.src_type, row_ptr(a.src, r), ib * 32 + lane), lane);
}

__global__ void quantize_q8_0_kernel(RowConversion a, RowConversion b) {
  KITE_GRID_DEPENDENCY();
  const int lane = threadIdx.x % 32;
  const int64_t na = a.ne0 / 32 * a.n_rows, n = na + b.ne0 / 32 * b.n_rows;
  for (int64_t blk = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32; blk < n;
       blk += static_cast<int64_t>(gridDim.x) * blockDim.x / 32) {
    if (blk < na) quantize_q8_0_block(a, blk, lane);
    else quantize_q8_0_block(b, blk - na, lane);
  }
}

// rope_kv_kernel for Q8_0 caches, a warp per unit: k's cache blocks (each lane ropes its
// element, writes it to k's rope output and, with the others, quantizes the block into the
// cache: the bits of the rope kernel, then the cache write's quantization of its output), then
// v's blocks, then 32 of q's items (a thread each). Every unit starts with a __syncwarp (free
// on a converged warp), so that every block reaches a barrier: the CUDA emulator runs the
// blocks of a kernel whose first block reached none as plain calls, thread after thread, and
// fails a block that mixes q's units with the others' warp reductions under a shuffled schedule.
__global__ void rope_kv_q8_kernel(RopeArgs q, RopeArgs k, RowConversion kc, RowConversion vc) {
  KITE_GRID_DEPENDENCY();
  const int lane = threadIdx.x % 32;
  const int64_t per_row = kc.ne0 / 32, uk = per_row * kc.n_rows, ukv = uk + vc.ne0 / 32 * vc.n_rows;
  const int64_t nq = rope_items(q), n = ukv + (nq + 31) / 32;
  for (int64_t u = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32; u < n;
       u += static_cast<int64_t>(gridDim.x) * blockDim.x / 32) {
    __syncwarp();
    if (u < uk) {
      const int64_t t = u / per_row, j = u % per_row * 32 + lane, h = j / k.hd, i = j % k.hd;
      const float y = rope_element(k, i, h, t);
      reinterpret_cast<float*>(static_cast<uint8_t*>(k.dst.p) + h * k.dst.nb1 + t * k.dst.nb2)[i] = y;
      store_q8_0(kc, t, u % per_row, y, lane);
    } else if (u < ukv) {
      quantize_q8_0_block(vc, u - uk, lane);
    } else if (const int64_t idx = (u - ukv) * 32 + lane; idx < nq) {
      rope_item(q, idx);
    }
  }
}

}  // namespace

cudaError_t launch_binary(int op, Rows dst, Rows a, Rows b, int64_t ne0, int64_t n_rows, cudaStream_t s) {
  const int64_t n = ne0 * n_rows;
  if (n == 0) return cudaSuccess;
  if (op == 0) KITE_KERNEL(blocks_for(n), kThreads, 0, s, binary_kernel<0>)(dst, a, b, ne0, n);
  else if (op == 1) KITE_KERNEL(blocks_for(n), kThreads, 0, s, binary_kernel<1>)(dst, a, b, ne0, n);
  else if (op == 2) KITE_KERNEL(blocks_for(n), kThreads, 0, s, binary_kernel<2>)(dst, a, b, ne0, n);
  else KITE_KERNEL(blocks_for(n), kThreads, 0, s, binary_kernel<3>)(dst, a, b, ne0, n);
  return cudaGetLastError();
}

// Op::kMoeSum: a block a token; its first warp turns the route into the slots' weights (in
// shared memory, slot j at lane j, j + 32, ...), then the block sums the slots' rows.
__global__ void moe_sum_kernel(float* dst, const float* y, int64_t m, int n_used, const float* route, int64_t route_ld,
                               int norm, float scale) {
  KITE_GRID_DEPENDENCY();
  KITE_SHARED(wts, float[128]);
  const int64_t t = blockIdx.x;
  const float* r = route + t * route_ld;
  if (threadIdx.x < 32) {
    const int lane = static_cast<int>(threadIdx.x);
    float part = 0.f;
    for (int j = lane; j < n_used; j += 32) {
      const float w = r[n_used + j] >= 0.f ? expf(r[j] - r[2 * n_used]) : 0.f;
      wts[j] = w;
      part += w;
    }
    const float sum = warp_sum(part);
    const float mul = (norm ? 1.f / fmaxf(sum, 6.103515625e-5f) : 1.f) * (scale != 0.f ? scale : 1.f);
    for (int j = lane; j < n_used; j += 32) wts[j] *= mul;
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < m; i += blockDim.x) {
    float acc = 0.f;
    for (int j = 0; j < n_used; ++j)
      if (wts[j] != 0.f) acc += wts[j] * y[(t * n_used + j) * m + i];
    dst[t * m + i] = acc;
  }
}

cudaError_t launch_moe_sum(float* dst, const float* y, int64_t m, int n_used, int64_t n_tok, const float* route,
                           int64_t route_ld, bool norm, float scale, cudaStream_t s) {
  if (n_used < 1 || n_used > 128) return cudaErrorInvalidValue;
  if (m == 0 || n_tok == 0) return cudaSuccess;
  KITE_KERNEL(static_cast<unsigned>(n_tok), kThreads, 0, s, moe_sum_kernel)(dst, y, m, n_used, route, route_ld,
                                                                            norm ? 1 : 0, scale);
  return cudaGetLastError();
}

cudaError_t launch_scale(Rows dst, Rows a, float scale, float cap, int64_t ne0, int64_t n_rows, cudaStream_t s) {
  const int64_t n = ne0 * n_rows;
  if (n == 0) return cudaSuccess;
  KITE_KERNEL(blocks_for(n), kThreads, 0, s, scale_kernel)(dst, a, scale, cap, ne0, n);
  return cudaGetLastError();
}

cudaError_t launch_rms_norm(Rows dst, Rows a, const float* w, float eps, int64_t ne0, int64_t n_rows,
                            cudaStream_t s) {
  if (n_rows == 0) return cudaSuccess;
  KITE_KERNEL(static_cast<unsigned>(n_rows), rms_norm_threads(ne0), 0, s, rms_norm_kernel)(dst, a, w, eps, ne0);
  return cudaGetLastError();
}

cudaError_t launch_rms_norm_pair(const NormArgs& a, const NormArgs& b, cudaStream_t s) {
  if (a.ne0 != b.ne0) return cudaErrorInvalidValue;  // (one block size: each norm's sums as alone)
  if (a.n_rows + b.n_rows == 0) return cudaSuccess;
  KITE_KERNEL(static_cast<unsigned>(a.n_rows + b.n_rows), rms_norm_threads(a.ne0), 0, s, rms_norm_pair_kernel)(a, b);
  return cudaGetLastError();
}

cudaError_t launch_rms_norm_quantize(float* dst, Rows a, const float* w, float eps, int64_t ne0, int64_t n_rows,
                                     int8_t* q, float* ds, cudaStream_t s) {
  if (n_rows == 0) return cudaSuccess;
  if (ne0 % 32 != 0) return cudaErrorInvalidValue;
  KITE_KERNEL(static_cast<unsigned>(n_rows), rms_norm_threads(ne0), 0, s, rms_norm_quantize_kernel)(
      dst, a, w, eps, ne0, q, reinterpret_cast<float4*>(ds));
  return cudaGetLastError();
}

cudaError_t launch_rope(const RopeArgs& a, cudaStream_t s, const RopeArgs* b) {
  const RopeArgs none{};
  const RopeArgs& second = b != nullptr ? *b : none;
  const int64_t n = rope_items(a) + rope_items(second);
  if (n == 0) return cudaSuccess;
  KITE_KERNEL(blocks_for(n), kThreads, 0, s, rope_kernel)(a, second);
  return cudaGetLastError();
}

cudaError_t launch_rope_kv(const RopeArgs& q, const RopeArgs& k, const RowConversion& kc, const RowConversion& vc,
                           cudaStream_t s) {
  if ((kc.dst_type == kQ8_0) != (vc.dst_type == kQ8_0) || kc.ne0 != k.hd * k.n_head || kc.n_rows != k.n_tok)
    return cudaErrorInvalidValue;
  if (kc.dst_type == kQ8_0) {
    if (kc.ne0 % 32 != 0 || vc.ne0 % 32 != 0 || kc.src_type != kF32) return cudaErrorInvalidValue;
    const int64_t units = kc.ne0 / 32 * kc.n_rows + vc.ne0 / 32 * vc.n_rows + (rope_items(q) + 31) / 32;
    if (units == 0) return cudaSuccess;
    KITE_KERNEL(blocks_for(units * 32), kThreads, 0, s, rope_kv_q8_kernel)(q, k, kc, vc);
    return cudaGetLastError();
  }
  const int64_t n = rope_items(q) + rope_items(k) + vc.ne0 * vc.n_rows;
  if (n == 0) return cudaSuccess;
  KITE_KERNEL(blocks_for(n), kThreads, 0, s, rope_kv_kernel)(q, k, kc, vc);
  return cudaGetLastError();
}

cudaError_t launch_convert_rows(int src_type, Rows src, int dst_type, Rows dst, const int32_t* dst_rows,
                                int64_t ne0, int64_t n_rows, cudaStream_t s) {
  return launch_convert_rows(RowConversion{src_type, src, dst_type, dst, dst_rows, ne0, n_rows}, s);
}

cudaError_t launch_convert_rows(const RowConversion& a, cudaStream_t s, const RowConversion* b) {
  const RowConversion none{};
  const RowConversion& second = b != nullptr ? *b : none;
  if (b != nullptr && (a.dst_type == kQ8_0) != (b->dst_type == kQ8_0)) return cudaErrorInvalidValue;
  if (a.dst_type == kQ8_0) {
    const int64_t n_blocks = a.ne0 / 32 * a.n_rows + second.ne0 / 32 * second.n_rows;
    if (n_blocks == 0) return cudaSuccess;
    KITE_KERNEL(blocks_for(n_blocks * 32), kThreads, 0, s, quantize_q8_0_kernel)(a, second);
  } else {
    const int64_t n = a.ne0 * a.n_rows + second.ne0 * second.n_rows;
    if (n == 0) return cudaSuccess;
    KITE_KERNEL(blocks_for(n), kThreads, 0, s, convert_float_kernel)(a, second);
  }
  return cudaGetLastError();
}

}  // namespace kite::cuda

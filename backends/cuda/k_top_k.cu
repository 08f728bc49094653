// top_k on the device: each row's k largest entries and, when asked, its log-sum-exp — the
// candidates the host samples from, so a batched step brings back k * 8 bytes a row instead of
// the whole row of logits. Graph::top_k has the contract; backends/cpu/ops_top_k.cpp is the
// reference (equal output, bit for bit, except the log-sum-exp's rounding).
//
// One block per row. A radix select finds the k-th largest key a byte at a time from the top
// (a histogram of 256 bins per pass, usually one or two passes), then the keys above it are
// gathered, ties at the threshold taken lowest index first, and the <= 128 candidates sorted by
// a bitonic sort in shared memory. Each pass reads the row once (from L2 after the first).
// With a draw (Graph::top_k), one more pass draws a token from the whole row (draw_token).
#include <cmath>
#include <cstdint>

#include "backends/cuda/kernels.h"
#include "backends/cuda/launch.cuh"
#include "backends/cuda/quant.cuh"
#include "backends/cuda/warp.cuh"

namespace kite::cuda {
namespace {

constexpr int kMaxK = 128;  // kMaxTopK (src/core/tensor.h)

// An order-preserving key of a float: the larger float, the larger key. 0 for the entries that
// are never candidates (NaN, -inf); -0 is +0 (they compare equal).
// (On the bits alone: no compiler may fold a signed zero or a NaN away.)
__device__ __forceinline__ unsigned sort_key(float x) {
  unsigned u = __float_as_uint(x);
  if ((u & 0x7fffffffu) > 0x7f800000u || u == 0xff800000u) return 0u;
  if (u == 0x80000000u) u = 0u;
  return (u & 0x80000000u) != 0u ? ~u : (u | 0x80000000u);
}

// Inclusive prefix sum over the lanes of a warp (every lane takes part).
__device__ __forceinline__ unsigned warp_scan(unsigned v) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const unsigned t = __shfl_sync(0xffffffffu, v, lane >= o ? lane - o : lane);
    if (lane >= o) v += t;
  }
  return v;
}

// Block-wide reductions; every thread gets the result. `red` is 32 entries of shared memory.
__device__ unsigned block_sum(unsigned v, unsigned* red) {
  v = static_cast<unsigned>(warp_sum_i(static_cast<int>(v)));
  __syncthreads();  // (a previous call's readers are done with red)
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
  __syncthreads();
  const unsigned lane = threadIdx.x % 32;
  return static_cast<unsigned>(warp_sum_i(lane < blockDim.x / 32 ? static_cast<int>(red[lane]) : 0));
}
template <bool kMax>  // the block's maximum, or its sum
__device__ float block_reduce_f(float v, float* red) {
  v = kMax ? warp_max(v) : warp_sum(v);
  __syncthreads();
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
  __syncthreads();
  const unsigned lane = threadIdx.x % 32;
  const float w = lane < blockDim.x / 32 ? red[lane] : kMax ? -INFINITY : 0.f;
  return kMax ? warp_max(w) : warp_sum(w);
}

__device__ __forceinline__ bool better(float va, int ia, float vb, int ib) {
  return va > vb || (va == vb && ia < ib);
}

// Graph::top_k's draw, after the sort (m = the row's largest allowed value): each thread sums
// the weights of a contiguous chunk of the row in double, a block scan places the chunks, and
// the thread whose chunk holds u * total walks it in index order (ties between chunks, from
// rounding, go to the lower index; a target past every chunk to the last allowed entry).
__device__ void draw_token(const float* x, int64_t n, float m, const int32_t* draw, float* out, double* red_d,
                           int* flags) {
  const int tid = static_cast<int>(threadIdx.x), nt = static_cast<int>(blockDim.x);
  const float t = __int_as_float(draw[0]);
  const double u = *reinterpret_cast<const double*>(draw + 2);
  if (!(t > 0.f) || !(m > -INFINITY)) {  // (uniform across the block)
    if (tid == 0) out[0] = -1.f, out[1] = -INFINITY;
    return;
  }
  const float inv_t = 1.f / t;
  const int64_t per = (n + nt - 1) / nt, begin = min(n, per * tid), end = min(n, begin + per);
  double local = 0.0;
  int last = -1;
  for (int64_t i = begin; i < end; ++i) {
    const float v = x[i];
    if (v > -INFINITY) {
      local += expf((v - m) * inv_t);
      last = static_cast<int>(i);
    }
  }
  // Exclusive scan of the chunk sums over the block: warp scans, then the warps' totals.
  const int lane = tid % 32, warp = tid / 32;
  double incl = local;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const double y = __shfl_sync(0xffffffffu, incl, lane >= o ? lane - o : lane);
    if (lane >= o) incl += y;
  }
  __syncthreads();  // (red_d and flags are free)
  if (lane == 31) red_d[warp] = incl;
  if (tid == 0) flags[0] = 0x7fffffff, flags[1] = -1;  // the drawn index, the last allowed one
  __syncthreads();
  double before = 0.0, total = 0.0;
  for (int w = 0; w < nt / 32; ++w) {
    before += w < warp ? red_d[w] : 0.0;
    total += red_d[w];
  }
  if (last >= 0) atomicMax(&flags[1], last);
  const double target = u * total, start = before + incl - local;
  if (local > 0.0 && start <= target && target < start + local) {
    int hit = last;  // (rounding: the walk's own sum fell short of the target)
    double acc = start;
    for (int64_t i = begin; i < end; ++i) {
      const float v = x[i];
      if (!(v > -INFINITY)) continue;
      acc += expf((v - m) * inv_t);
      if (target < acc) {
        hit = static_cast<int>(i);
        break;
      }
    }
    atomicMin(&flags[0], hit);
  }
  __syncthreads();
  if (tid == 0) {  // the token and its logit
    const int drawn = flags[0] != 0x7fffffff ? flags[0] : flags[1];
    out[0] = static_cast<float>(drawn);
    out[1] = x[drawn];
  }
}

__global__ void __launch_bounds__(1024) top_k_kernel(Rows dst, Rows src, Rows draw, int64_t n, int k, int want_lse) {
  KITE_GRID_DEPENDENCY();
  KITE_SHARED(hist, unsigned[256]);
  KITE_SHARED(red, unsigned[32]);
  KITE_SHARED(red_f, float[32]);
  KITE_SHARED(cand_v, float[kMaxK]);
  KITE_SHARED(cand_i, int[kMaxK]);
  KITE_SHARED(state, unsigned[4]);  // the chosen bin, still to take in it, its count; gathered
  KITE_SHARED(red_d, double[32]);
  KITE_SHARED(flags, int[2]);
  const int64_t r = blockIdx.x;
  const float* x = reinterpret_cast<const float*>(row_ptr(src, r));
  float* out = reinterpret_cast<float*>(row_ptr(dst, r));
  const int tid = static_cast<int>(threadIdx.x), nt = static_cast<int>(blockDim.x);

  // Pass 1: the top byte's histogram, the candidates' count and (want_lse) each thread's running
  // max and sum of exp(x - max).
  for (int b = tid; b < 256; b += nt) hist[b] = 0u;
  __syncthreads();
  unsigned valid = 0;
  float m = -INFINITY, s = 0.f;
  for (int64_t i = tid; i < n; i += nt) {
    const float v = x[i];
    const unsigned key = sort_key(v);
    if (key != 0u) {
      ++valid;
      atomicAdd(&hist[key >> 24], 1u);
    }
    if (want_lse && key != 0u) {
      if (v > m) {
        s = (m > -INFINITY ? s * expf(m - v) : 0.f) + 1.f;
        m = v;
      } else {
        s += expf(v - m);
      }
    }
  }
  float lse = 0.f;
  if (want_lse) {
    const float mx = block_reduce_f<true>(m, red_f);
    const float sum = block_reduce_f<false>(m > -INFINITY ? s * expf(m - mx) : 0.f, red_f);
    lse = mx > -INFINITY ? mx + logf(sum) : mx;
  }
  const unsigned n_valid = block_sum(valid, red);
  const unsigned kk = n_valid < static_cast<unsigned>(k) ? n_valid : static_cast<unsigned>(k);

  // Radix select: fix the k-th largest key a byte at a time. After the pass of byte `shift`,
  // keys starting with `prefix` hold the kk-th largest; `remaining` of them are to be taken.
  unsigned prefix = 0u, remaining = kk, in_bin = 0u;
  int shift = 24;
  for (; kk > 0u; shift -= 8) {
    __syncthreads();  // the histogram is complete
    if (tid < 32) {   // warp 0 finds the bin, lane l summing bins 255 - 8l down to 248 - 8l
      unsigned c[8], sum = 0u;
#pragma unroll
      for (int j = 0; j < 8; ++j) sum += (c[j] = hist[255 - 8 * tid - j]);
      const unsigned incl = warp_scan(sum), excl = incl - sum;
      if (excl < remaining && remaining <= incl) {
        unsigned above = excl;
        for (int j = 0; j < 8; ++j) {
          if (above + c[j] >= remaining) {
            state[0] = static_cast<unsigned>(255 - 8 * tid - j);
            state[1] = remaining - above;
            state[2] = c[j];
            break;
          }
          above += c[j];
        }
      }
    }
    __syncthreads();
    prefix |= state[0] << shift;
    remaining = state[1];
    in_bin = state[2];
    // Done when the whole bin is taken (every key >= prefix), or at the last byte.
    if (in_bin == remaining || shift == 0) break;
    for (int b = tid; b < 256; b += nt) hist[b] = 0u;  // (warp 0 read it before the barrier)
    __syncthreads();
    const unsigned fixed = 0xffffffffu << shift;
    for (int64_t i = tid; i < n; i += nt) {
      const unsigned key = sort_key(x[i]);
      if (key != 0u && (key & fixed) == prefix) atomicAdd(&hist[(key >> (shift - 8)) & 255u], 1u);
    }
  }

  // Gather: every key above the threshold (in any order; sorted below), then ties.
  const bool ties = kk > 0u && in_bin != remaining;  // more keys equal the k-th than are taken
  if (tid == 0) state[3] = 0u;
  __syncthreads();
  if (kk > 0u) {
    for (int64_t i = tid; i < n; i += nt) {
      const unsigned key = sort_key(x[i]);
      if (key != 0u && (ties ? key > prefix : key >= prefix)) {
        const unsigned p = atomicAdd(&state[3], 1u);
        cand_v[p] = x[i];
        cand_i[p] = static_cast<int>(i);
      }
    }
  }
  if (ties) {  // the first `remaining` keys equal to prefix, by index: tiles in order, scanned
    const unsigned base = kk - remaining;
    const int warp = tid / 32, lane = tid % 32;
    unsigned taken = 0u;
    for (int64_t t0 = 0; t0 < n && taken < remaining; t0 += nt) {
      const int64_t i = t0 + tid;
      const unsigned eq = i < n && sort_key(x[i]) == prefix ? 1u : 0u;
      const unsigned incl = warp_scan(eq);
      __syncthreads();  // (the previous tile's readers are done with red)
      if (lane == 31) red[warp] = incl;
      __syncthreads();
      unsigned before = 0u, total = 0u;
      for (int w = 0; w < nt / 32; ++w) {
        before += w < warp ? red[w] : 0u;
        total += red[w];
      }
      const unsigned rank = taken + before + incl - eq;
      if (eq != 0u && rank < remaining) {
        cand_v[base + rank] = x[i];
        cand_i[base + rank] = static_cast<int>(i);
      }
      taken += total;
    }
  }
  // Bitonic sort of the kk candidates (padded to a power of two), best first.
  unsigned p2 = 1u;
  while (p2 < kk) p2 <<= 1;
  __syncthreads();
  for (unsigned i = kk + static_cast<unsigned>(tid); i < p2; i += static_cast<unsigned>(nt)) {
    cand_v[i] = -INFINITY;
    cand_i[i] = 0x7fffffff;
  }
  for (unsigned size = 2u; size <= p2; size <<= 1) {
    for (unsigned stride = size >> 1; stride > 0u; stride >>= 1) {
      __syncthreads();
      for (unsigned i = static_cast<unsigned>(tid); i < p2; i += static_cast<unsigned>(nt)) {
        const unsigned j = i ^ stride;
        if (j <= i) continue;
        const bool best_first = (i & size) == 0u;
        const float vi = cand_v[i], vj = cand_v[j];
        const int ii = cand_i[i], ij = cand_i[j];
        if (best_first ? better(vj, ij, vi, ii) : better(vi, ii, vj, ij)) {
          cand_v[i] = vj;
          cand_v[j] = vi;
          cand_i[i] = ij;
          cand_i[j] = ii;
        }
      }
    }
  }
  __syncthreads();
  for (int j = tid; j < k; j += nt) {
    const bool have = static_cast<unsigned>(j) < kk;
    out[j] = have ? cand_v[j] : -INFINITY;
    out[k + j] = have ? static_cast<float>(cand_i[j]) : -1.f;
  }
  if (tid == 0) out[2 * k] = lse;
  if (draw.p != nullptr)
    draw_token(x, n, kk > 0u ? cand_v[0] : -INFINITY, reinterpret_cast<const int32_t*>(row_ptr(draw, r)),
               out + 2 * k + 1, red_d, flags);
}

}  // namespace

cudaError_t launch_top_k(Rows dst, Rows src, Rows draw, int64_t ne0, int64_t n_rows, int k, bool log_sum_exp,
                         cudaStream_t s) {
  if (k < 1 || k > kMaxK) return cudaErrorInvalidValue;
  // A long row (a vocabulary) gets a whole SM's worth of threads: one sequence's step waits
  // for one block.
  const int threads = ne0 >= 32768 ? 1024 : 256;
  KITE_KERNEL(static_cast<unsigned>(n_rows), threads, 0, s, top_k_kernel)(dst, src, draw, ne0, k, log_sum_exp ? 1 : 0);
  return cudaGetLastError();
}

}  // namespace kite::cuda

// Attention over the paged KV cache (semantics: backends/cpu/ops_attention.cpp), on CUDA cores.
//
// A token's keys 0..pos are cut into chunks at fixed boundaries that depend only on the token's
// own length (token_split, attention.cuh). One block computes one (chunk, KV head, token): the
// query heads of the KV head's GQA group are scored against the chunk's keys tile by tile with an
// online softmax, reading K/V rows through the block table. A token with one chunk writes its
// output directly; a longer one (flash-decoding) writes partials (max, sum, unnormalized output)
// that are merged in chunk order: by the last of its chunk blocks to finish (AttentionArgs::count,
// decode), or by a second kernel.
//
// Rows of a sequence with a long run of rows in the batch (prefill chunks) are the tensor-core
// kernel's (k_attention_tc.cu, AttentionArgs::tc_min_run) and return here at once; the rest
// (decode) are this kernel's. Either way a row's path and result depend on its own sequence's
// rows only, never on what else is in the batch.
#include <cmath>

#include "backends/cuda/attention.cuh"
#include "backends/cuda/launch.cuh"
#include "backends/cuda/matvec.cuh"
#include "backends/cuda/warp.cuh"

namespace kite::cuda {
namespace {

constexpr int kTile = 64;       // keys scored per pass
constexpr int kThreads = 128;
constexpr int kMaxGroup = 16;
constexpr int kMaxHd = 256;

// Element i of token t's output, v, into the int8 activations (AttentionArgs::q8): the warp
// holds a whole 32-element block of the row (hd % 32 == 0, and a warp's 32 threads take 32
// consecutive elements), which it quantizes as launch_quantize_act does.
__device__ __forceinline__ void store_int8(const AttentionArgs& a, int t, int i, float v) {
  const int64_t k = static_cast<int64_t>(a.hd) * a.n_kv * a.group;
  const int lane = threadIdx.x % 32;
  quantize_act_block(v, lane, a.q8 + t * k + (i - lane), reinterpret_cast<float4*>(a.q8_ds) + (t * k + i) / 32);
}

// Element d of head h of split token t: its n_chunks partial records merged in chunk order (as
// the CPU's merge_one). L2 loads: the records may be other blocks' of this launch.
__device__ __forceinline__ float merged(const AttentionArgs& a, int t, int h, int d, int n_chunks) {
  const int n_head = a.n_kv * a.group, stride = a.hd + 2;
  const float* part = a.part + (static_cast<int64_t>(t) * n_head + h) * a.max_chunks * stride;
  float mx = -INFINITY;
  for (int c = 0; c < n_chunks; ++c) mx = fmaxf(mx, __ldcg(&part[c * stride]));
  float l = 0.f;
  for (int c = 0; c < n_chunks; ++c) l += expf(__ldcg(&part[c * stride]) - mx) * __ldcg(&part[c * stride + 1]);
  const float inv = 1.f / l;
  float o = 0.f;
  for (int c = 0; c < n_chunks; ++c) o += expf(__ldcg(&part[c * stride]) - mx) * __ldcg(&part[c * stride + 2 + d]);
  return o * inv;
}

__global__ void __launch_bounds__(kThreads) attention_kernel(AttentionArgs a) {
  KITE_GRID_DEPENDENCY();
  KITE_DYNAMIC_SHARED(float, sm);
  const int G = a.group, hd = a.hd;
  const int t = blockIdx.x, g = blockIdx.y, c = blockIdx.z;
  const TokenSplit sp = token_split(a, t);
  if (c >= sp.n_chunks || tc_row(a, t)) return;
  int j0, j1;
  chunk_keys(sp, c, j0, j1);

  float* qs = sm;                   // [G][hd]
  float* acc = qs + G * hd;         // [G][hd]
  float* sc = acc + G * hd;         // [G][kTile] scores, then probabilities
  float* ms = sc + G * kTile;       // running max per head
  float* ls = ms + G;               // running sum per head
  float* cr = ls + G;               // this tile's correction per head
  auto* slots = reinterpret_cast<long long*>(cr + G + (G % 2 == 0 ? 0 : 1));  // [kTile] (8-aligned)

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, n_warps = blockDim.x / 32;
  const int n_head = a.n_kv * G;
  for (int idx = tid; idx < G * hd; idx += blockDim.x) {
    const int h = idx / hd, d = idx % hd;
    const auto* qrow = reinterpret_cast<const float*>(reinterpret_cast<const uint8_t*>(a.q) +
                                                      static_cast<size_t>(g * G + h) * a.q_nb1 +
                                                      static_cast<size_t>(t) * a.q_nb2);
    qs[idx] = qrow[d];
    acc[idx] = 0.f;
  }
  for (int h = tid; h < G; h += blockDim.x) {
    ms[h] = -INFINITY;
    ls[h] = 0.f;
  }
  const int32_t* blocks = a.table + static_cast<int64_t>(a.seq[t]) * a.max_blocks;
  const size_t k_head = kv_head_bytes(a.k_type, hd), v_head = kv_head_bytes(a.v_type, hd);
  __syncthreads();

  for (int tile0 = j0; tile0 < j1; tile0 += kTile) {
    const int n = min(kTile, j1 - tile0);
    for (int jj = tid; jj < n; jj += blockDim.x) {
      const int j = tile0 + jj;
      slots[jj] = static_cast<long long>(blocks[j / a.block_size]) * a.block_size + j % a.block_size;
    }
    __syncthreads();
    // Scores: a warp per key, lanes over the head dimension.
    for (int jj = warp; jj < n; jj += n_warps) {
      const uint8_t* kr = a.k + static_cast<size_t>(slots[jj]) * a.k_nb1 + g * k_head;
      float kv[kMaxHd / 32];
#pragma unroll
      for (int i = 0; i < kMaxHd / 32; ++i) {
        const int d = lane + 32 * i;
        kv[i] = d < hd ? kv_elem(a.k_type, kr, d) : 0.f;
      }
      for (int h = 0; h < G; ++h) {
        float p = 0.f;
#pragma unroll
        for (int i = 0; i < kMaxHd / 32; ++i) {
          const int d = lane + 32 * i;
          if (d < hd) p += qs[h * hd + d] * kv[i];
        }
        p = warp_sum(p);
        if (lane == 0) sc[h * kTile + jj] = cap_score(p * a.scale, a.softcap);
      }
    }
    __syncthreads();
    // Online softmax: a warp per head.
    for (int h = warp; h < G; h += n_warps) {
      float mt = -INFINITY;
      for (int jj = lane; jj < n; jj += 32) mt = fmaxf(mt, sc[h * kTile + jj]);
      mt = warp_max(mt);
      const float m_old = ms[h];
      const float m_new = fmaxf(m_old, mt);
      const float corr = expf(m_old - m_new);
      float sum = 0.f;
      for (int jj = lane; jj < n; jj += 32) {
        const float p = expf(sc[h * kTile + jj] - m_new);
        sc[h * kTile + jj] = p;
        sum += p;
      }
      sum = warp_sum(sum);
      __syncwarp();
      if (lane == 0) {
        ls[h] = ls[h] * corr + sum;
        ms[h] = m_new;
        cr[h] = corr;
      }
    }
    __syncthreads();
    // Output accumulation: a thread per (head, dimension).
    for (int idx = tid; idx < G * hd; idx += blockDim.x) {
      const int h = idx / hd, d = idx % hd;
      float o = acc[idx] * cr[h];
      for (int jj = 0; jj < n; ++jj) {
        const uint8_t* vr = a.v + static_cast<size_t>(slots[jj]) * a.v_nb1 + g * v_head;
        o += sc[h * kTile + jj] * kv_elem(a.v_type, vr, d);
      }
      acc[idx] = o;
    }
    __syncthreads();
  }

  if (sp.n_chunks == 1) {
    float* out = a.out + static_cast<int64_t>(t) * n_head * hd;
    for (int idx = tid; idx < G * hd; idx += blockDim.x) {
      const int h = idx / hd;
      const float v = acc[idx] * (1.f / ls[h]);
      out[(g * G) * hd + idx] = v;
      if (a.q8 != nullptr) store_int8(a, t, (g * G) * hd + idx, v);
    }
    return;
  }
  const int stride = hd + 2;
  for (int idx = tid; idx < G * hd; idx += blockDim.x) {
    const int h = idx / hd, d = idx % hd;
    float* rec = a.part + ((static_cast<int64_t>(t) * n_head + g * G + h) * a.max_chunks + c) * stride;
    rec[2 + d] = acc[idx];
    if (d == 0) {
      rec[0] = ms[h];
      rec[1] = ls[h];
    }
  }
  if (a.count == nullptr) return;  // (the merge kernel merges)
  // The token's chunk blocks of this KV head count themselves in; the last one merges.
  KITE_SHARED(last, int);
  __threadfence();  // this thread's records, before the block counts itself in
  __syncthreads();
  if (tid == 0) {
    unsigned* n = a.count + static_cast<int64_t>(t) * a.n_kv + g;
    last = atomicAdd(n, 1u) == static_cast<unsigned>(sp.n_chunks - 1);
    if (last) *n = 0;  // (for the next launch)
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  float* out = a.out + static_cast<int64_t>(t) * n_head * hd;
  for (int idx = tid; idx < G * hd; idx += blockDim.x) {
    const float v = merged(a, t, g * G + idx / hd, idx % hd, sp.n_chunks);
    out[(g * G) * hd + idx] = v;
    if (a.q8 != nullptr) store_int8(a, t, (g * G) * hd + idx, v);
  }
}

// Merges a split token's partial records in chunk order.
__global__ void attention_merge_kernel(AttentionArgs a) {
  KITE_GRID_DEPENDENCY();
  const int t = blockIdx.x, h = blockIdx.y;
  const TokenSplit sp = token_split(a, t);
  if (sp.n_chunks <= 1) return;
  float* out = a.out + (static_cast<int64_t>(t) * a.n_kv * a.group + h) * a.hd;
  for (int d = threadIdx.x; d < a.hd; d += blockDim.x) {
    const float v = merged(a, t, h, d, sp.n_chunks);
    out[d] = v;
    if (a.q8 != nullptr) store_int8(a, t, h * a.hd + d, v);
  }
}

size_t shared_bytes(int group, int hd) {
  const size_t floats = 2 * static_cast<size_t>(group) * hd + static_cast<size_t>(group) * kTile + 3 * group + 1;
  return (floats + 1) / 2 * 2 * sizeof(float) + kTile * sizeof(long long);
}

}  // namespace

int attention_max_chunks(int64_t max_ctx) {
  const int64_t raw = (max_ctx + kAttnChunk - 1) / kAttnChunk;
  return static_cast<int>(raw < 1 ? 1 : (raw > kAttnMaxChunks ? kAttnMaxChunks : raw));
}

size_t attention_partial_floats(int n_tok, int n_head, int hd, int max_chunks) {
  if (max_chunks <= 1) return 0;
  return static_cast<size_t>(n_tok) * n_head * max_chunks * (hd + 2);
}

bool attention_shape_ok(int hd, int group) {
  // (48 KiB of shared memory in all: the dynamic part and the kernel's `last` flag)
  return hd > 0 && hd <= kMaxHd && group >= 1 && group <= kMaxGroup && shared_bytes(group, hd) + 16 <= 48 * 1024;
}

cudaError_t launch_attention(const AttentionArgs& a, cudaStream_t s) {
  if (a.n_tok == 0) return cudaSuccess;
  if (!attention_shape_ok(a.hd, a.group)) return cudaErrorInvalidValue;
  if (a.q8 != nullptr && (a.q8_ds == nullptr || a.tc_min_run != 0 || a.hd % 32 != 0)) return cudaErrorInvalidValue;
  if (a.count != nullptr && a.tc_min_run != 0) return cudaErrorInvalidValue;
  if (a.tc_min_run > 0) {
    if (const cudaError_t e = launch_attention_tc_pass(a, s); e != cudaSuccess) return e;
  }
  if (a.tc_min_run != 1) {  // (with 1, every row is the tensor-core kernel's)
    const dim3 grid(static_cast<unsigned>(a.n_tok), static_cast<unsigned>(a.n_kv),
                    static_cast<unsigned>(a.max_chunks));
    KITE_KERNEL(grid, kThreads, shared_bytes(a.group, a.hd), s, attention_kernel)(a);
    if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  if (a.max_chunks > 1 && a.count == nullptr) {
    const dim3 mgrid(static_cast<unsigned>(a.n_tok), static_cast<unsigned>(a.n_kv * a.group));
    KITE_KERNEL(mgrid, 128, 0, s, attention_merge_kernel)(a);
  }
  return cudaGetLastError();
}

}  // namespace kite::cuda

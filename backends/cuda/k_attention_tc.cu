// Attention over the paged KV cache on tensor cores (prefill and wide batches): the same
// results as attention_kernel (k_attention.cu) to half-precision rounding, with Q·Kᵀ and P·V as
// half x half -> float WMMA products (m16n16k16, sm_70+).
//
// Work: a block takes kTcRows / group consecutive batch rows (tokens) and one KV head. Its tokens
// fall into runs of one sequence; a run's (token, query head) rows, token-major, are cut into
// 16-row tiles, and each tile is one warp's work item (items dealt to the block's warps in turn).
// A warp alone runs a flash-attention loop for its tile: per step of kTcKeys keys at absolute
// multiples of kTcKeys, it copies the keys through the block table into its own shared memory
// (as half; Q8_0 rows are dequantized), computes the 16 x kTcKeys scores, takes an online softmax
// per row (a row's keys are those of its own chunk, so masked keys count for nothing), rescales
// its output fragments and adds P·V.
//
// Why a row's result does not depend on the batch: a tensor-core product's element (i, j) reads
// only row i of A and column j of B, so a row's scores and output are the same whichever rows
// share its tile; the steps are at fixed key positions; and a step that holds none of a row's
// keys leaves its state exactly as it was (maximum unchanged, correction exp(0) = 1, P = 0 adds
// zeros, and keys past the run are zero-filled, never NaN).
//
// The accumulator fragments' element layout is opaque, so a per-row factor is applied through a
// fragment loaded from a matrix of row numbers: element k of any accumulator fragment is in row
// rows.x[k] (the mapping is the same for every fragment of the type).
//
// Chunks (flash-decoding) are token_split's, as in the CUDA-core kernel: the grid's z is the
// chunk, a row outside chunk z takes no keys there, and split rows write partial records that
// attention_merge_kernel merges.
#include <mma.h>

#include <climits>
#include <cmath>

#include "backends/cuda/attention.cuh"
#include "backends/cuda/launch.cuh"
#include "backends/cuda/warp.cuh"

namespace kite::cuda {
namespace {

namespace wmma = nvcuda::wmma;

constexpr int kTcWarps = 4;
constexpr int kTcThreads = kTcWarps * 32;
constexpr int kTcRows = 16 * kTcWarps;  // (token, head) rows a block aims at
constexpr int kTcKeys = 32;             // keys per step

using AccFrag = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;
using AFrag = wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major>;
using BColFrag = wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major>;
using BRowFrag = wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major>;

// One warp's shared memory. `kv` holds, in turn: the tile's queries [16][HD] (half), each step's
// keys then values [kTcKeys][HD] (half), and at the end the output [16][HD] (float, the same
// bytes: kTcKeys * 2 == 16 * 4).
template <int HD>
struct TcWarp {
  alignas(32) __half kv[kTcKeys * HD];
  alignas(32) float s[16 * kTcKeys];   // scores [row][key]
  alignas(32) __half p[16 * kTcKeys];  // probabilities [row][key]
  float corr[16];                      // this step's correction per row
  float m[16], l[16];                  // final max and sum per row
  int n_chunks[16];                    // the row's chunk count (0: padding row)
};
static_assert(kTcKeys * 2 == 16 * 4, "the output tile reuses the K/V tile's bytes");

template <int HD>
struct TcShared {
  alignas(32) float rows[16 * 16];  // element (i, j) = i
  TcWarp<HD> w[kTcWarps];
};

// Copies keys j0 .. j0 + kTcKeys - 1 of one KV head (those below j_end; the rest zero) through
// the block table into dst [kTcKeys][HD] as half. F16 rows are copied 16 bytes at a time.
template <int HD>
__device__ __forceinline__ void tc_load_keys(const AttentionArgs& a, int type, const uint8_t* base, size_t nb1,
                                             size_t head_off, const int32_t* blocks, int j0, int j_end,
                                             __half* dst) {
  const int lane = threadIdx.x % 32;
  if (type == kF16) {
    constexpr int kParts = HD / 8;  // 16-byte pieces per key
    for (int e = lane; e < kTcKeys * kParts; e += 32) {
      const int key = e / kParts, part = e % kParts, j = j0 + key;
      int4 v = make_int4(0, 0, 0, 0);
      if (j < j_end) {
        const long long slot = static_cast<long long>(blocks[j / a.block_size]) * a.block_size + j % a.block_size;
        v = *reinterpret_cast<const int4*>(base + static_cast<size_t>(slot) * nb1 + head_off + part * 16);
      }
      *reinterpret_cast<int4*>(dst + key * HD + part * 8) = v;
    }
    return;
  }
  for (int e = lane; e < kTcKeys * HD; e += 32) {  // Q8_0
    const int key = e / HD, d = e % HD, j = j0 + key;
    float v = 0.f;
    if (j < j_end) {
      const long long slot = static_cast<long long>(blocks[j / a.block_size]) * a.block_size + j % a.block_size;
      v = kv_elem(type, base + static_cast<size_t>(slot) * nb1 + head_off, d);
    }
    dst[key * HD + d] = __float2half(v);
  }
}

// One warp's item: rows mt * 16 .. mt * 16 + 15 of the run of tokens [t0, t1) (one sequence),
// KV head g, chunk c.
template <int HD>
__device__ void tc_tile(const AttentionArgs& a, TcWarp<HD>& w, const AccFrag& rows, int t0, int t1, int mt, int g,
                        int c) {
  const int G = a.group, lane = threadIdx.x % 32;
  const int n_rows = (t1 - t0) * G;
  // Lanes 2r and 2r + 1 own row r: its keys in this chunk are [lo, hi).
  const int r = lane / 2, half = lane % 2, rr = mt * 16 + r;
  int lo = 0, hi = 0, n_chunks = 0;
  if (rr < n_rows) {
    const TokenSplit sp = token_split(a, t0 + rr / G);
    n_chunks = sp.n_chunks;
    chunk_keys(sp, c, lo, hi);
  }
  const int j_first = warp_min_i(hi > lo ? lo : INT_MAX), j_end = warp_max_i(hi > lo ? hi : 0);
  if (j_end <= j_first) return;  // no row of the tile has keys in this chunk (warp-uniform)
  // Steps at multiples of kTcKeys, whatever rows share the tile (sliding windows start anywhere).
  const int j_begin = j_first / kTcKeys * kTcKeys;
  if (half == 0) w.n_chunks[r] = rr < n_rows ? n_chunks : 0;

  // Queries, pre-scaled, as half: [16][HD] in kv, then one A fragment per 16 dimensions.
  const int n_head = a.n_kv * G;
  for (int e = lane; e < 16 * HD; e += 32) {
    const int row = e / HD, d = e % HD, q_row = mt * 16 + row;
    float v = 0.f;
    if (q_row < n_rows) {
      const int t = t0 + q_row / G, h = g * G + q_row % G;
      const auto* q = reinterpret_cast<const float*>(reinterpret_cast<const uint8_t*>(a.q) +
                                                     static_cast<size_t>(h) * a.q_nb1 + static_cast<size_t>(t) * a.q_nb2);
      v = q[d] * a.scale;
    }
    w.kv[e] = __float2half(v);
  }
  __syncwarp();
  AFrag qf[HD / 16];
#pragma unroll
  for (int k = 0; k < HD / 16; ++k) wmma::load_matrix_sync(qf[k], w.kv + k * 16, HD);
  AccFrag o[HD / 16];
#pragma unroll
  for (int n = 0; n < HD / 16; ++n) wmma::fill_fragment(o[n], 0.f);

  const int32_t* blocks = a.table + static_cast<int64_t>(a.seq[t0]) * a.max_blocks;
  const size_t k_off = static_cast<size_t>(g) * kv_head_bytes(a.k_type, HD);
  const size_t v_off = static_cast<size_t>(g) * kv_head_bytes(a.v_type, HD);
  float m = -INFINITY, l = 0.f;
  for (int j0 = j_begin; j0 < j_end; j0 += kTcKeys) {
    __syncwarp();  // the previous step is done with kv, s and p
    tc_load_keys<HD>(a, a.k_type, a.k, a.k_nb1, k_off, blocks, j0, j_end, w.kv);
    __syncwarp();
#pragma unroll
    for (int n = 0; n < kTcKeys / 16; ++n) {
      AccFrag s;
      wmma::fill_fragment(s, 0.f);
#pragma unroll
      for (int k = 0; k < HD / 16; ++k) {
        BColFrag kb;  // Kᵀ: element (d, key) at kv[key * HD + d]
        wmma::load_matrix_sync(kb, w.kv + n * 16 * HD + k * 16, HD);
        wmma::mma_sync(s, qf[k], kb, s);
      }
      wmma::store_matrix_sync(w.s + n * 16, s, kTcKeys, wmma::mem_row_major);
    }
    __syncwarp();
    // Online softmax of row r over this step's keys (lane half takes keys half * 16 .. + 15).
    float sv[16];
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const int key = half * 16 + i, j = j0 + key;
      sv[i] = j >= lo && j < hi ? cap_score(w.s[r * kTcKeys + key], a.softcap) : -INFINITY;
      mx = fmaxf(mx, sv[i]);
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    const float m_new = fmaxf(m, mx);
    const float corr = m_new == -INFINITY ? 1.f : expf(m - m_new);
    float sum = 0.f;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      // The rounded probability is both summed and multiplied, so the output's weights sum to 1.
      const __half p = __float2half(sv[i] == -INFINITY ? 0.f : expf(sv[i] - m_new));
      w.p[r * kTcKeys + half * 16 + i] = p;
      sum += __half2float(p);
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    l = l * corr + sum;
    m = m_new;
    if (half == 0) w.corr[r] = corr;
    __syncwarp();
    tc_load_keys<HD>(a, a.v_type, a.v, a.v_nb1, v_off, blocks, j0, j_end, w.kv);
    __syncwarp();
    AFrag pa[kTcKeys / 16];
#pragma unroll
    for (int k = 0; k < kTcKeys / 16; ++k) wmma::load_matrix_sync(pa[k], w.p + k * 16, kTcKeys);
#pragma unroll
    for (int n = 0; n < HD / 16; ++n) {
      for (int e = 0; e < o[n].num_elements; ++e) o[n].x[e] *= w.corr[static_cast<int>(rows.x[e])];
#pragma unroll
      for (int k = 0; k < kTcKeys / 16; ++k) {
        BRowFrag vb;  // V: element (key, d) at kv[key * HD + d]
        wmma::load_matrix_sync(vb, w.kv + k * 16 * HD + n * 16, HD);
        wmma::mma_sync(o[n], pa[k], vb, o[n]);
      }
    }
  }
  __syncwarp();
  auto* out_tile = reinterpret_cast<float*>(w.kv);  // [16][HD]
#pragma unroll
  for (int n = 0; n < HD / 16; ++n) wmma::store_matrix_sync(out_tile + n * 16, o[n], HD, wmma::mem_row_major);
  if (half == 0) {
    w.m[r] = m;
    w.l[r] = l;
  }
  __syncwarp();
  for (int e = lane; e < 16 * HD; e += 32) {
    const int row = e / HD, d = e % HD, q_row = mt * 16 + row;
    const int nc = w.n_chunks[row];
    if (q_row >= n_rows || c >= nc) continue;
    const int t = t0 + q_row / G, h = g * G + q_row % G;
    if (nc == 1) {
      a.out[(static_cast<int64_t>(t) * n_head + h) * HD + d] = out_tile[e] * (1.f / w.l[row]);
      continue;
    }
    float* rec = a.part + ((static_cast<int64_t>(t) * n_head + h) * a.max_chunks + c) * (HD + 2);
    rec[2 + d] = out_tile[e];
    if (d == 0) {
      rec[0] = w.m[row];
      rec[1] = w.l[row];
    }
  }
}

template <int HD>
__global__ void __launch_bounds__(kTcThreads) attention_tc_kernel(AttentionArgs a) {
  KITE_GRID_DEPENDENCY();
  KITE_SHARED(sh, TcShared<HD>);
  const int tokens = max(1, kTcRows / a.group);
  const int r0 = blockIdx.x * tokens, r1 = min(a.n_tok, r0 + tokens);
  const int g = blockIdx.y, c = blockIdx.z, warp = threadIdx.x / 32;
  for (int i = threadIdx.x; i < 16 * 16; i += kTcThreads) sh.rows[i] = static_cast<float>(i / 16);
  __syncthreads();
  AccFrag rows;
  wmma::load_matrix_sync(rows, sh.rows, 16, wmma::mem_row_major);
  // Runs of one sequence among the block's tokens; their 16-row tiles dealt to the warps in turn.
  int item = 0;
  for (int t0 = r0; t0 < r1;) {
    int t1 = t0 + 1;
    while (t1 < r1 && a.seq[t1] == a.seq[t0]) ++t1;
    const int n_tiles = tc_row(a, t0) ? ((t1 - t0) * a.group + 15) / 16 : 0;  // (short runs: CUDA-core)
    for (int mt = 0; mt < n_tiles; ++mt, ++item)
      if (item % kTcWarps == warp) tc_tile<HD>(a, sh.w[warp], rows, t0, t1, mt, g, c);
    t0 = t1;
  }
}

}  // namespace

bool attention_tc_ok(const AttentionArgs& a) {
  // F16 rows are read 16 bytes at a time: the cache base and row stride must allow it.
  auto type_ok = [](int type, const uint8_t* p, size_t nb1) {
    return type == kQ8_0 || (type == kF16 && reinterpret_cast<uintptr_t>(p) % 16 == 0 && nb1 % 16 == 0);
  };
  return (a.hd == 64 || a.hd == 128) && a.group >= 1 && type_ok(a.k_type, a.k, a.k_nb1) &&
         type_ok(a.v_type, a.v, a.v_nb1);
}

cudaError_t launch_attention_tc_pass(const AttentionArgs& a, cudaStream_t s) {
  if (!attention_tc_ok(a)) return cudaErrorInvalidValue;
  const int tokens = a.group >= kTcRows ? 1 : kTcRows / a.group;
  const dim3 grid(static_cast<unsigned>((a.n_tok + tokens - 1) / tokens), static_cast<unsigned>(a.n_kv),
                  static_cast<unsigned>(a.max_chunks));
  if (a.hd == 64) KITE_KERNEL(grid, kTcThreads, 0, s, attention_tc_kernel<64>)(a);
  else KITE_KERNEL(grid, kTcThreads, 0, s, attention_tc_kernel<128>)(a);
  return cudaGetLastError();
}

}  // namespace kite::cuda

// kite/backends/cuda/matvec.cuh — how a mat-vec launch (kernels.h MatVecJob: up to three weights
// against the same activation columns, optionally with the swiglu or residual-add epilogue)
// spreads its weights' rows over blocks, one row a warp, and how a warp stores what it summed;
// and the int8 activations' quantization. Shared by the int8 kernels (mmvq.cuh), the float-weight
// one (k_mmv.cu) and the elementwise ones (k_elementwise.cu). Internal to backends/cuda.
#pragma once

#include <type_traits>

#include "backends/cuda/kernels.h"
#include "backends/cuda/launch.cuh"
#include "backends/cuda/norm.cuh"
#include "backends/cuda/rope.cuh"
#include "backends/cuda/warp.cuh"

namespace kite::cuda {

inline constexpr int kMatVecWarps = 4;  // rows per block

// What a launch computes after its rows (matvec_body's TAIL): nothing more, the residual sum's
// norm (MatVecJob::norm), the ropes and cache writes of q, k and v (MatVecJob::with_rope), or
// those after qwen3's per-head norms of q and k (MatVecRope::head_norm).
enum MatVecTail { kTailNone = 0, kTailNorm = 1, kTailRope = 2, kTailHeadNormRope = 3 };
// Blocks an SM must hold of a kTailHeadNormRope kernel (its __launch_bounds__ minimum, where the
// others give none: a minimum of 1 lets ptxas take far more registers than no minimum does):
// its tail alone would take 80 registers a thread, 6 blocks an SM, and the streaming of the
// weight rows wants the warps.
inline constexpr int kHeadNormMinBlocks = 8;

// A MatVecJob as its kernel reads it: output j owns blocks first_block[j] .. first_block[j + 1] - 1.
// With GLU every block belongs to output 0, and its warps take a row of both gate and up.
struct MatVecGrid {
  MatVecJob job;
  unsigned first_block[kMaxMatVecOuts];
  unsigned blocks;
};

inline MatVecGrid matvec_grid(const MatVecJob& job) {
  MatVecGrid g{job, {}, 0};
  const int outs = job.glu != nullptr ? 1 : job.n_out;
  for (int j = 0; j < kMaxMatVecOuts; ++j) {
    g.first_block[j] = j < outs ? g.blocks : ~0u;
    if (j < outs) g.blocks += static_cast<unsigned>((job.out[j].m + kMatVecWarps - 1) / kMatVecWarps);
  }
  return g;
}

// silu(x) * z, as Op::kSwiglu's kernel (k_elementwise.cu) computes it: every step rounded on its
// own (no contraction into a multiply-add), so both call sites give the same bits.
__device__ __forceinline__ float silu_mul(float x, float z) { return __fmul_rn(x / __fadd_rn(1.f, expf(-x)), z); }
// gelu(x) * z with gelu's tanh form as the CPU computes it (backends/cpu/matmul.h kGeluC):
// x / (1 + exp(-2 c x (1 + c3 x^2))).
__device__ __forceinline__ float gelu_mul(float x, float z) {
  const float t = -2.f * 0.7978845608028654f * x * (1.f + 0.044715f * x * x);
  return __fmul_rn(x / __fadd_rn(1.f, expf(t)), z);
}

// The int8 activations (kernels.h launch_quantize_act): a warp holds element `lane` of a
// 32-element block in v; d = amax / 127, q = round(v / d), and lane 0 stores the block's float4
// {d, d * sum(q[0..15]), d * sum(q[16..31]), 0}.
__device__ __forceinline__ void quantize_act_block(float v, int lane, int8_t* q, float4* ds) {
  const float d = warp_max_abs(v) / 127.f;
  const float id = d != 0.f ? 1.f / d : 0.f;
  const int qi = static_cast<int>(roundf(v * id));
  q[lane] = static_cast<int8_t>(qi);
  const int s0 = warp_sum_i(lane < 16 ? qi : 0);
  const int s1 = warp_sum_i(lane < 16 ? 0 : qi);
  if (lane == 0) *ds = make_float4(d, d * static_cast<float>(s0), d * static_cast<float>(s1), 0.f);
}

// The output block b computes (its index in *out), and its row for warp `warp` (by selects: no
// indexing into the kernel's parameters).
__device__ __forceinline__ MatVecOut matvec_out(const MatVecGrid& g, unsigned b, int warp, int64_t* row, int* out) {
  const int j = b >= g.first_block[2] ? 2 : b >= g.first_block[1] ? 1 : 0;
  *row = static_cast<int64_t>(b - g.first_block[j]) * kMatVecWarps + warp;
  *out = j;
  return j == 0 ? g.job.out[0] : j == 1 ? g.job.out[1] : g.job.out[2];
}

// Sums each lane's partial dots of `row` (acc; with GLU also up's, of out[1]'s row) over the warp
// and stores them (plus the bias, without GLU), with the job's epilogue (the glu product, or the
// residual sum).
template <int NC, bool GLU>
__device__ __forceinline__ void matvec_store(const MatVecGrid& g, const MatVecOut& o, int64_t row, int lane,
                                             const float (&acc)[NC], const float (&up)[NC]) {
#pragma unroll
  for (int c = 0; c < NC; ++c) {
    float v = warp_sum(acc[c]);
    KITE_ASSUME_GLOBAL(o.dst);
    if (GLU) {
      const float u = warp_sum(up[c]);
      if (lane == 0) {
        KITE_ASSUME_GLOBAL(g.job.out[1].dst);
        KITE_ASSUME_GLOBAL(g.job.glu);
        o.dst[c * o.ldd + row] = v;
        g.job.out[1].dst[c * g.job.out[1].ldd + row] = u;
        g.job.glu[c * g.job.glu_ldd + row] = g.job.gelu ? gelu_mul(v, u) : silu_mul(v, u);
      }
    } else if (lane == 0) {
      if (o.bias != nullptr) {  // (the add op's formula)
        KITE_ASSUME_GLOBAL(o.bias);
        v = v + o.bias[row];
      }
      o.dst[c * o.ldd + row] = v;
      if (g.job.sum != nullptr) {
        KITE_ASSUME_GLOBAL(g.job.add);
        KITE_ASSUME_GLOBAL(g.job.sum);
        g.job.sum[c * g.job.sum_ld + row] = g.job.add[c * g.job.add_ld + row] + v;
      }
    }
  }
}

// The swiglu output's int8 activations (MatVecJob::glu_q), after this block's warps stored their
// rows: the 32 / kMatVecWarps blocks of a 32-row stretch each count themselves in, and the last
// one quantizes the stretch for every column, reading the others' stores from L2. Every warp of
// the block calls it (m % 32 == 0: no warp's row is past m).
template <int NC>
__device__ __forceinline__ void matvec_glu_quantize(const MatVecGrid& g, int warp, int lane) {
  constexpr unsigned kBlocksPerStretch = 32 / kMatVecWarps;
  KITE_SHARED(last, int);
  const unsigned stretch = blockIdx.x / kBlocksPerStretch;
  KITE_ASSUME_GLOBAL(g.job.glu_count);
  if (lane == 0) __threadfence();  // this warp's glu store, before the block counts itself in
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(&g.job.glu_count[stretch], 1u) == kBlocksPerStretch - 1;
    if (last) g.job.glu_count[stretch] = 0;  // (for the next launch)
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  const int64_t m = g.job.out[0].m, i = static_cast<int64_t>(stretch) * 32 + lane;
  auto* ds = reinterpret_cast<float4*>(g.job.glu_ds);
  KITE_ASSUME_GLOBAL(g.job.glu);
  KITE_ASSUME_GLOBAL(g.job.glu_q);
  for (int c = warp; c < NC; c += kMatVecWarps)
    quantize_act_block(__ldcg(&g.job.glu[c * g.job.glu_ldd + i]), lane, g.job.glu_q + c * m + stretch * 32,
                       ds + c * (m / 32) + stretch);
}

// rms_norm of the residual sum (MatVecJob::norm), after this block's warps stored their rows:
// every block counts itself in, and the last one normalizes the sum's columns, reading the
// others' stores from L2, in rms_scale's order (the norm kernels' bits), then (norm_q) quantizes
// them. Every warp of the block calls it (m % 32 == 0: no warp's row is past m).
template <int NC>
__device__ __forceinline__ void matvec_sum_norm(const MatVecGrid& g, int warp, int lane) {
  KITE_SHARED(last, int);
  const MatVecJob& j = g.job;
  KITE_ASSUME_GLOBAL(j.norm_count);
  if (lane == 0) __threadfence();  // this warp's sum stores, before the block counts itself in
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(j.norm_count, 1u) == gridDim.x - 1;
    if (last) *j.norm_count = 0;  // (for the next launch)
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  const int64_t m = j.out[0].m, n_blocks = m / 32;
  KITE_ASSUME_GLOBAL(j.sum);
  KITE_ASSUME_GLOBAL(j.norm);
  float s[NC];
#pragma unroll
  for (int c = 0; c < NC; ++c)
    s[c] = rms_scale<1024 / (kMatVecWarps * 32), true>(j.sum + c * j.sum_ld, m, j.norm_eps);
  // Each warp normalizes (and quantizes) 32-element blocks, kBatch of them loaded at a time.
  constexpr int kBatch = 8;
  auto* ds = reinterpret_cast<float4*>(j.norm_ds);
  for (int64_t b0 = warp; b0 < NC * n_blocks; b0 += kBatch * kMatVecWarps) {
    float y[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int64_t b = b0 + u * kMatVecWarps, c = b / n_blocks, i = b % n_blocks * 32 + lane;
      y[u] = b < NC * n_blocks ? rms_normed(__ldcg(j.sum + c * j.sum_ld + i), j.norm_w, s[c], i) : 0.f;
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int64_t b = b0 + u * kMatVecWarps, c = b / n_blocks, i = b % n_blocks * 32 + lane;
      if (b >= NC * n_blocks) break;  // (the same for the whole warp)
      j.norm[c * m + i] = y[u];
      if (j.norm_q != nullptr) quantize_act_block(y[u], lane, j.norm_q + c * m + i - lane, ds + b);
    }
  }
}

// The row that warp-row `row` (block * kMatVecWarps + warp) of out[j] computes in a launch with
// the rope tail (not the head norms'): itself, except in q or k with rotated halves (mode 2),
// where each block's four rows within n_rot are two rotary pairs, e, e + 1, e + half and
// e + 1 + half of their head (n_rot and hd multiples of 4, so that a block's rows stay in one
// head; a bijection on the rows).
__device__ __forceinline__ int64_t matvec_rope_row(const MatVecGrid& g, int j, int64_t row) {
  static_assert(kMatVecWarps == 4, "a block's rows: two rotary pairs");
  const MatVecRope& r = g.job.rope;
  const int role = r.first + j;
  if (role == MatVecRope::kV) return row;
  const int64_t hd = role == MatVecRope::kQ ? r.q.hd : r.k.hd;
  const int64_t n_rot = role == MatVecRope::kQ ? r.q.n_rot : r.k.n_rot;
  const int mode = role == MatVecRope::kQ ? r.q.mode : r.k.mode;
  const int64_t i = row % hd;
  if (mode == 0 || i >= n_rot) return row;
  const int64_t w = i % 4;
  return row - i + (i - w) / 2 + (w & 1) + (w >= 2 ? n_rot / 2 : 0);
}

// The rope tail after qwen3's per-head norms (MatVecRope::head_norm), one column: a block of
// q or k (its rows lie in one head) counts itself in on its head's counter, and the head's last
// block normalizes the head in rms_scale's order, reading the other blocks' rows from L2, then
// ropes it and (k) writes it to the cache with rope_kv_kernel's items; each row of v is
// converted into its cache by its own warp.
__device__ __forceinline__ void matvec_head_norm_tail(const MatVecGrid& g, int role, int64_t row, int lane) {
  const MatVecRope& r = g.job.rope;
  if (role == MatVecRope::kV) {
    if (lane == 0) convert_float_item(r.vc, row);
    return;
  }
  KITE_SHARED(last, int);
  const int64_t hd = role == MatVecRope::kQ ? r.q.hd : r.k.hd, h = row / hd;
  if (lane == 0) __threadfence();  // this warp's row, before the block counts itself in
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned* count = r.head_count + (role == MatVecRope::kK ? r.q.n_head : 0) + h;
    KITE_ASSUME_GLOBAL(count);
    last = atomicAdd(count, 1u) == hd / kMatVecWarps - 1;
    if (last) *count = 0;  // (for the next launch)
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  auto head = [h](const NormArgs& n, const RopeArgs& a, const RowConversion* cache) {
    const auto* x = reinterpret_cast<const float*>(row_ptr(n.src, h));
    auto* y = reinterpret_cast<float*>(row_ptr(n.dst, h));
    const float s = rms_scale<2, true>(x, n.ne0, n.eps);  // (256 virtual threads at most: hd < 1024)
    for (int64_t i = threadIdx.x; i < n.ne0; i += blockDim.x) y[i] = rms_normed(__ldcg(x + i), n.w, s, i);
    __syncthreads();  // (the head's norm, before its ropes read it)
    const int64_t per_head = a.hd - a.n_rot / 2;
    for (int64_t e = threadIdx.x; e < per_head; e += blockDim.x) rope_item(a, h * per_head + e, cache);
  };
  if (role == MatVecRope::kQ) head(r.qn, r.q, nullptr);
  else head(r.kn, r.k, &r.kc);
}

// The ropes of q and k and the cache writes of k and v (MatVecJob::with_rope), after this block's
// warps stored their rows of out[j] (q, k or v by MatVecRope::first): as rope_kv_kernel's items,
// which read those rows back. Lane 0 of the warp of a rotary pair's first row ropes it with its
// second (mode 0: the next row; mode 2: n_rot / 2 rows on, in this block by matvec_rope_row), a
// row past n_rot is copied, a row of v is converted into its cache.
// Every warp of the block calls it (each m a multiple of kMatVecWarps: no warp's row is past m).
template <int NC>
__device__ __forceinline__ void matvec_rope_tail(const MatVecGrid& g, int j, int64_t row, int lane) {
  __syncthreads();  // (the block's stores of its rows, before they are read back)
  if (lane != 0) return;
  const MatVecRope& r = g.job.rope;
  const int role = r.first + j;
  // rope_kv_kernel's item of row `row` of token c in a (none for the second of a pair).
  auto item = [row](const RopeArgs& a, int c, int64_t* idx) {
    const int64_t h = row / a.hd, i = row % a.hd, half = a.n_rot / 2;
    int64_t e = half + (i - a.n_rot);  // (past n_rot)
    if (i < a.n_rot) {
      if (a.mode == 0 ? i % 2 != 0 : i >= half) return false;
      e = a.mode == 0 ? i / 2 : i;
    }
    *idx = (c * a.n_head + h) * (a.hd - half) + e;
    return true;
  };
#pragma unroll
  for (int c = 0; c < NC; ++c) {
    int64_t idx;
    if (role == MatVecRope::kQ) {
      if (item(r.q, c, &idx)) rope_item(r.q, idx);
    } else if (role == MatVecRope::kK) {
      if (item(r.k, c, &idx)) rope_item(r.k, idx, &r.kc);
    } else {
      convert_float_item(r.vc, c * r.vc.ne0 + row);
    }
  }
}

// Before KITE_GRID_DEPENDENCY (launch.cuh): the first KiB of this warp's weight rows (about what
// its lanes read first) into L2, while the previous kernel still runs. Bounded, so that every
// resident warp's prefetches fit in L2 beside the previous kernel's data. (L2 is where the SMs'
// writes meet, so a prefetch never makes a later read stale.)
inline constexpr int kPrefetchLines = 8;  // 128-byte lines a row
template <bool GLU>
__device__ __forceinline__ void matvec_prefetch(const MatVecGrid& g, const MatVecOut& o, int64_t row, int lane) {
  if (row >= o.m || lane >= kPrefetchLines) return;
  const size_t off = static_cast<size_t>(lane) * 128;
  if (off < o.row_bytes) KITE_PREFETCH_L2(static_cast<const uint8_t*>(o.w) + row * o.row_bytes + off);
  if (GLU) {
    const MatVecOut& u = g.job.out[1];
    if (off < u.row_bytes) KITE_PREFETCH_L2(static_cast<const uint8_t*>(u.w) + row * u.row_bytes + off);
  }
}

// Before KITE_GRID_DEPENDENCY, in a launch with the norm: one 128-byte line of the norm's weight
// a block into L2 (the lines in turn), for the last block's read (the weight is read once a step,
// so the weights streamed in between have evicted it).
__device__ __forceinline__ void matvec_norm_prefetch(const MatVecGrid& g) {
  if (threadIdx.x != 0 || g.job.norm_w == nullptr) return;
  const int64_t lines = g.job.out[0].m / 32;  // (m % 32 == 0: 32 floats a line)
  if (blockIdx.x < lines) KITE_PREFETCH_L2(g.job.norm_w + static_cast<int64_t>(blockIdx.x) * 32);
}

// A mat-vec kernel's whole body around its dot product: `dot(row_ptr, lane, acc)` adds this
// lane's share of a weight row times every column to acc[NC]. Each warp takes a row (with GLU,
// of gate and of up), the warp's sums are stored with the job's epilogue, then (kInt8, where the
// job asks) the int8 quantization of the swiglu output, or the TAIL: the sum's norm, or the
// ropes and cache writes.
template <int NC, bool GLU, int TAIL, bool kInt8, class Dot>
__device__ __forceinline__ void matvec_body(const MatVecGrid& g, Dot dot) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int64_t row;
  int j;
  const MatVecOut o = matvec_out(g, blockIdx.x, warp, &row, &j);
  if constexpr (TAIL == kTailRope) row = matvec_rope_row(g, j, row);
  matvec_prefetch<GLU>(g, o, row, lane);
  if constexpr (TAIL == kTailNorm) matvec_norm_prefetch(g);
  KITE_GRID_DEPENDENCY();
  if (row >= o.m) return;
  float acc[NC], up[NC];
#pragma unroll
  for (int c = 0; c < NC; ++c) acc[c] = up[c] = 0.f;
  dot(static_cast<const uint8_t*>(o.w) + row * o.row_bytes, lane, acc);
  if (GLU) {
    const MatVecOut& u = g.job.out[1];
    dot(static_cast<const uint8_t*>(u.w) + row * u.row_bytes, lane, up);
  }
  matvec_store<NC, GLU>(g, o, row, lane, acc, up);
  if constexpr (GLU && kInt8) {
    if (g.job.glu_q != nullptr) matvec_glu_quantize<NC>(g, warp, lane);
  }
  if constexpr (TAIL == kTailNorm) matvec_sum_norm<NC>(g, warp, lane);
  if constexpr (TAIL == kTailRope) matvec_rope_tail<NC>(g, j, row, lane);
  if constexpr (TAIL == kTailHeadNormRope) matvec_head_norm_tail(g, g.job.rope.first + j, row, lane);
}

// The tail a job asks for.
inline MatVecTail matvec_tail(const MatVecJob& job) {
  if (job.norm != nullptr) return kTailNorm;
  if (!job.with_rope) return kTailNone;
  return job.rope.head_norm ? kTailHeadNormRope : kTailRope;
}

// Launches kernel<NC, GLU, TAIL> for n = 1..kMaxMmvCols columns: pick(integral_constant<int, NC>,
// bool_constant<GLU>, integral_constant<int, TAIL>) returns the kernel, launch(kernel) launches
// it. The tails' kernels are their own instances (NC <= kMaxNormTailCols, kMaxRopeTailCols): the
// other launches keep the registers their loops need.
template <class Pick, class Launch>
cudaError_t matvec_dispatch(int n, bool glu, MatVecTail tail, Pick pick, Launch launch) {
  using Yes = std::true_type;
  using No = std::false_type;
  auto go = [&](auto nc) {
    constexpr int kNc = decltype(nc)::value;
    if (glu) {
      launch(pick(nc, Yes{}, std::integral_constant<int, kTailNone>{}));
    } else if (tail == kTailNone) {
      launch(pick(nc, No{}, std::integral_constant<int, kTailNone>{}));
    } else if (tail == kTailNorm) {
      if constexpr (kNc <= kMaxNormTailCols) launch(pick(nc, No{}, std::integral_constant<int, kTailNorm>{}));
    } else if constexpr (kNc <= kMaxRopeTailCols) {
      if (tail == kTailRope) launch(pick(nc, No{}, std::integral_constant<int, kTailRope>{}));
      else launch(pick(nc, No{}, std::integral_constant<int, kTailHeadNormRope>{}));
    }
  };
  switch (n) {
    case 1: go(std::integral_constant<int, 1>{}); break;
    case 2: go(std::integral_constant<int, 2>{}); break;
    case 3: go(std::integral_constant<int, 3>{}); break;
    case 4: go(std::integral_constant<int, 4>{}); break;
    case 5: go(std::integral_constant<int, 5>{}); break;
    case 6: go(std::integral_constant<int, 6>{}); break;
    case 7: go(std::integral_constant<int, 7>{}); break;
    case 8: go(std::integral_constant<int, 8>{}); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

// Whether a job's rope tail (MatVecJob::with_rope) is well formed for n columns.
inline bool matvec_rope_ok(const MatVecJob& job, int n) {
  const MatVecRope& r = job.rope;
  if (job.glu != nullptr || job.sum != nullptr || n > kMaxRopeTailCols || r.first < MatVecRope::kQ ||
      r.first + job.n_out > MatVecRope::kV + 1)
    return false;
  // Rotary pairs in a block: n_rot and hd even (adjacent pairs), or multiples of 4 (rotated
  // halves: matvec_rope_row); with head norms hd a multiple of 4 (a block's rows in one head).
  auto rope_ok = [&](const RopeArgs& a, int64_t m) {
    const int64_t rot_align = a.mode != 0 && !r.head_norm ? kMatVecWarps : 2;
    const int64_t hd_align = a.mode != 0 || r.head_norm ? kMatVecWarps : 2;
    return a.hd % hd_align == 0 && a.n_rot % rot_align == 0 && a.n_rot <= a.hd && a.n_tok == n &&
           a.hd * a.n_head == m;
  };
  auto norm_ok = [&](const NormArgs& h, const RopeArgs& a) {
    return !r.head_norm || (h.ne0 == a.hd && h.n_rows == a.n_head * n && a.hd < 1024 && r.head_count != nullptr);
  };
  if (!norm_ok(r.qn, r.q) || !norm_ok(r.kn, r.k)) return false;
  for (int j = 0; j < job.n_out; ++j) {
    const int64_t m = job.out[j].m;
    if (m % kMatVecWarps != 0) return false;
    switch (r.first + j) {
      case MatVecRope::kQ:
        if (!rope_ok(r.q, m)) return false;
        break;
      case MatVecRope::kK:
        if (!rope_ok(r.k, m) || r.kc.ne0 != m || r.kc.n_rows != n || r.kc.dst_type == kQ8_0) return false;
        break;
      default:
        if (r.vc.ne0 != m || r.vc.n_rows != n || r.vc.dst_type == kQ8_0) return false;
    }
  }
  return true;
}

// Whether a job of n columns is well formed: 1..kMaxMatVecOuts outputs; GLU: two of equal m,
// without biases; a sum: one; its norm: kMaxNormTailCols columns at most, whole 32-row blocks;
// the rope tail: matvec_rope_ok.
inline bool matvec_job_ok(const MatVecJob& job, int n) {
  if (job.n_out < 1 || job.n_out > kMaxMatVecOuts) return false;
  if (job.glu != nullptr && (job.n_out != 2 || job.out[0].m != job.out[1].m || job.out[0].bias != nullptr ||
                             job.out[1].bias != nullptr))
    return false;
  if (job.sum != nullptr && (job.n_out != 1 || job.glu != nullptr || job.add == nullptr)) return false;
  if (job.norm != nullptr && (job.sum == nullptr || n > kMaxNormTailCols || job.out[0].m % 32 != 0 ||
                              job.norm_count == nullptr ||
                              (job.norm_q != nullptr) != (job.norm_ds != nullptr)))
    return false;
  return !job.with_rope || (job.norm == nullptr && matvec_rope_ok(job, n));
}

}  // namespace kite::cuda

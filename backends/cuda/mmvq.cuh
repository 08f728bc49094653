// kite/backends/cuda/mmvq.cuh — the int8 matrix-vector kernel for 1..8 activation columns.
//
// One warp per weight row (matvec.cuh spreads a launch's weights over the blocks); lane l takes
// 32-element units l, l+32, ... of the row (so a warp reads a contiguous stretch of blocks),
// decodes each once (quant.cuh) and dots it with every column's int8 activations by __dp4a.
// Included by one .cu file per type family.
#pragma once

#include "backends/cuda/kernels.h"
#include "backends/cuda/launch.cuh"
#include "backends/cuda/matvec.cuh"
#include "backends/cuda/quant.cuh"

namespace kite::cuda {

// acc[c] += this lane's share of row wr · column c.
template <int T, int NC>
__device__ __forceinline__ void mmvq_dot(const uint8_t* wr, int n_units, const int8_t* q, const float4* ds, int lane,
                                         float (&acc)[NC]) {
  KITE_ASSUME_GLOBAL(wr);
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
}

template <int T, int NC, bool GLU, int TAIL>
__device__ __forceinline__ void mmvq_body(const MatVecGrid& g, int n_units, const int8_t* q, const float4* ds) {
  matvec_body<NC, GLU, TAIL, true>(g, [&](const uint8_t* wr, int lane, float (&acc)[NC]) {
    mmvq_dot<T, NC>(wr, n_units, q, ds, lane, acc);
  });
}
template <int T, int NC, bool GLU, int TAIL>
__global__ void __launch_bounds__(kMatVecWarps * 32)
    mmvq_kernel(MatVecGrid g, int n_units, const int8_t* q, const float4* ds) {
  mmvq_body<T, NC, GLU, TAIL>(g, n_units, q, ds);
}
template <int T, int NC>  // (the head norms' tail: kHeadNormMinBlocks)
__global__ void __launch_bounds__(kMatVecWarps * 32, kHeadNormMinBlocks)
    mmvq_head_norm_kernel(MatVecGrid g, int n_units, const int8_t* q, const float4* ds) {
  mmvq_body<T, NC, false, kTailHeadNormRope>(g, n_units, q, ds);
}

// Op::kMulMatId (kernels.h MatVecIdArgs): blockIdx.x the (token, slot) pair, blockIdx.y a block
// of kMatVecWarps rows; the pair's expert read from the route.
template <int T>
__global__ void __launch_bounds__(kMatVecWarps * 32) mmvq_id_kernel(MatVecIdArgs a) {
  KITE_GRID_DEPENDENCY();
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t row = static_cast<int64_t>(blockIdx.y) * kMatVecWarps + warp;
  if (row >= a.m) return;  // (a whole warp)
  const int64_t p = blockIdx.x, t = p / a.n_used;
  const int j = static_cast<int>(p % a.n_used);
  const float id = a.route[t * a.route_ld + a.n_used + j];
  float* dst = a.dst + p * a.m + row;
  if (!(id >= 0.f && id < static_cast<float>(a.n_expert))) {
    if (lane == 0) *dst = 0.f;
    return;
  }
  const int n_units = static_cast<int>(a.k / 32);
  const int64_t col = t * a.nx + (a.nx > 1 ? j : 0);
  const auto* wr = static_cast<const uint8_t*>(a.w) + static_cast<int64_t>(id) * static_cast<int64_t>(a.expert_bytes) +
                   row * static_cast<int64_t>(a.row_bytes);
  float acc[1] = {0.f};
  mmvq_dot<T, 1>(wr, n_units, a.q + col * a.k, reinterpret_cast<const float4*>(a.ds) + col * n_units, lane, acc);
  const float v = warp_sum(acc[0]);
  if (lane == 0) *dst = v;
}

template <int T>
cudaError_t launch_mmvq_id_t(const MatVecIdArgs& a, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>(a.n_tok * a.n_used),
                  static_cast<unsigned>((a.m + kMatVecWarps - 1) / kMatVecWarps));
  KITE_KERNEL(grid, kMatVecWarps * 32, 0, s, mmvq_id_kernel<T>)(a);
  return cudaGetLastError();
}

template <int T>
cudaError_t launch_mmvq_t(const MatVecJob& job, int64_t k, const int8_t* q, const float* ds, int n, cudaStream_t s) {
  const MatVecGrid g = matvec_grid(job);
  const int n_units = static_cast<int>(k / 32);
  const auto* d4 = reinterpret_cast<const float4*>(ds);
  return matvec_dispatch(
      n, job.glu != nullptr, matvec_tail(job),
      [](auto nc, auto glu, auto tail) {
        constexpr int kNc = decltype(nc)::value;
        if constexpr (decltype(tail)::value == kTailHeadNormRope) return mmvq_head_norm_kernel<T, kNc>;
        else return mmvq_kernel<T, kNc, decltype(glu)::value, decltype(tail)::value>;
      },
      [&](auto mmvq) { KITE_KERNEL(g.blocks, kMatVecWarps * 32, 0, s, mmvq)(g, n_units, q, d4); });
}

// The launchers of a family of types, for whichever of them `type` is (each family's .cu file
// instantiates its own, so the build compiles the families in parallel).
template <int... Ts>
struct MmvqFamily {
  static cudaError_t launch(int type, const MatVecJob& job, int64_t k, const int8_t* q, const float* ds, int n,
                            cudaStream_t s) {
    cudaError_t e = cudaErrorInvalidValue;
    (void)((type == Ts && ((e = launch_mmvq_t<Ts>(job, k, q, ds, n, s)), true)) || ...);
    return e;
  }
  static cudaError_t launch_id(int type, const MatVecIdArgs& a, cudaStream_t s) {
    cudaError_t e = cudaErrorInvalidValue;
    (void)((type == Ts && ((e = launch_mmvq_id_t<Ts>(a, s)), true)) || ...);
    return e;
  }
};

}  // namespace kite::cuda

// kite/backends/cuda/warp.cuh — reductions across the 32 lanes of a warp (every lane gets the
// result). Internal to backends/cuda.
//
// Integer reductions take one redux.sync instruction on sm_80+ (__reduce_*_sync; the order of an
// integer sum or maximum cannot change it) instead of five shuffle rounds; float sums keep the
// xor-shuffle tree, whose order the kernels' bit-for-bit agreements rely on.
#pragma once

#if defined(KITE_CUDA_EMU) || (defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800)
#define KITE_WARP_REDUX 1
#endif

namespace kite::cuda {

// op over the warp by an xor-shuffle tree: each lane combines its value with lane ^ 16, ^ 8, ...
template <class T, class Op>
__device__ __forceinline__ T xor_tree(T v, Op op) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
struct WarpAdd {
  template <class T>
  __device__ T operator()(T a, T b) const { return a + b; }
};
struct WarpMin {
  template <class T>
  __device__ T operator()(T a, T b) const { return b < a ? b : a; }
};
struct WarpMax {
  template <class T>
  __device__ T operator()(T a, T b) const { return a < b ? b : a; }
};
struct WarpFMax {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

__device__ __forceinline__ float warp_sum(float v) { return xor_tree(v, WarpAdd{}); }
__device__ __forceinline__ float warp_max(float v) { return xor_tree(v, WarpFMax{}); }

#ifdef KITE_WARP_REDUX
__device__ __forceinline__ int warp_sum_i(int v) { return __reduce_add_sync(0xffffffffu, v); }
__device__ __forceinline__ int warp_min_i(int v) { return __reduce_min_sync(0xffffffffu, v); }
__device__ __forceinline__ int warp_max_i(int v) { return __reduce_max_sync(0xffffffffu, v); }
__device__ __forceinline__ unsigned warp_max_u(unsigned v) { return __reduce_max_sync(0xffffffffu, v); }
#else
__device__ __forceinline__ int warp_sum_i(int v) { return xor_tree(v, WarpAdd{}); }
__device__ __forceinline__ int warp_min_i(int v) { return xor_tree(v, WarpMin{}); }
__device__ __forceinline__ int warp_max_i(int v) { return xor_tree(v, WarpMax{}); }
__device__ __forceinline__ unsigned warp_max_u(unsigned v) { return xor_tree(v, WarpMax{}); }
#endif

// The warp's largest |v|: |v|'s bits order like its values, so an integer maximum of them. (A
// NaN among them gives NaN, where fmaxf would skip it.)
__device__ __forceinline__ float warp_max_abs(float v) {
  return __uint_as_float(warp_max_u(__float_as_uint(fabsf(v))));
}

}  // namespace kite::cuda

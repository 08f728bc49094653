// kite/backends/cuda/emu/kernel.h — the CUDA kernel language on the CPU: __global__ functions
// are ordinary functions run once per emulated thread, each thread a fiber, so that
// __syncthreads() and warp shuffles can suspend a thread until the others arrive (scheduler.cpp
// schedules them). Shared memory is the running block's (KITE_SHARED / KITE_DYNAMIC_SHARED in
// launch.cuh), filled with 0xff bytes when each block starts. Only what kite's kernels use is
// provided.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <source_location>
#include <tuple>
#include <type_traits>
#include <utility>

#include "backends/cuda/emu/runtime.h"
#include "src/base/half.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
// A plain `__shared__` declaration would be a function static shared by every block; kernels
// declare shared memory with KITE_SHARED (launch.cuh), which the emulator gives each block fresh.
#define __shared__ declare_shared_memory_with_KITE_SHARED_from_launch_cuh

// ---- vector types -------------------------------------------------------------------------
struct uint3 {
  unsigned x, y, z;
};
struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
};
struct alignas(8) float2 {
  float x, y;
};
struct alignas(16) float4 {
  float x, y, z, w;
};
struct alignas(16) int4 {
  int x, y, z, w;
};
struct alignas(8) int2 {
  int x, y;
};

inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline float2 make_float2(float x, float y) { return {x, y}; }
inline int4 make_int4(int x, int y, int z, int w) { return {x, y, z, w}; }

// The device overloads of min and max (mixed integer types take the common type, as in CUDA).
template <class A, class B>
inline std::common_type_t<A, B> min(A a, B b) {
  return b < a ? b : a;
}
template <class A, class B>
inline std::common_type_t<A, B> max(A a, B b) {
  return a < b ? b : a;
}

// ---- half precision -----------------------------------------------------------------------
struct __half {
  uint16_t bits;
};
struct alignas(4) __half2 {
  __half x, y;
};
inline float __half2float(__half h) { return kite::fp16_to_fp32(h.bits); }
inline __half __float2half_rn(float f) { return __half{kite::fp32_to_fp16(f)}; }
inline __half __float2half(float f) { return __float2half_rn(f); }
inline __half __ushort_as_half(unsigned short v) { return __half{v}; }
inline unsigned short __half_as_ushort(__half h) { return h.bits; }
inline float2 __half22float2(__half2 h) { return {__half2float(h.x), __half2float(h.y)}; }
inline __half2 __floats2half2_rn(float a, float b) { return {__float2half_rn(a), __float2half_rn(b)}; }

// ---- arithmetic intrinsics ----------------------------------------------------------------
// (The emulated kernels are compiled with -ffp-contract=off: a*b+c rounds twice, as __fmul_rn
// and __fadd_rn promise; fmaf is the one fused operation.)
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float rsqrtf(float x) { return 1.f / std::sqrt(x); }
inline float __frcp_rn(float x) { return 1.f / x; }
inline unsigned __float_as_uint(float f) { return std::bit_cast<unsigned>(f); }
inline float __uint_as_float(unsigned u) { return std::bit_cast<float>(u); }
inline int __float_as_int(float f) { return std::bit_cast<int>(f); }
inline float __int_as_float(int i) { return std::bit_cast<float>(i); }
inline int __float2int_rn(float f) { return static_cast<int>(std::nearbyint(f)); }
template <class T>
inline T __ldg(const T* p) { return *p; }
template <class T>
inline T __ldcg(const T* p) { return *p; }
inline void __threadfence() {}  // (one thread runs at a time)

namespace kite::cuda::emu {
inline int8_t byte_s(int v, int i) { return static_cast<int8_t>(static_cast<uint32_t>(v) >> (8 * i)); }
inline uint8_t byte_u(unsigned v, int i) { return static_cast<uint8_t>(v >> (8 * i)); }
}  // namespace kite::cuda::emu

// Four signed byte products summed into c.
inline int __dp4a(int a, int b, int c) {
  using kite::cuda::emu::byte_s;
  for (int i = 0; i < 4; ++i) c += static_cast<int>(byte_s(a, i)) * static_cast<int>(byte_s(b, i));
  return c;
}
inline unsigned __dp4a(unsigned a, unsigned b, unsigned c) {
  using kite::cuda::emu::byte_u;
  for (int i = 0; i < 4; ++i) c += static_cast<unsigned>(byte_u(a, i)) * static_cast<unsigned>(byte_u(b, i));
  return c;
}
// Per-byte a - b, each byte wrapping.
inline unsigned __vsub4(unsigned a, unsigned b) {
  using kite::cuda::emu::byte_u;
  unsigned r = 0;
  for (int i = 0; i < 4; ++i) r |= static_cast<unsigned>(static_cast<uint8_t>(byte_u(a, i) - byte_u(b, i))) << (8 * i);
  return r;
}
inline int __vsub4(int a, int b) {
  return static_cast<int>(__vsub4(static_cast<unsigned>(a), static_cast<unsigned>(b)));
}
// Per byte 0xff where a's byte differs from b's, else 0.
inline unsigned __vcmpne4(unsigned a, unsigned b) {
  using kite::cuda::emu::byte_u;
  unsigned r = 0;
  for (int i = 0; i < 4; ++i) r |= (byte_u(a, i) != byte_u(b, i) ? 0xffu : 0u) << (8 * i);
  return r;
}
inline int __popc(unsigned x) { return std::popcount(x); }
// The low word of {hi:lo} shifted right by shift & 31.
inline unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned shift) {
  return static_cast<unsigned>(((static_cast<uint64_t>(hi) << 32) | lo) >> (shift & 31));
}
// PTX prmt: result byte i is byte (s >> 4i) & 7 of the 8 bytes {y:x}.
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
  const uint64_t v = (static_cast<uint64_t>(y) << 32) | x;
  unsigned r = 0;
  for (int i = 0; i < 4; ++i) r |= static_cast<unsigned>((v >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
  return r;
}
inline unsigned __byte_perm(int x, int y, int s) {
  return __byte_perm(static_cast<unsigned>(x), static_cast<unsigned>(y), static_cast<unsigned>(s));
}
template <class T>
inline T atomicAdd(T* p, T v) {  // one thread runs at a time
  const T old = *p;
  *p = old + v;
  return old;
}
template <class T>
inline T atomicMax(T* p, T v) {
  const T old = *p;
  *p = v > old ? v : old;
  return old;
}
template <class T>
inline T atomicMin(T* p, T v) {
  const T old = *p;
  *p = v < old ? v : old;
  return old;
}

// ---- threads, barriers and warps (scheduler.cpp) --------------------------------------------
namespace kite::cuda::emu {

struct ThreadIds {
  uint3 thread_idx, block_idx;
  dim3 block_dim, grid_dim;
};
// The running emulated thread (set by the scheduler before it resumes one; inline reads, since
// kernels read threadIdx and friends all the time).
struct ThreadState {
  ThreadIds ids;
  int lane = 0, warp = 0;
  bool waited = false;          // passed KITE_GRID_DEPENDENCY() (launch.cuh)
  const char* fault = nullptr;  // what it did that a GPU would not allow (checked as its block ends)
};
extern thread_local constinit ThreadState* t_thread;
inline const ThreadIds& ids() { return t_thread->ids; }
inline int lane_id() { return t_thread->lane; }
// Where a thread waits (a barrier, a warp operation): every thread of the block (lane of the
// warp) must wait at the same one, with the same mask, as a GPU requires.
using Site = std::source_location;
void sync_threads(Site site);
void sync_warp(unsigned mask, Site site);
// A warp exchange: every lane in `mask` offers `v` and gets the value lane `src` offered (its
// own when `src` is out of range); all of the mask's lanes must take part, as on a GPU.
uint64_t exchange(unsigned mask, uint64_t v, int src, Site site);

template <class T>
T shuffle(unsigned mask, T v, int src, Site site = Site::current()) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>);
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  bits = exchange(mask, bits, src, site);
  T r;
  std::memcpy(&r, &bits, sizeof(T));
  return r;
}
// The segment of `width` lanes that `lane` is in, as shuffles see it.
inline int segment_base(int lane, int width) { return lane & ~(width - 1); }

// KITE_GRID_DEPENDENCY() (launch.cuh): on a GPU, the wait for the previous kernel on the stream.
inline void grid_dependency() { t_thread->waited = true; }
// KITE_PREFETCH_L2(p): a hint on a GPU (of weights only, which no kernel writes, so it may come
// before the wait); here p must point into device memory.
template <class T>
void prefetch_l2(const T* p) {
  if (!is_device_range(p, 1)) t_thread->fault = "KITE_PREFETCH_L2 of an address outside device memory";
}

void* dynamic_shared();
// The running block's storage for the KITE_SHARED variable that `tag` identifies (one per
// declaration and template instance): the same for every thread of the block, 0xff bytes when
// the block starts.
void* static_shared(const void* tag, size_t bytes, size_t align);

// Runs `body` once per thread of the grid (at the stream's next synchronization point).
cudaError_t launch(dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t s, const char* name,
                   std::function<void()> body);

inline dim3 to_dim3(dim3 d) { return d; }
template <class I, std::enable_if_t<std::is_integral_v<I>, int> = 0>
dim3 to_dim3(I v) {
  return dim3(static_cast<unsigned>(v));
}

// A pointer argument must point into device memory (or be null): on a GPU a host address would
// fault inside the kernel.
template <class T>
bool device_arg_ok(const T& v) {
  if constexpr (std::is_pointer_v<T>) return v == nullptr || is_device_range(v, 1);
  else return true;
}

// kernel<<<grid, block, shared, stream>>>(args...): the arguments are converted to the kernel's
// parameter types and copied now, as a launch does.
template <class... P>
struct Launcher {
  void (*fn)(P...);
  dim3 grid, block;
  size_t shared;
  cudaStream_t stream;
  const char* name;
  template <class... A>
  void operator()(A&&... a) const {
    static_assert(sizeof...(A) == sizeof...(P), "kernel launched with the wrong number of arguments");
    auto f = fn;
    std::tuple<std::decay_t<P>...> args(static_cast<P>(std::forward<A>(a))...);
    if (!std::apply([](const auto&... v) { return (device_arg_ok(v) && ...); }, args)) {
      kernel_failed(name, "a pointer argument is not device memory (a host address would fault on a GPU)");
      return;
    }
    launch(grid, block, shared, stream, name, [f, args] { std::apply(f, args); });
  }
};
template <class G, class B, class... P>
Launcher<P...> kernel(G grid, B block, size_t shared, cudaStream_t s, const char* name, void (*fn)(P...)) {
  return Launcher<P...>{fn, to_dim3(grid), to_dim3(block), shared, s, name};
}

}  // namespace kite::cuda::emu

#define threadIdx (::kite::cuda::emu::ids().thread_idx)
#define blockIdx (::kite::cuda::emu::ids().block_idx)
#define blockDim (::kite::cuda::emu::ids().block_dim)
#define gridDim (::kite::cuda::emu::ids().grid_dim)
inline constexpr int warpSize = 32;

inline void __syncthreads(kite::cuda::emu::Site site = kite::cuda::emu::Site::current()) {
  kite::cuda::emu::sync_threads(site);
}
inline void __syncwarp(unsigned mask = 0xffffffffu, kite::cuda::emu::Site site = kite::cuda::emu::Site::current()) {
  kite::cuda::emu::sync_warp(mask, site);
}
template <class T>
T __shfl_sync(unsigned mask, T v, int src, int width = 32,
              kite::cuda::emu::Site site = kite::cuda::emu::Site::current()) {
  const int lane = kite::cuda::emu::lane_id();
  return kite::cuda::emu::shuffle(mask, v, kite::cuda::emu::segment_base(lane, width) + (src & (width - 1)), site);
}
template <class T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32,
                  kite::cuda::emu::Site site = kite::cuda::emu::Site::current()) {
  const int lane = kite::cuda::emu::lane_id();
  const int src = lane ^ lane_mask;
  const bool in = (src & ~(width - 1)) == kite::cuda::emu::segment_base(lane, width);
  return kite::cuda::emu::shuffle(mask, v, in ? src : lane, site);
}
// redux.sync: every lane of the (whole-warp) mask gets the reduction of all lanes' values;
// emulated as an xor-shuffle tree (integers: the order cannot change the result).
template <class T, class Op>
T warp_reduce_(unsigned mask, T v, Op op, kite::cuda::emu::Site site) {
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(mask, v, o, 32, site));
  return v;
}
#define KITE_EMU_REDUX_(name, expr)                                                                      \
  inline int name(unsigned mask, int v, kite::cuda::emu::Site site = kite::cuda::emu::Site::current()) { \
    return warp_reduce_(mask, v, [](int a, int b) { return expr; }, site);                               \
  }                                                                                                      \
  inline unsigned name(unsigned mask, unsigned v,                                                        \
                       kite::cuda::emu::Site site = kite::cuda::emu::Site::current()) {                  \
    return warp_reduce_(mask, v, [](unsigned a, unsigned b) { return expr; }, site);                     \
  }
// (the sum wraps, as the instruction's does)
KITE_EMU_REDUX_(__reduce_add_sync, static_cast<decltype(a)>(static_cast<unsigned>(a) + static_cast<unsigned>(b)))
KITE_EMU_REDUX_(__reduce_min_sync, a < b ? a : b)
KITE_EMU_REDUX_(__reduce_max_sync, a < b ? b : a)
#undef KITE_EMU_REDUX_
template <class T>
T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32,
                   kite::cuda::emu::Site site = kite::cuda::emu::Site::current()) {
  const int lane = kite::cuda::emu::lane_id();
  const int src = lane + static_cast<int>(delta);
  const bool in = src < kite::cuda::emu::segment_base(lane, width) + width;
  return kite::cuda::emu::shuffle(mask, v, in ? src : lane, site);
}

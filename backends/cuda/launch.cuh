// kite/backends/cuda/launch.cuh — how a kernel is launched and how shared memory is declared,
// spelled so the same kernel source compiles with nvcc and with the CPU emulator
// (backends/cuda/emu, KITE_CUDA_EMU, which runs the CUDA backend in CI without a GPU).
// Internal to backends/cuda.
//
// Programmatic dependent launch (sm_90+): every kernel is launched allowed to start while the
// kernel before it on the stream finishes, so a decode step's hundreds of short kernels do not
// each wait out a launch and a ramp-up. The price is a rule every kernel keeps:
// KITE_GRID_DEPENDENCY() is its first statement, before it reads or writes any global memory
// (it waits until the previous kernel has finished and its writes are visible, then lets the
// next kernel launch). Only KITE_PREFETCH_L2 of weights, which no kernel writes, may come
// before it. The emulator fails a kernel whose thread returns without it, or reaches a barrier
// or warp operation before it. KITE_CUDA_PDL=0 launches plainly (kernels.h programmatic_launch).
#pragma once

#include "backends/cuda/kernels.h"

#ifdef KITE_CUDA_EMU
#include "backends/cuda/emu/kernel.h"
// KITE_KERNEL(grid, block, shared_bytes, stream, kernel)(args...): kernel<<<grid, block, ...>>>(args...).
#define KITE_KERNEL(grid, block, shared_bytes, stream, ...) \
  ::kite::cuda::emu::kernel(grid, block, shared_bytes, stream, #__VA_ARGS__, __VA_ARGS__)
// KITE_DYNAMIC_SHARED(float, sm): extern __shared__ float sm[];
#define KITE_DYNAMIC_SHARED(type, name) type* name = static_cast<type*>(::kite::cuda::emu::dynamic_shared())
// KITE_SHARED(part, float[32]): __shared__ float part[32]; storage of the running block (a
// function static would be one for all blocks), filled with 0xff bytes when each block starts.
#define KITE_SHARED(name, ...)                                                                 \
  static char KITE_EMU_TAG_(name); /* its address names the declaration (and instance) */      \
  auto& name = *static_cast<std::add_pointer_t<__VA_ARGS__>>(                                 \
      ::kite::cuda::emu::static_shared(&KITE_EMU_TAG_(name), sizeof(__VA_ARGS__), alignof(__VA_ARGS__)))
#define KITE_EMU_TAG_(name) kite_shared_tag_##name
// KITE_ASSUME_GLOBAL(p): p points into global memory (nvcc then emits global loads and stores
// through it, not generic ones: it cannot tell by itself for a pointer read from a struct).
#define KITE_ASSUME_GLOBAL(p) ((void)(p))
#define KITE_GRID_DEPENDENCY() ::kite::cuda::emu::grid_dependency()
#define KITE_PREFETCH_L2(p) ::kite::cuda::emu::prefetch_l2(p)
#else
#include <cuda_runtime.h>

#include <utility>

#define KITE_KERNEL(grid, block, shared_bytes, stream, ...) \
  ::kite::cuda::launch_kernel(grid, block, shared_bytes, stream, __VA_ARGS__)
#define KITE_ASSUME_GLOBAL(p) __builtin_assume(__isGlobal(p))
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define KITE_GRID_DEPENDENCY() asm volatile("griddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;" ::: "memory")
#define KITE_PREFETCH_L2(p) asm volatile("prefetch.global.L2 [%0];" ::"l"(p))
#else
#define KITE_GRID_DEPENDENCY() ((void)0)
#define KITE_PREFETCH_L2(p) ((void)(p))
#endif
#define KITE_DYNAMIC_SHARED(type, name) extern __shared__ type name[]
#define KITE_SHARED(name, ...) __shared__ ::kite::cuda::SharedType<__VA_ARGS__> name
namespace kite::cuda {
template <class T>
using SharedType = T;  // lets an array type be spelled as one argument: SharedType<float[32]> part;

// kernel<<<grid, block, shared, stream>>>(args...), with programmatic dependent launch where
// programmatic_launch() allows it.
template <class... P>
struct KernelLaunch {
  void (*fn)(P...);
  dim3 grid, block;
  size_t shared;
  cudaStream_t stream;
  template <class... A>
  cudaError_t operator()(A&&... a) const {
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = shared;
    cfg.stream = stream;
    cfg.attrs = &attr;
    cfg.numAttrs = programmatic_launch() ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, fn, std::forward<A>(a)...);
  }
};
template <class G, class B, class... P>
KernelLaunch<P...> launch_kernel(G grid, B block, size_t shared, cudaStream_t s, void (*fn)(P...)) {
  return KernelLaunch<P...>{fn, dim3(grid), dim3(block), shared, s};
}
}  // namespace kite::cuda
#endif

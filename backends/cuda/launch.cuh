// kite/backends/cuda/launch.cuh — how a kernel is launched and how shared memory is declared,
// spelled so the same kernel source compiles with nvcc and with the CPU emulator
// (backends/cuda/emu, KITE_CUDA_EMU, which runs the CUDA backend in CI without a GPU).
// Internal to backends/cuda.
#pragma once

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
#else
#define KITE_KERNEL(grid, block, shared_bytes, stream, ...) __VA_ARGS__<<<grid, block, shared_bytes, stream>>>
#define KITE_ASSUME_GLOBAL(p) __builtin_assume(__isGlobal(p))
#define KITE_DYNAMIC_SHARED(type, name) extern __shared__ type name[]
#define KITE_SHARED(name, ...) __shared__ ::kite::cuda::SharedType<__VA_ARGS__> name
namespace kite::cuda {
template <class T>
using SharedType = T;  // lets an array type be spelled as one argument: SharedType<float[32]> part;
}  // namespace kite::cuda
#endif

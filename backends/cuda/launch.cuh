// kite/backends/cuda/launch.cuh — how a kernel is launched and how dynamic shared memory is
// declared, spelled so the same kernel source compiles with nvcc and with the CPU emulator
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
#else
#define KITE_KERNEL(grid, block, shared_bytes, stream, ...) __VA_ARGS__<<<grid, block, shared_bytes, stream>>>
#define KITE_DYNAMIC_SHARED(type, name) extern __shared__ type name[]
#endif

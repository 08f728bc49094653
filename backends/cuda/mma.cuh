// kite/backends/cuda/mma.cuh — the int8 tensor-core instruction mma.sync (PTX) for kernels that
// must know which lane holds which element of a tile (WMMA's fragment layout is opaque, so a
// kernel using it cannot scale a product tile per row and column in registers). sm_80 or newer;
// the CPU CUDA emulator runs an equivalent (emu/ptx_mma.h). Internal to backends/cuda.
//
// The layouts, from the PTX ISA's "Matrix fragments for mma.m16n8k32" / "mma.m16n8k16" (8-bit
// integer inputs, 32-bit integer accumulators). Lane l = 4 * g + t (g = l / 4, t = l % 4); a
// register holds four consecutive k elements, the lowest k in the lowest byte:
//   A (16 x K, row major):    a[0] = A[g][4t..4t+3]       a[1] = A[g+8][4t..4t+3]
//                             a[2] = A[g][16+4t..]        a[3] = A[g+8][16+4t..]    (K = 32 only)
//   B (K x 8, column major):  b[0] = B[4t..4t+3][g]       b[1] = B[16+4t..][g]      (K = 32 only)
//   D (16 x 8):               d[0] = D[g][2t]  d[1] = D[g][2t+1]  d[2] = D[g+8][2t]  d[3] = D[g+8][2t+1]
// Every call is warp-collective: all 32 lanes execute it.
#pragma once

#ifdef KITE_CUDA_EMU
#include "backends/cuda/emu/ptx_mma.h"
#endif

namespace kite::cuda {

// d += A * B, A 16 x 32, B 32 x 8 (mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32).
__device__ __forceinline__ void mma_s8_k32(int (&d)[4], const int (&a)[4], const int (&b)[2]) {
#if defined(KITE_CUDA_EMU)
  emu::mma_s8<32>(d, a, b);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
  __trap();
#endif
}

// d += A * B, A 16 x 16 (a0, a1 as a[0], a[1] above), B 16 x 8 (b0 as b[0])
// (mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32).
__device__ __forceinline__ void mma_s8_k16(int (&d)[4], int a0, int a1, int b0) {
#if defined(KITE_CUDA_EMU)
  const int a[2] = {a0, a1}, b[1] = {b0};
  emu::mma_s8<16>(d, a, b);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a0), "r"(a1), "r"(b0));
#else
  __trap();
#endif
}

}  // namespace kite::cuda

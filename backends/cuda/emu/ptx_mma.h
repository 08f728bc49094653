// The CUDA emulator's equivalent of the PTX instruction mma.sync for 8-bit integer inputs
// (m16n8k32 and m16n8k16, int32 accumulators), which backends/cuda/mma.cuh issues as inline
// assembly on a GPU. The lane layout of the fragments is mma.cuh's (the PTX ISA's); here every
// lane offers its registers to the warp and receives its own part of the product, so a kernel
// that puts an element in the wrong register gets the wrong answer, as on a GPU.
#pragma once

#include <cstdint>

#include "backends/cuda/emu/kernel.h"

namespace kite::cuda::emu {

// d += A * B for a 16 x K (K = 16 or 32) by K x 8 tile: a holds K / 8 registers, b K / 16.
// Warp-collective (a full-warp exchange: the kernel fails unless all 32 lanes take part). Each
// lane computes its own part from the registers the warp offered, then waits for the others
// before its registers can be overwritten (lanes resume in any order: KITE_CUDA_EMU_SCHEDULE);
// one block runs at a time, so function statics indexed by warp are the running block's.
template <int K>
inline void mma_s8(int (&d)[4], const int* a, const int* b) {
  static_assert(K == 16 || K == 32, "mma.sync s8 (emulated): m16n8k16 or m16n8k32");
  struct Regs {
    int a[4], b[2];
  };
  static Regs in[32][32];  // [warp][lane]
  const auto& id = ids();
  const unsigned warp = (id.thread_idx.x + id.block_dim.x * (id.thread_idx.y + id.block_dim.y * id.thread_idx.z)) / 32;
  const int lane = lane_id();
  for (int i = 0; i < K / 8; ++i) in[warp][lane].a[i] = a[i];
  for (int i = 0; i < K / 16; ++i) in[warp][lane].b[i] = b[i];
  (void)shuffle(0xffffffffu, 0u, 0);  // every lane has offered its registers
  const Regs* r = in[warp];
  // A[row][k] and B[k][col] where mma.cuh's layout keeps them.
  auto a_at = [&](int row, int k) {
    const int reg = (row >= 8 ? 1 : 0) + 2 * (k / 16), src = 4 * (row % 8) + (k % 16) / 4;
    return static_cast<int>(static_cast<int8_t>(static_cast<uint32_t>(r[src].a[reg]) >> (8 * (k % 4))));
  };
  auto b_at = [&](int k, int col) {
    const int reg = k / 16, src = 4 * col + (k % 16) / 4;
    return static_cast<int>(static_cast<int8_t>(static_cast<uint32_t>(r[src].b[reg]) >> (8 * (k % 4))));
  };
  int out[4];
  for (int i = 0; i < 4; ++i) {
    const int row = lane / 4 + (i >= 2 ? 8 : 0), col = 2 * (lane % 4) + (i & 1);
    int s = 0;
    for (int k = 0; k < K; ++k) s += a_at(row, k) * b_at(k, col);
    out[i] = s;
  }
  (void)shuffle(0xffffffffu, 0u, 0);  // every lane has read the registers it needs
  for (int i = 0; i < 4; ++i)
    d[i] = static_cast<int>(static_cast<uint32_t>(d[i]) + static_cast<uint32_t>(out[i]));  // wraps
}

}  // namespace kite::cuda::emu

// kite/backends/cuda/attention.cuh — what the two attention kernels share: how a token's keys are
// split into chunks (the same split for both, so the merge kernel serves both), reading K/V cache
// elements, and the tensor-core kernel's launcher. Internal to backends/cuda.
#pragma once

#include <cuda_fp16.h>

#include "backends/cuda/kernels.h"
#include "backends/cuda/quant.cuh"

namespace kite::cuda {

inline constexpr int kAttnChunk = 512;     // keys per chunk (the unit of the split)
inline constexpr int kAttnMaxChunks = 32;  // chunks per token at most

// A scaled score, soft-capped when softcap > 0 (AttentionArgs::softcap).
__device__ __forceinline__ float cap_score(float s, float softcap) {
  return softcap > 0.f ? softcap * tanhf(s / softcap) : s;
}

// Element d of a K/V head slice of type `type` (F32, F16, BF16 or Q8_0).
__device__ __forceinline__ float kv_elem(int type, const uint8_t* row, int d) {
  if (type == kQ8_0) {
    const uint8_t* b = row + (d / 32) * sizeof(quant::BlockQ8_0);
    return static_cast<float>(static_cast<int8_t>(b[2 + d % 32])) * ld_half(b);
  }
  return load_float(type, row, d);
}

__host__ __device__ inline size_t kv_head_bytes(int type, int hd) {
  if (type == kQ8_0) return static_cast<size_t>(hd / 32) * sizeof(quant::BlockQ8_0);
  return static_cast<size_t>(hd) * (type == kF32 ? 4 : 2);
}

// Keys [lo, nk) of the token (lo > 0: the start of its sliding window), its chunk length and
// chunk count (a function of its own keys only). Chunk c covers keys [lo + c * chunk,
// min(nk, lo + (c + 1) * chunk)), the last one up to nk.
struct TokenSplit {
  int lo, nk, chunk, n_chunks;
};

__device__ __forceinline__ TokenSplit token_split(const AttentionArgs& a, int t) {
  TokenSplit s;
  s.nk = a.pos[t] + 1;
  const int cap = a.max_blocks * a.block_size;
  if (s.nk > cap) s.nk = cap;  // positions beyond the table: never read past it
  if (s.nk < 1) s.nk = 1;
  s.lo = a.window > 0 && s.nk > a.window ? s.nk - a.window : 0;
  const int raw = (s.nk - s.lo + kAttnChunk - 1) / kAttnChunk;
  const int mult = (raw + kAttnMaxChunks - 1) / kAttnMaxChunks;
  s.chunk = kAttnChunk * mult;
  s.n_chunks = (s.nk - s.lo + s.chunk - 1) / s.chunk;
  if (s.n_chunks > a.max_chunks) s.n_chunks = a.max_chunks;  // grid bound (max_ctx from the table)
  return s;
}

// The first and one-past-last key of chunk c of a token split as `s` (empty if c is past it).
__device__ __forceinline__ void chunk_keys(const TokenSplit& s, int c, int& j0, int& j1) {
  if (c >= s.n_chunks) {
    j0 = j1 = 0;
    return;
  }
  j0 = s.lo + c * s.chunk;
  j1 = c == s.n_chunks - 1 ? s.nk : min(s.nk, j0 + s.chunk);
}

// Whether row t takes the tensor-core kernel: its sequence has at least a.tc_min_run consecutive
// rows around it (the same answer for every row of the run).
__device__ __forceinline__ bool tc_row(const AttentionArgs& a, int t) {
  if (a.tc_min_run <= 0) return false;
  const int s = a.seq[t];
  int n = 1;
  for (int i = t - 1; i >= 0 && n < a.tc_min_run && a.seq[i] == s; --i) ++n;
  for (int i = t + 1; i < a.n_tok && n < a.tc_min_run && a.seq[i] == s; ++i) ++n;
  return n >= a.tc_min_run;
}

// The tensor-core kernel's pass (k_attention_tc.cu): outputs or partial records as the CUDA-core
// kernel writes them; launch_attention runs the merge after either.
cudaError_t launch_attention_tc_pass(const AttentionArgs& a, cudaStream_t s);

}  // namespace kite::cuda

// kite/backends/cpu/ops.h — CPU kernels, one function per op, run on every thread of the team.
//
// Each kernel computes its share (ith of nth) of `dst` from dst->src; work is split so threads
// never write the same bytes. These are the scalar references; SIMD variants plug in per op and
// weight type and are tested against them.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <vector>

#include "src/core/tensor.h"

namespace kite::cpu {

// A reusable spinning barrier for the nth threads of one job.
class Barrier {
 public:
  explicit Barrier(int n = 1) : n_(n) {}
  void reset(int n) { n_ = n; }
  void wait();

 private:
  int n_;
  std::atomic<int> count_{0};
  std::atomic<int> generation_{0};
};

// How a mul_mat of one activation row (a decode step) reads quantized weights: row by row (the
// one-row kernels, a software prefetch running ahead of each row), four rows a call where the
// level has such a kernel for the type (gemv4: the same bits as one at a time), or many rows at a
// time in place (wgemm's 16, else gemm8's 8: as many streams from DRAM at once; other bits). The
// CPU backend picks per weight type by measurement (one_row.h); a node without a way takes kRows.
enum class OneRowWay : uint8_t { kRows, kTiles, kRows4 };
inline constexpr unsigned one_row_bit(OneRowWay w) { return 1u << static_cast<unsigned>(w); }

struct KernelCtx {
  int ith = 0;
  int nth = 1;
  std::vector<float>* scratch = nullptr;  // this thread's scratch; grows, never shrinks
  // Shared by all threads of the op: bytes sized by the backend to op_shared_bytes() before
  // the op runs, a barrier, and a work counter reset to 0 before the op runs.
  std::vector<uint8_t>* shared = nullptr;
  Barrier* barrier = nullptr;
  std::atomic<int64_t>* counter = nullptr;
  OneRowWay one_row = OneRowWay::kRows;
  // Where in `shared` this op's bytes start (a mul_mat run inside a mul_mat_id: past the
  // outer op's own).
  size_t shared_offset = 0;
};

// Bytes of shared scratch an op needs (0 for most ops), run with `one_row`.
size_t op_shared_bytes(const Tensor* dst, OneRowWay one_row = OneRowWay::kRows);
// The ways (one_row_bit) beyond kRows in which the active SIMD level can run `dst`, a mul_mat of
// one activation row with quantized weights; 0 for every other node.
unsigned one_row_choices(const Tensor* dst);

// [begin, end) of `n` items for thread ith of nth.
inline void split(int64_t n, const KernelCtx& c, int64_t* begin, int64_t* end) {
  const int64_t per = (n + c.nth - 1) / c.nth;
  *begin = std::min<int64_t>(n, per * c.ith);
  *end = std::min<int64_t>(n, *begin + per);
}

void op_get_rows(Tensor* dst, const KernelCtx& c);
void op_mul_mat(Tensor* dst, const KernelCtx& c);
// The scalar reference mul_mat (dequantize each weight row, f32 dot); op_mul_mat uses it when
// the active SIMD level is kScalar or has no kernel for the weight type.
void op_mul_mat_reference(Tensor* dst, const KernelCtx& c);
void op_add(Tensor* dst, const KernelCtx& c);
void op_mul(Tensor* dst, const KernelCtx& c);
void op_scale(Tensor* dst, const KernelCtx& c);
void op_swiglu(Tensor* dst, const KernelCtx& c);
void op_geglu(Tensor* dst, const KernelCtx& c);
void op_copy(Tensor* dst, const KernelCtx& c);
void op_rms_norm(Tensor* dst, const KernelCtx& c);
void op_rope(Tensor* dst, const KernelCtx& c);
void op_kv_write(Tensor* dst, const KernelCtx& c);
void op_attention(Tensor* dst, const KernelCtx& c);
void op_top_k(Tensor* dst, const KernelCtx& c);
void op_mul_mat_id(Tensor* dst, const KernelCtx& c);
void op_moe_sum(Tensor* dst, const KernelCtx& c);
// Shared scratch of a mul_mat_id (op_shared_bytes asks it).
size_t mul_mat_id_shared_bytes(const Tensor* dst);

// Row conversion helpers shared by kernels: any type -> F32, F32 -> F16/F32 storage.
void row_to_f32(DType type, const void* src, float* dst, int64_t n);
void row_from_f32(DType type, const float* src, void* dst, int64_t n);

}  // namespace kite::cpu

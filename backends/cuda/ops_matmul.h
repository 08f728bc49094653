// kite/backends/cuda/ops_matmul.h — mul_mat's matrix path (more than kMaxMmvCols activation
// columns: prefill, batched decode past the mat-vec kernels), between ops.cpp, which launches
// every op and the mat-vec matmuls, and ops_matmul.cpp, which runs the wider ones on the int8
// tensor-core kernel or on cuBLAS and times which is faster per shape. Internal to the CUDA
// backend.
#pragma once

#include <cstddef>

#include "backends/cuda/device.h"
#include "src/core/tensor.h"

namespace kite::cuda {

#define KITE_LAUNCH(call) KITE_CUDA_CHECK(call)  // a kernel launch's returned cudaError_t

inline int tid(DType t) { return static_cast<int>(t); }  // the kernels' type id
inline bool is_float(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }

// Where a matmul's activations are read from: x as columns ldx floats apart (made contiguous in
// scratch when x's rows are not equally spaced).
struct Activations {
  const float* x = nullptr;
  size_t ldx = 0;
};

// x's int8 activations: quantized now, unless the scratch already holds them (the matmul before
// this one had the same input, or a fused rms_norm, attention or gate/up launch made them).
// (ops.cpp)
Result<Int8Activations> int8_activations(Device& dev, OpScratch& sc, const Tensor* x, const Activations& a);

// Whether quantized matmul n (more than kMaxMmvCols columns) takes launch_mmq now: forced by
// KITE_CUDA_MMQ, as its shape timed, or (not yet timed) the default rule. (ops_matmul.cpp)
bool use_mmq(const Device& dev, const Tensor* n);
// Matmul n of more than kMaxMmvCols columns, without its bias: float weights on cuBLAS, quantized
// ones as use_mmq says, timing both ways first where the shape is new (ops_matmul.cpp).
Status mul_mat_matrix(Device& dev, OpScratch& sc, Tensor* n, const Activations& act);

}  // namespace kite::cuda

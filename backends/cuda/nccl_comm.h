// kite/backends/cuda/nccl_comm.h — tensor parallelism on CUDA: a group of the process's GPUs
// 0..world-1 summing over NCCL (src/core/comm.h). NCCL is opened with dlopen when a group is
// made, as cuBLAS is (cublas_api.h): a CUDA build still starts where NCCL is not installed, and
// asking for tensor parallelism there is an error naming the library. Internal to backends/cuda.
#pragma once

#include <memory>

#include "src/core/comm.h"

namespace kite::cuda {

// The factory registered for "cuda" (backends/registry.cpp, builds with KITE_NCCL).
Result<std::unique_ptr<Communicator>> make_nccl_communicator(int world);

}  // namespace kite::cuda

// kite/backends/cuda/cublas_api.h — cuBLAS, opened with dlopen on first use.
//
// cuBLAS is hundreds of megabytes: linked like an ordinary library it would be loaded (and its
// relocations processed) by every `kite` run, CPU-only ones included, and a CUDA build would not
// start at all on a machine without it. So only its headers are used at build time; the few
// entry points kite calls are resolved the first time a GPU matmul needs them. Internal to
// backends/cuda.
#pragma once

#include <cublas_v2.h>

#include "src/base/status.h"

namespace kite::cuda {

struct CublasApi {
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasDestroy_v2) destroy = nullptr;
  decltype(&cublasSetStream_v2) set_stream = nullptr;
  decltype(&cublasSgemm_v2) sgemm = nullptr;
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int m, int n, int k,
                            const void* alpha, const void* a, cudaDataType a_type, int lda, const void* b,
                            cudaDataType b_type, int ldb, const void* beta, void* c, cudaDataType c_type, int ldc,
                            cublasComputeType_t compute, cublasGemmAlgo_t algo) = nullptr;  // (overloaded)
  const char* (*status_name)(cublasStatus_t) = nullptr;  // (overloaded: no decltype)
  const char* (*status_string)(cublasStatus_t) = nullptr;
};

// The loaded API (thread-safe, loaded once); the error names every library file tried and
// the dynamic loader's reason.
Result<const CublasApi*> cublas_api();

}  // namespace kite::cuda

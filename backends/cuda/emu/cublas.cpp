// cuBLAS on the CPU for the emulator (cublas.h): the GEMMs kite calls, with cuBLAS's argument
// checks, plus cublas_api() (cuda/cublas_api.h), which the GPU build gets from dlopen.
#include "backends/cuda/emu/cublas.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "backends/cuda/cublas_api.h"
#include "backends/cuda/cuda_backend.h"
#include "src/base/half.h"

struct cublasContext {
  cudaStream_t stream = nullptr;
};

namespace {

size_t elem_bytes(cudaDataType t) { return t == CUDA_R_32F ? 4 : 2; }

float load(cudaDataType t, const void* p, size_t i) {
  switch (t) {
    case CUDA_R_32F: return static_cast<const float*>(p)[i];
    case CUDA_R_16F: return kite::fp16_to_fp32(static_cast<const uint16_t*>(p)[i]);
    case CUDA_R_16BF: return kite::bf16_to_fp32(static_cast<const uint16_t*>(p)[i]);
  }
  return 0.f;
}

float dot(const float* a, const float* b, int k) {
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int p = 0; p < k; ++p) s += a[p] * b[p];
  return s;
}

// A column-major operand `rows` x `cols` as stored (before its op) with leading dimension ld
// must lie in device memory.
bool operand_ok(const char* what, const void* p, cudaDataType t, int rows, int cols, int ld) {
  if (rows == 0 || cols == 0) return true;
  const size_t bytes = (static_cast<size_t>(cols - 1) * static_cast<size_t>(ld) + static_cast<size_t>(rows)) * elem_bytes(t);
  if (kite::cuda::emu::is_device_range(p, bytes)) return true;
  std::fprintf(stderr, "cuda-emu: cuBLAS operand %s (%p, %d x %d, ld %d) is not in device memory\n", what, p, rows,
               cols, ld);
  return false;
}

cublasStatus_t gemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha,
                    const void* a, cudaDataType at, int lda, const void* b, cudaDataType bt, int ldb, float beta,
                    void* c, cudaDataType ct, int ldc) {
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (m < 0 || n < 0 || k < 0 || lda < std::max(1, ta == CUBLAS_OP_N ? m : k) ||
      ldb < std::max(1, tb == CUBLAS_OP_N ? k : n) || ldc < std::max(1, m))
    return CUBLAS_STATUS_INVALID_VALUE;
  if (ct != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
  const bool an = ta == CUBLAS_OP_N, bn = tb == CUBLAS_OP_N;
  if (!operand_ok("A", a, at, an ? m : k, an ? k : m, lda) || !operand_ok("B", b, bt, bn ? k : n, bn ? n : k, ldb) ||
      !operand_ok("C", c, ct, m, n, ldc))
    return CUBLAS_STATUS_EXECUTION_FAILED;
  // KITE_CUDA_EMU_CUBLAS_DELAY_MS: each GEMM takes that much longer (a slow cuBLAS, so that
  // tests can see kite time it against mmq and keep mmq).
  const char* delay_env = std::getenv("KITE_CUDA_EMU_CUBLAS_DELAY_MS");
  const int delay_ms = delay_env != nullptr ? std::atoi(delay_env) : 0;
  const cudaError_t e = kite::cuda::emu::enqueue(h->stream, [=] {
    if (delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    // op(A) as m rows of k and op(B) as n columns of k, contiguous f32.
    std::vector<float> ar(static_cast<size_t>(m) * k), bc(static_cast<size_t>(n) * k);
    for (int i = 0; i < m; ++i)
      for (int p = 0; p < k; ++p)
        ar[static_cast<size_t>(i) * k + p] =
            load(at, a, an ? static_cast<size_t>(i) + static_cast<size_t>(p) * lda : static_cast<size_t>(p) + static_cast<size_t>(i) * lda);
    for (int j = 0; j < n; ++j)
      for (int p = 0; p < k; ++p)
        bc[static_cast<size_t>(j) * k + p] =
            load(bt, b, bn ? static_cast<size_t>(p) + static_cast<size_t>(j) * ldb : static_cast<size_t>(j) + static_cast<size_t>(p) * ldb);
    auto* cf = static_cast<float*>(c);
    for (int j = 0; j < n; ++j)
      for (int i = 0; i < m; ++i) {
        float& out = cf[static_cast<size_t>(i) + static_cast<size_t>(j) * ldc];
        const float v = alpha * dot(&ar[static_cast<size_t>(i) * k], &bc[static_cast<size_t>(j) * k], k);
        out = beta == 0.f ? v : v + beta * out;  // (beta 0: C is not read, as cuBLAS promises)
      }
  });
  return e == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

}  // namespace

cublasStatus_t cublasCreate_v2(cublasHandle_t* handle) {
  *handle = new cublasContext();
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSgemm_v2(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                              int k, const float* alpha, const float* a, int lda, const float* b, int ldb,
                              const float* beta, float* c, int ldc) {
  return gemm(handle, transa, transb, m, n, k, *alpha, a, CUDA_R_32F, lda, b, CUDA_R_32F, ldb, *beta, c, CUDA_R_32F,
              ldc);
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                            int k, const void* alpha, const void* a, cudaDataType a_type, int lda, const void* b,
                            cudaDataType b_type, int ldb, const void* beta, void* c, cudaDataType c_type, int ldc,
                            cublasComputeType_t compute, cublasGemmAlgo_t) {
  if (compute != CUBLAS_COMPUTE_32F || a_type != b_type) return CUBLAS_STATUS_NOT_SUPPORTED;
  return gemm(handle, transa, transb, m, n, k, *static_cast<const float*>(alpha), a, a_type, lda, b, b_type, ldb,
              *static_cast<const float*>(beta), c, c_type, ldc);
}

const char* cublasGetStatusName(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}

const char* cublasGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
  }
  return "unknown status";
}

namespace kite::cuda {

Result<const CublasApi*> cublas_api() {
  static const CublasApi api = [] {
    CublasApi a;
    a.create = &cublasCreate_v2;
    a.destroy = &cublasDestroy_v2;
    a.set_stream = &cublasSetStream_v2;
    a.sgemm = &cublasSgemm_v2;
    a.gemm_ex = &cublasGemmEx;
    a.status_name = &cublasGetStatusName;
    a.status_string = &cublasGetStatusString;
    return a;
  }();
  return &api;
}

Status cuda_check_cublas() {
  KITE_TRY(cublas_api());
  return ok_status();
}

}  // namespace kite::cuda

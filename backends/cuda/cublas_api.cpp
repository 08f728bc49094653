#include "backends/cuda/cublas_api.h"

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/dynlib.h"

#include <string>

namespace kite::cuda {
namespace {

#ifndef KITE_CUDA_LIBDIR
#define KITE_CUDA_LIBDIR "/usr/local/cuda/lib64"
#endif

Result<CublasApi> load() {
  const std::string soname = "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR);
  KITE_ASSIGN_OR_RETURN(void* lib, open_library(soname, {KITE_CUDA_LIBDIR}, "cuBLAS"));
  CublasApi api;
  const bool ok = resolve(lib, "cublasCreate_v2", &api.create) && resolve(lib, "cublasDestroy_v2", &api.destroy) &&
                  resolve(lib, "cublasSetStream_v2", &api.set_stream) && resolve(lib, "cublasSgemm_v2", &api.sgemm) &&
                  resolve(lib, "cublasGemmEx", &api.gemm_ex) && resolve(lib, "cublasGetStatusName", &api.status_name) &&
                  resolve(lib, "cublasGetStatusString", &api.status_string);
  if (!ok) {
    const char* why = dlerror();
    return make_error("cuda: ", soname, " lacks an entry point kite needs (", why ? why : "?", ")");
  }
  return api;  // the library stays loaded for the life of the process
}

}  // namespace

Result<const CublasApi*> cublas_api() { return load_once<CublasApi, load>(); }

Status cuda_check_cublas() {
  KITE_TRY(cublas_api());
  return ok_status();
}

}  // namespace kite::cuda

#include "backends/cuda/cublas_api.h"

#include "backends/cuda/cuda_backend.h"

#include <dlfcn.h>

#include <mutex>
#include <string>

namespace kite::cuda {
namespace {

#ifndef KITE_CUDA_LIBDIR
#define KITE_CUDA_LIBDIR "/usr/local/cuda/lib64"
#endif

template <class F>
bool resolve(void* lib, const char* name, F* out) {
  *out = reinterpret_cast<F>(dlsym(lib, name));
  return *out != nullptr;
}

Result<CublasApi> load() {
  // The soname of the toolkit kite was built with, found by the dynamic loader's search path
  // (ldconfig, LD_LIBRARY_PATH), then in the toolkit's folder as it was at build time.
  const std::string soname = "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR);
  const std::string candidates[] = {soname, std::string(KITE_CUDA_LIBDIR) + "/" + soname};
  std::string tried;
  void* lib = nullptr;
  for (const std::string& c : candidates) {
    lib = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib != nullptr) break;
    const char* why = dlerror();
    tried += (tried.empty() ? "" : "; ") + c + ": " + (why ? why : "not found");
  }
  if (lib == nullptr) return make_error("cuda: cannot load cuBLAS (", tried, ")");
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

Result<const CublasApi*> cublas_api() {
  static std::once_flag once;
  static Result<CublasApi> api = make_error("cuda: cuBLAS not loaded");
  std::call_once(once, [] { api = load(); });
  if (!api) return api.error();
  return &*api;
}

Status cuda_check_cublas() {
  KITE_TRY(cublas_api());
  return ok_status();
}

}  // namespace kite::cuda

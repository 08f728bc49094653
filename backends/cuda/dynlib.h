// kite/backends/cuda/dynlib.h — opening a CUDA library with dlopen (cuBLAS, NCCL): a CUDA build
// links neither, so it starts without them and only the feature that needs one fails, with an
// error naming every file tried. Internal to backends/cuda.
#pragma once

#include <dlfcn.h>

#include <initializer_list>
#include <mutex>
#include <string>

#include "src/base/status.h"

namespace kite::cuda {

// `soname` through the dynamic loader's search path (ldconfig, LD_LIBRARY_PATH), then in each of
// `dirs` (the toolkit's folders as they were at build time). The library stays loaded.
inline Result<void*> open_library(const std::string& soname, std::initializer_list<std::string> dirs,
                                  const char* what) {
  std::string tried;
  auto attempt = [&](const std::string& path) -> void* {
    void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      const char* why = dlerror();
      tried += (tried.empty() ? "" : "; ") + path + ": " + (why ? why : "not found");
    }
    return lib;
  };
  if (void* lib = attempt(soname)) return lib;
  for (const std::string& d : dirs)
    if (void* lib = attempt(d + "/" + soname)) return lib;
  return make_error("cuda: cannot load ", what, " (", tried, ")");
}

// Entry point `name` of `lib` into `*out`; false when the library lacks it.
template <class F>
bool resolve(void* lib, const char* name, F* out) {
  *out = reinterpret_cast<F>(dlsym(lib, name));
  return *out != nullptr;
}

// The entry points Load() resolves (it opens the library), loaded on the first call and kept for
// the process; a failure is kept too and returned to every caller.
template <class Api, Result<Api> (*Load)()>
Result<const Api*> load_once() {
  static std::once_flag once;
  static Result<Api> api = make_error("cuda: library not loaded");
  std::call_once(once, [] { api = Load(); });
  if (!api) return api.error();
  return &*api;
}

}  // namespace kite::cuda

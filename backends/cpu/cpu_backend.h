// kite/backends/cpu/cpu_backend.h — the CPU backend: host buffers, a thread team, and a kernel
// per op. It is the fallback for every op and the reference the other backends are tested
// against.
#pragma once

#include <memory>

#include "src/core/backend.h"

namespace kite::cpu {

Result<std::unique_ptr<Backend>> make_cpu_backend(const BackendOptions& opts);

}  // namespace kite::cpu

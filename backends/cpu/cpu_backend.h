// kite/backends/cpu/cpu_backend.h — the CPU backend: host buffers, a thread team, and a kernel
// per op. It is the fallback for every op and the reference the other backends are tested
// against.
#pragma once

#include <memory>

#include "src/core/backend.h"
#include "src/core/devices.h"

namespace kite::cpu {

Result<std::unique_ptr<Backend>> make_cpu_backend(const BackendOptions& opts);

// The host as one device: its CPU model, cores and SIMD kernel level, and its RAM.
Result<std::vector<DeviceInfo>> list_cpu_devices();

}  // namespace kite::cpu

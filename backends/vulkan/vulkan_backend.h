// kite/backends/vulkan/vulkan_backend.h — the Vulkan backend (plain C++: no Vulkan headers here).
//
// make_vulkan_backend() opens device BackendOptions::device of vulkan_devices() (discrete GPUs
// first, lavapipe's CPU device last) and records each compute() into one command buffer of
// compute-shader dispatches, submitted without waiting (synchronize() waits). Tensors in its
// Buffers are device addresses (VK_KHR_buffer_device_address). Weights in host memory (the file
// mapping) are mirrored on the device on first use, once per device: every backend (context) on
// that device shares them. libvulkan is opened on first use, so a Vulkan build runs where it is
// missing; no loader, driver or usable device is a clear error, never a crash.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "src/base/status.h"
#include "src/core/backend.h"
#include "src/core/devices.h"

namespace kite::vk {

// The physical devices kite can use (the features it needs are present), in kite's order:
// discrete GPUs, then integrated, virtual and CPU (lavapipe) devices, with their type, Vulkan
// version and largest device-local heap; an error says why there are none (no loader, no
// driver, features).
Result<std::vector<DeviceInfo>> list_vulkan_devices();
// Their names; empty when there are none (never throws).
std::vector<std::string> vulkan_devices();

Result<std::unique_ptr<Backend>> make_vulkan_backend(const BackendOptions& opts);

// Bytes of host weights mirrored on device `index` now (shared by all backends on it).
size_t vulkan_mirrored_bytes(int index);
// Whether device `index`'s buffers are host-visible (lavapipe, integrated GPUs, resizable BAR);
// else the host reads and writes them through staging copies (discrete GPUs, or lavapipe with
// KITE_VULKAN_STAGING=1).
bool vulkan_unified_memory(int index);

}  // namespace kite::vk

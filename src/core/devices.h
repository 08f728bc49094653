// kite/src/core/devices.h — the devices each backend can compute on, as `kite devices` lists
// them, and what its kernels chose by timing them. A backend registers a lister (and a
// reporter) beside its factory (backends/registry.cpp).
#pragma once
#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <vector>
#include "src/base/status.h"
namespace kite {
struct DeviceInfo {
  std::string name;         // "NVIDIA H200", the CPU's model, ...
  std::string details;      // what else tells devices apart: compute capability, SIMD level, type
  size_t memory_total = 0;  // bytes of the device's own memory (the host's RAM for the CPU)
  size_t memory_free = 0;   // of which free now (0: not known)
};
// The devices of one backend, index 0 first (the N of --device NAME:N); an error says why it has
// none (no driver, no device).
using DeviceLister = std::function<Result<std::vector<DeviceInfo>>()>;
void register_device_lister(std::string backend, DeviceLister lister);
// The devices of registered backend `backend`, or why there are none, or that the name is unknown.
Result<std::vector<DeviceInfo>> list_devices(std::string_view backend);
// What a backend's kernels chose by timing in this process so far (which way a weight type's or
// a shape's matmuls run, with the rates measured), a line each, as `kite bench` prints them. A
// backend that measures registers a reporter beside its factory.
using ChoiceReporter = std::function<std::vector<std::string>()>;
void register_choice_reporter(std::string backend, ChoiceReporter reporter);
// The lines of `backend` ("cuda:1" is "cuda"); none for an unknown name or one without a reporter.
std::vector<std::string> measured_choices(std::string_view backend);
}  // namespace kite

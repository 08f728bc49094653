// kite/backends/vulkan/device.h — one Vulkan device as kite uses it, shared by every backend
// (context) that runs on it: the loader (libvulkan is opened with dlopen on first use, so a
// Vulkan build starts and runs on machines without it), the logical device and its compute
// queue, memory (every buffer has a device address), the pipelines of the embedded shaders,
// the registry of buffer ranges (device address -> allocation) and the weight mirrors.
// Internal to backends/vulkan.
#pragma once

#define VK_NO_PROTOTYPES
#include <vulkan/vulkan.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "src/base/status.h"
#include "src/core/tensor.h"
#include "src/core/weight_mirrors.h"

namespace kite::vk {

// The entry points kite calls, loaded from libvulkan.so.1.
struct Api {
#define KITE_VK_FN(name) PFN_##name name = nullptr;
#include "backends/vulkan/vk_functions.inc"
#undef KITE_VK_FN
};

// The error of a failed Vulkan call: the call, the VkResult's name and the source line.
Error vk_error(VkResult r, const char* call, const char* file, int line);

#define KITE_VK_CHECK(call)                                                                     \
  do {                                                                                          \
    const VkResult kite_vk_r_ = (call);                                                         \
    if (kite_vk_r_ != VK_SUCCESS) return ::kite::vk::vk_error(kite_vk_r_, #call, __FILE__, __LINE__); \
  } while (0)

class Device;

// A VkBuffer with its own memory and device address; mapped when the memory is host-visible.
struct Allocation {
  Device* dev = nullptr;
  VkBuffer buffer = VK_NULL_HANDLE;
  VkDeviceMemory memory = VK_NULL_HANDLE;
  uint64_t address = 0;
  size_t bytes = 0;
  void* mapped = nullptr;  // host pointer of the bytes, or null (device-only memory)
  ~Allocation();
};

class Device {
 public:
  // The shared device `index` (of list_vulkan_devices()), opened on first use and kept open.
  static Result<std::shared_ptr<Device>> get(int index);
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  const Api& api() const { return *api_; }
  VkDevice handle() const { return device_; }
  const std::string& name() const { return name_; }
  uint32_t queue_family() const { return queue_family_; }
  bool is_gpu() const { return is_gpu_; }
  // Timestamps (profiling): the valid bits the compute queue writes (0: none) and the
  // nanoseconds a tick.
  uint32_t timestamp_bits() const { return timestamp_bits_; }
  double timestamp_ns() const { return timestamp_ns_; }

  // Device memory with a device address, registered as a range of this device (out of memory
  // is an error naming what it was for).
  Result<std::unique_ptr<Allocation>> alloc(size_t bytes, std::string_view what);
  // The allocation whose range holds `address`, with the offset into it; null if none.
  const Allocation* find(uint64_t address, size_t* offset) const;
  bool is_device(const void* p) const { return find(reinterpret_cast<uint64_t>(p), nullptr) != nullptr; }

  // The device address of a host weight's mirror (a leaf `root` in host memory), uploaded on
  // first use by any backend and shared by all (src/core/weight_mirrors.h); `holds` records
  // the backend's hold, release_mirrors drops them.
  Result<uint64_t> mirror(const Tensor* root, MirrorHolds& holds);
  void release_mirrors(MirrorHolds& holds);
  bool has_mirror(const void* host, size_t bytes) const;
  size_t mirrored_bytes() const;

  // The device address of the IQ codebooks (quant::IqGrids, formats/quant/iq_grids.h), uploaded
  // on first use and kept while the device is open.
  Result<uint64_t> codebooks();

  // Bytes between host and an allocation (synchronous; staged when not host-visible).
  Status write(const Allocation& dst, size_t offset, const void* src, size_t bytes);
  Status read(const Allocation& src, size_t offset, void* dst, size_t bytes);
  // `bytes` at each of `offsets` into consecutive runs of dst: one submit per staging-full.
  Status read_many(const Allocation& src, std::span<const size_t> offsets, size_t bytes, void* dst);

  // The compute pipeline of embedded shader `name` (created on first use), and the layout
  // every pipeline shares (push constants only).
  Result<VkPipeline> pipeline(std::string_view name);
  VkPipelineLayout layout() const { return layout_; }

  // Submits one command buffer (the queue is shared: submissions are serialized).
  Status submit(VkCommandBuffer cb, VkFence fence);

  size_t memory_total() const { return heap_bytes_; }
  // Whether the host reads and writes buffers in place (else through staging copies).
  bool unified() const { return unified_; }
  size_t memory_used() const;

 private:
  Device() = default;
  Status open(int index);
  // Runs `record` in a one-off command buffer and waits (transfers of write/read/mirror).
  template <class F>
  Status run_once(F&& record);
  Result<Allocation*> staging(size_t bytes);
  Result<std::unique_ptr<Allocation>> alloc_memory(size_t bytes, uint32_t type, std::string_view what, bool map = true);

  const Api* api_ = nullptr;  // the process-wide loader and instance (device.cpp)
  VkPhysicalDevice physical_ = VK_NULL_HANDLE;
  VkDevice device_ = VK_NULL_HANDLE;
  VkQueue queue_ = VK_NULL_HANDLE;
  uint32_t queue_family_ = 0;
  std::string name_;
  bool is_gpu_ = true;
  uint32_t timestamp_bits_ = 0;
  double timestamp_ns_ = 1;
  VkPhysicalDeviceMemoryProperties mem_props_{};
  uint32_t device_type_ = UINT32_MAX;   // memory type of buffers
  uint32_t staging_type_ = UINT32_MAX;  // host-visible memory for staging (when buffers are not)
  bool unified_ = false;                // buffers are host-visible: no staging
  // KITE_VULKAN_STAGING=1: buffers are never mapped and every transfer goes through staging, as
  // on a discrete GPU (so lavapipe runs that path in CI).
  bool staged_only_ = false;
  size_t heap_bytes_ = 0;
  VkPipelineLayout layout_ = VK_NULL_HANDLE;

  mutable std::recursive_mutex mu_;  // everything below, and the queue
  std::map<uint64_t, const Allocation*> ranges_;  // base address -> allocation
  size_t allocated_bytes_ = 0;
  std::unordered_map<std::string, VkPipeline> pipelines_;
  WeightMirrors<std::unique_ptr<Allocation>> mirrors_;
  VkCommandPool pool_ = VK_NULL_HANDLE;  // one-off transfers
  VkCommandBuffer cb_ = VK_NULL_HANDLE;
  VkFence fence_ = VK_NULL_HANDLE;
  std::unique_ptr<Allocation> staging_;
  std::unique_ptr<Allocation> codebooks_;

  friend struct Allocation;
};

}  // namespace kite::vk

#include "backends/vulkan/device.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "backends/vulkan/shaders.h"
#include "backends/vulkan/stream.h"
#include "backends/vulkan/vulkan_backend.h"
#include "formats/quant/iq_grids.h"

namespace kite::vk {
namespace {

constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kLogEvery = size_t{1} << 30;       // weight upload progress, every GiB
constexpr size_t kStagingBytes = size_t{16} << 20;  // host-visible staging (discrete GPUs)

const char* result_name(VkResult r) {
  switch (r) {
    case VK_SUCCESS: return "VK_SUCCESS";
    case VK_NOT_READY: return "VK_NOT_READY";
    case VK_TIMEOUT: return "VK_TIMEOUT";
    case VK_ERROR_OUT_OF_HOST_MEMORY: return "VK_ERROR_OUT_OF_HOST_MEMORY";
    case VK_ERROR_OUT_OF_DEVICE_MEMORY: return "VK_ERROR_OUT_OF_DEVICE_MEMORY";
    case VK_ERROR_INITIALIZATION_FAILED: return "VK_ERROR_INITIALIZATION_FAILED";
    case VK_ERROR_DEVICE_LOST: return "VK_ERROR_DEVICE_LOST";
    case VK_ERROR_MEMORY_MAP_FAILED: return "VK_ERROR_MEMORY_MAP_FAILED";
    case VK_ERROR_LAYER_NOT_PRESENT: return "VK_ERROR_LAYER_NOT_PRESENT";
    case VK_ERROR_EXTENSION_NOT_PRESENT: return "VK_ERROR_EXTENSION_NOT_PRESENT";
    case VK_ERROR_FEATURE_NOT_PRESENT: return "VK_ERROR_FEATURE_NOT_PRESENT";
    case VK_ERROR_INCOMPATIBLE_DRIVER: return "VK_ERROR_INCOMPATIBLE_DRIVER";
    case VK_ERROR_TOO_MANY_OBJECTS: return "VK_ERROR_TOO_MANY_OBJECTS";
    default: return "VkResult";
  }
}

// The loader and one VkInstance for the process (never destroyed: backends may outlive main's
// statics). An error says why Vulkan cannot be used at all.
struct Instance {
  Api api;
  VkInstance handle = VK_NULL_HANDLE;
};

Result<const Instance*> instance() {
  static const Result<const Instance*> inst = []() -> Result<const Instance*> {
    void* lib = dlopen("libvulkan.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) lib = dlopen("libvulkan.so", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr)
      return make_error("vulkan: no Vulkan device found: the Vulkan loader (libvulkan.so.1) is not installed (",
                        dlerror(), ")");
    auto gipa = reinterpret_cast<PFN_vkGetInstanceProcAddr>(dlsym(lib, "vkGetInstanceProcAddr"));
    if (gipa == nullptr) return make_error("vulkan: libvulkan.so.1 has no vkGetInstanceProcAddr");
    auto create = reinterpret_cast<PFN_vkCreateInstance>(gipa(VK_NULL_HANDLE, "vkCreateInstance"));
    auto version = reinterpret_cast<PFN_vkEnumerateInstanceVersion>(gipa(VK_NULL_HANDLE, "vkEnumerateInstanceVersion"));
    uint32_t v = VK_API_VERSION_1_0;
    if (version != nullptr) version(&v);
    if (create == nullptr || v < VK_API_VERSION_1_2)
      return make_error("vulkan: no Vulkan device found: the loader supports Vulkan ", VK_API_VERSION_MAJOR(v), ".",
                        VK_API_VERSION_MINOR(v), ", kite needs 1.2");
    VkApplicationInfo app{VK_STRUCTURE_TYPE_APPLICATION_INFO};
    app.pApplicationName = "kite";
    app.apiVersion = VK_API_VERSION_1_2;
    VkInstanceCreateInfo ci{VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO};
    ci.pApplicationInfo = &app;
    auto* in = new Instance();
    const VkResult r = create(&ci, nullptr, &in->handle);
    if (r != VK_SUCCESS) {
      delete in;
      return make_error("vulkan: no Vulkan device found: vkCreateInstance failed (", result_name(r), ")");
    }
#define KITE_VK_FN(name) in->api.name = reinterpret_cast<PFN_##name>(gipa(in->handle, #name));
#include "backends/vulkan/vk_functions.inc"
#undef KITE_VK_FN
#define KITE_VK_FN(name) \
  if (in->api.name == nullptr) return make_error("vulkan: the loader lacks " #name);
#include "backends/vulkan/vk_functions.inc"
#undef KITE_VK_FN
    return static_cast<const Instance*>(in);
  }();
  return inst;
}

struct Features {
  VkPhysicalDeviceFeatures2 f2{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2};
  VkPhysicalDeviceVulkan11Features v11{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES};
  VkPhysicalDeviceVulkan12Features v12{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
  Features() {
    f2.pNext = &v11;
    v11.pNext = &v12;
  }
  Features(const Features&) = delete;
};

// What a device lacks of what kite needs ("" when nothing).
std::string missing_features(const Api& api, VkPhysicalDevice pd) {
  VkPhysicalDeviceProperties props;
  api.vkGetPhysicalDeviceProperties(pd, &props);
  if (props.apiVersion < VK_API_VERSION_1_2) return "Vulkan 1.2";
  Features f;
  api.vkGetPhysicalDeviceFeatures2(pd, &f.f2);
  std::string miss;
  auto need = [&miss](VkBool32 have, const char* what) {
    if (!have) miss += (miss.empty() ? "" : ", ") + std::string(what);
  };
  need(f.v12.bufferDeviceAddress, "bufferDeviceAddress");
  need(f.v12.storageBuffer8BitAccess, "storageBuffer8BitAccess");
  need(f.v11.storageBuffer16BitAccess, "storageBuffer16BitAccess");
  need(f.v12.scalarBlockLayout, "scalarBlockLayout");
  need(f.f2.features.shaderInt64, "shaderInt64");
  if (props.limits.maxPushConstantsSize < kMaxPush) miss += (miss.empty() ? "" : ", ") + std::string("128-byte push constants");
  return miss;
}

const char* type_name(VkPhysicalDeviceType t) {
  switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return "discrete GPU";
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return "integrated GPU";
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return "virtual GPU";
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return "CPU";
    default: return "other";
  }
}

int type_rank(VkPhysicalDeviceType t) {
  switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return 0;
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return 1;
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return 2;
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return 3;
    default: return 4;
  }
}

// The usable physical devices in kite's order, or why there are none.
Result<std::vector<VkPhysicalDevice>> usable_devices(const Instance& in) {
  uint32_t n = 0;
  KITE_VK_CHECK(in.api.vkEnumeratePhysicalDevices(in.handle, &n, nullptr));
  std::vector<VkPhysicalDevice> all(n);
  KITE_VK_CHECK(in.api.vkEnumeratePhysicalDevices(in.handle, &n, all.data()));
  std::vector<VkPhysicalDevice> ok;
  std::string why;
  for (VkPhysicalDevice pd : all) {
    const std::string miss = missing_features(in.api, pd);
    if (miss.empty()) {
      ok.push_back(pd);
      continue;
    }
    VkPhysicalDeviceProperties p;
    in.api.vkGetPhysicalDeviceProperties(pd, &p);
    why += std::string(why.empty() ? "" : "; ") + p.deviceName + " lacks " + miss;
  }
  if (ok.empty())
    return make_error("vulkan: no Vulkan device found (", n, " device", n == 1 ? "" : "s",
                      why.empty() ? "" : ": " + why, ")");
  std::stable_sort(ok.begin(), ok.end(), [&in](VkPhysicalDevice a, VkPhysicalDevice b) {
    VkPhysicalDeviceProperties pa, pb;
    in.api.vkGetPhysicalDeviceProperties(a, &pa);
    in.api.vkGetPhysicalDeviceProperties(b, &pb);
    return type_rank(pa.deviceType) < type_rank(pb.deviceType);
  });
  return ok;
}

size_t largest_device_heap(const VkPhysicalDeviceMemoryProperties& m) {
  size_t best = 0;
  for (uint32_t i = 0; i < m.memoryHeapCount; ++i)
    if (m.memoryHeaps[i].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) best = std::max<size_t>(best, m.memoryHeaps[i].size);
  return best;
}

}  // namespace

Error vk_error(VkResult r, const char* call, const char* file, int line) {
  return make_error("vulkan: ", call, " failed: ", result_name(r), " (", static_cast<int>(r), ") at ", file, ":", line);
}

Result<std::vector<DeviceInfo>> list_vulkan_devices() {
  KITE_ASSIGN_OR_RETURN(const Instance* in, instance());
  KITE_ASSIGN_OR_RETURN(auto pds, usable_devices(*in));
  std::vector<DeviceInfo> out;
  for (VkPhysicalDevice pd : pds) {
    VkPhysicalDeviceProperties p;
    in->api.vkGetPhysicalDeviceProperties(pd, &p);
    VkPhysicalDeviceMemoryProperties mem;
    in->api.vkGetPhysicalDeviceMemoryProperties(pd, &mem);
    DeviceInfo d;
    d.name = p.deviceName;
    d.details = std::string(type_name(p.deviceType)) + ", Vulkan " + std::to_string(VK_API_VERSION_MAJOR(p.apiVersion)) +
                "." + std::to_string(VK_API_VERSION_MINOR(p.apiVersion));
    d.memory_total = largest_device_heap(mem);
    out.push_back(std::move(d));
  }
  return out;
}

// ---- Device ---------------------------------------------------------------------------------

Result<std::shared_ptr<Device>> Device::get(int index) {
  // Open devices stay open for the process (never destroyed, like the instance): a device and
  // its compiled pipelines are reused by every later backend; memory goes with the backends.
  static std::mutex mu;
  static auto* open_devices = new std::map<int, std::shared_ptr<Device>>();
  std::lock_guard lock(mu);
  if (auto it = open_devices->find(index); it != open_devices->end()) return it->second;
  std::shared_ptr<Device> d(new Device());
  KITE_TRY(d->open(index));
  open_devices->emplace(index, d);
  return d;
}

Status Device::open(int index) {
  KITE_ASSIGN_OR_RETURN(const Instance* in, instance());
  api_ = &in->api;
  KITE_ASSIGN_OR_RETURN(auto pds, usable_devices(*in));
  if (index < 0 || index >= static_cast<int>(pds.size()))
    return make_error("vulkan: device ", index, " does not exist (", pds.size(), " device", pds.size() == 1 ? "" : "s",
                      ")");
  physical_ = pds[static_cast<size_t>(index)];
  VkPhysicalDeviceProperties props;
  api_->vkGetPhysicalDeviceProperties(physical_, &props);
  name_ = props.deviceName;
  is_gpu_ = props.deviceType != VK_PHYSICAL_DEVICE_TYPE_CPU;

  uint32_t nq = 0;
  api_->vkGetPhysicalDeviceQueueFamilyProperties(physical_, &nq, nullptr);
  std::vector<VkQueueFamilyProperties> qf(nq);
  api_->vkGetPhysicalDeviceQueueFamilyProperties(physical_, &nq, qf.data());
  queue_family_ = UINT32_MAX;
  for (uint32_t i = 0; i < nq && queue_family_ == UINT32_MAX; ++i)
    if (qf[i].queueFlags & VK_QUEUE_COMPUTE_BIT) queue_family_ = i;
  if (queue_family_ == UINT32_MAX) return make_error("vulkan: ", name_, " has no compute queue");
  timestamp_bits_ = qf[queue_family_].timestampValidBits;
  timestamp_ns_ = props.limits.timestampPeriod;

  // Enable what kite needs, and the 8/16-bit arithmetic types where present (shaders that
  // convert 8/16-bit loads may be compiled with those capabilities).
  Features have;
  api_->vkGetPhysicalDeviceFeatures2(physical_, &have.f2);
  Features want;
  want.v12.bufferDeviceAddress = VK_TRUE;
  want.v12.storageBuffer8BitAccess = VK_TRUE;
  want.v12.scalarBlockLayout = VK_TRUE;
  want.v12.shaderInt8 = have.v12.shaderInt8;
  want.v12.shaderFloat16 = have.v12.shaderFloat16;
  want.v11.storageBuffer16BitAccess = VK_TRUE;
  want.f2.features.shaderInt64 = VK_TRUE;
  want.f2.features.shaderInt16 = have.f2.features.shaderInt16;
  const float priority = 1.f;
  VkDeviceQueueCreateInfo qci{VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO};
  qci.queueFamilyIndex = queue_family_;
  qci.queueCount = 1;
  qci.pQueuePriorities = &priority;
  VkDeviceCreateInfo dci{VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO};
  dci.pNext = &want.f2;
  dci.queueCreateInfoCount = 1;
  dci.pQueueCreateInfos = &qci;
  KITE_VK_CHECK(api_->vkCreateDevice(physical_, &dci, nullptr, &device_));
  api_->vkGetDeviceQueue(device_, queue_family_, 0, &queue_);

  // Memory: host-visible device memory for everything where its heap is the big one (lavapipe,
  // integrated GPUs, resizable BAR), else device-local buffers and host-visible staging.
  api_->vkGetPhysicalDeviceMemoryProperties(physical_, &mem_props_);
  heap_bytes_ = largest_device_heap(mem_props_);
  const char* staged = std::getenv("KITE_VULKAN_STAGING");
  staged_only_ = staged != nullptr && std::string_view(staged) == "1";
  const VkMemoryPropertyFlags unified =
      VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT | VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
  for (uint32_t i = 0; i < mem_props_.memoryTypeCount && !unified_ && !staged_only_; ++i) {
    const VkMemoryType& t = mem_props_.memoryTypes[i];
    if ((t.propertyFlags & unified) == unified && mem_props_.memoryHeaps[t.heapIndex].size >= heap_bytes_ / 2) {
      unified_ = true;
      device_type_ = i;
    }
  }
  for (uint32_t i = 0; i < mem_props_.memoryTypeCount; ++i) {
    const VkMemoryPropertyFlags f = mem_props_.memoryTypes[i].propertyFlags;
    if (device_type_ == UINT32_MAX && (f & VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT)) device_type_ = i;
    const VkMemoryPropertyFlags host = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
    if (staging_type_ == UINT32_MAX && (f & host) == host) staging_type_ = i;
  }
  if (device_type_ == UINT32_MAX || (!unified_ && staging_type_ == UINT32_MAX))
    return make_error("vulkan: ", name_, " has no usable memory type");

  VkPushConstantRange range{VK_SHADER_STAGE_COMPUTE_BIT, 0, static_cast<uint32_t>(kMaxPush)};
  VkPipelineLayoutCreateInfo lci{VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO};
  lci.pushConstantRangeCount = 1;
  lci.pPushConstantRanges = &range;
  KITE_VK_CHECK(api_->vkCreatePipelineLayout(device_, &lci, nullptr, &layout_));

  VkCommandPoolCreateInfo pci{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
  pci.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
  pci.queueFamilyIndex = queue_family_;
  KITE_VK_CHECK(api_->vkCreateCommandPool(device_, &pci, nullptr, &pool_));
  VkCommandBufferAllocateInfo ai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
  ai.commandPool = pool_;
  ai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
  ai.commandBufferCount = 1;
  KITE_VK_CHECK(api_->vkAllocateCommandBuffers(device_, &ai, &cb_));
  VkFenceCreateInfo fci{VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
  KITE_VK_CHECK(api_->vkCreateFence(device_, &fci, nullptr, &fence_));
  return ok_status();
}

Device::~Device() {
  if (device_ == VK_NULL_HANDLE) return;
  api_->vkDeviceWaitIdle(device_);
  staging_.reset();
  codebooks_.reset();
  for (auto& [name, p] : pipelines_) api_->vkDestroyPipeline(device_, p, nullptr);
  if (fence_) api_->vkDestroyFence(device_, fence_, nullptr);
  if (pool_) api_->vkDestroyCommandPool(device_, pool_, nullptr);
  if (layout_) api_->vkDestroyPipelineLayout(device_, layout_, nullptr);
  api_->vkDestroyDevice(device_, nullptr);
}

// ---- memory ---------------------------------------------------------------------------------

Allocation::~Allocation() {
  if (dev == nullptr) return;
  const Api& api = dev->api();
  if (address != 0) {
    std::lock_guard lock(dev->mu_);
    dev->ranges_.erase(address);
    dev->allocated_bytes_ -= bytes;
  }
  if (buffer) api.vkDestroyBuffer(dev->handle(), buffer, nullptr);
  if (memory) api.vkFreeMemory(dev->handle(), memory, nullptr);  // unmaps
}

Result<std::unique_ptr<Allocation>> Device::alloc_memory(size_t bytes, uint32_t type, std::string_view what, bool map) {
  auto a = std::make_unique<Allocation>();
  a->dev = this;
  a->bytes = std::max<size_t>(bytes, 16);
  VkBufferCreateInfo bci{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
  bci.size = a->bytes;
  bci.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT |
              VK_BUFFER_USAGE_SHADER_DEVICE_ADDRESS_BIT;
  bci.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
  KITE_VK_CHECK(api_->vkCreateBuffer(device_, &bci, nullptr, &a->buffer));
  VkMemoryRequirements req;
  api_->vkGetBufferMemoryRequirements(device_, a->buffer, &req);
  if (!(req.memoryTypeBits & (1u << type)))
    return make_error("vulkan: ", name_, ": buffers cannot use memory type ", type);
  VkMemoryAllocateFlagsInfo flags{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_FLAGS_INFO};
  flags.flags = VK_MEMORY_ALLOCATE_DEVICE_ADDRESS_BIT;
  VkMemoryAllocateInfo mai{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
  mai.pNext = &flags;
  mai.allocationSize = req.size;
  mai.memoryTypeIndex = type;
  const VkResult r = api_->vkAllocateMemory(device_, &mai, nullptr, &a->memory);
  if (r != VK_SUCCESS)
    return make_error("vulkan: out of device memory allocating ", bytes / kMiB, " MiB for ", what, " on ", name_, " (",
                      memory_used() / kMiB, " MiB in use of ", heap_bytes_ / kMiB, " MiB; ", result_name(r), ")");
  KITE_VK_CHECK(api_->vkBindBufferMemory(device_, a->buffer, a->memory, 0));
  if (map && (mem_props_.memoryTypes[type].propertyFlags & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT))
    KITE_VK_CHECK(api_->vkMapMemory(device_, a->memory, 0, VK_WHOLE_SIZE, 0, &a->mapped));
  VkBufferDeviceAddressInfo bai{VK_STRUCTURE_TYPE_BUFFER_DEVICE_ADDRESS_INFO};
  bai.buffer = a->buffer;
  a->address = api_->vkGetBufferDeviceAddress(device_, &bai);
  std::lock_guard lock(mu_);
  ranges_[a->address] = a.get();
  allocated_bytes_ += a->bytes;
  return a;
}

Result<std::unique_ptr<Allocation>> Device::alloc(size_t bytes, std::string_view what) {
  return alloc_memory(bytes, device_type_, what, !staged_only_);
}

size_t Device::memory_used() const {
  std::lock_guard lock(mu_);
  return allocated_bytes_;
}

const Allocation* Device::find(uint64_t address, size_t* offset) const {
  std::lock_guard lock(mu_);
  auto it = ranges_.upper_bound(address);
  if (it == ranges_.begin()) return nullptr;
  --it;
  if (address >= it->first + it->second->bytes) return nullptr;
  if (offset != nullptr) *offset = static_cast<size_t>(address - it->first);
  return it->second;
}

Result<Allocation*> Device::staging(size_t bytes) {
  if (!staging_ || staging_->bytes < bytes) {
    staging_.reset();
    KITE_ASSIGN_OR_RETURN(staging_, alloc_memory(std::max(bytes, kStagingBytes), staging_type_, "staging"));
  }
  return staging_.get();
}

template <class F>
Status Device::run_once(F&& record) {
  KITE_VK_CHECK(api_->vkResetCommandBuffer(cb_, 0));
  VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
  bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
  KITE_VK_CHECK(api_->vkBeginCommandBuffer(cb_, &bi));
  // Earlier shader writes before the copy; the copy's writes before later shaders and the host.
  VkMemoryBarrier mb{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
  mb.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT | VK_ACCESS_HOST_WRITE_BIT;
  mb.dstAccessMask = VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
  api_->vkCmdPipelineBarrier(cb_, VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, VK_PIPELINE_STAGE_TRANSFER_BIT, 0, 1, &mb, 0,
                             nullptr, 0, nullptr);
  record(cb_);
  mb.srcAccessMask = VK_ACCESS_TRANSFER_WRITE_BIT;
  mb.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_HOST_READ_BIT;
  api_->vkCmdPipelineBarrier(cb_, VK_PIPELINE_STAGE_TRANSFER_BIT,
                             VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &mb, 0, nullptr,
                             0, nullptr);
  KITE_VK_CHECK(api_->vkEndCommandBuffer(cb_));
  KITE_TRY(submit(cb_, fence_));
  KITE_VK_CHECK(api_->vkWaitForFences(device_, 1, &fence_, VK_TRUE, UINT64_MAX));
  KITE_VK_CHECK(api_->vkResetFences(device_, 1, &fence_));
  return ok_status();
}

Status Device::write(const Allocation& dst, size_t offset, const void* src, size_t bytes) {
  if (offset + bytes > dst.bytes) return make_error("vulkan: write of ", bytes, " bytes past the end of a buffer");
  if (dst.mapped != nullptr) {
    std::memcpy(static_cast<uint8_t*>(dst.mapped) + offset, src, bytes);
    return ok_status();
  }
  std::lock_guard lock(mu_);
  KITE_ASSIGN_OR_RETURN(Allocation * st, staging(kStagingBytes));
  const auto* h = static_cast<const uint8_t*>(src);
  for (size_t done = 0; done < bytes;) {
    const size_t n = std::min(bytes - done, st->bytes);
    std::memcpy(st->mapped, h + done, n);
    KITE_TRY(run_once([&](VkCommandBuffer cb) {
      VkBufferCopy c{0, offset + done, n};
      api_->vkCmdCopyBuffer(cb, st->buffer, dst.buffer, 1, &c);
    }));
    done += n;
  }
  return ok_status();
}

Status Device::read(const Allocation& src, size_t offset, void* dst, size_t bytes) {
  if (offset + bytes > src.bytes) return make_error("vulkan: read of ", bytes, " bytes past the end of a buffer");
  if (src.mapped != nullptr) {
    std::memcpy(dst, static_cast<const uint8_t*>(src.mapped) + offset, bytes);
    return ok_status();
  }
  std::lock_guard lock(mu_);
  KITE_ASSIGN_OR_RETURN(Allocation * st, staging(kStagingBytes));
  auto* h = static_cast<uint8_t*>(dst);
  for (size_t done = 0; done < bytes;) {
    const size_t n = std::min(bytes - done, st->bytes);
    KITE_TRY(run_once([&](VkCommandBuffer cb) {
      VkBufferCopy c{offset + done, 0, n};
      api_->vkCmdCopyBuffer(cb, src.buffer, st->buffer, 1, &c);
    }));
    std::memcpy(h + done, st->mapped, n);
    done += n;
  }
  return ok_status();
}

Status Device::read_many(const Allocation& src, std::span<const size_t> offsets, size_t bytes, void* dst) {
  auto* h = static_cast<uint8_t*>(dst);
  for (size_t o : offsets)
    if (o + bytes > src.bytes) return make_error("vulkan: read of ", bytes, " bytes past the end of a buffer");
  if (src.mapped != nullptr || bytes > kStagingBytes) {
    for (size_t i = 0; i < offsets.size(); ++i) KITE_TRY(read(src, offsets[i], h + i * bytes, bytes));
    return ok_status();
  }
  std::lock_guard lock(mu_);
  KITE_ASSIGN_OR_RETURN(Allocation * st, staging(kStagingBytes));
  const size_t per = st->bytes / bytes;
  for (size_t first = 0; first < offsets.size(); first += per) {
    const size_t n = std::min(per, offsets.size() - first);
    KITE_TRY(run_once([&](VkCommandBuffer cb) {
      for (size_t i = 0; i < n; ++i) {
        const VkBufferCopy c{offsets[first + i], i * bytes, bytes};
        api_->vkCmdCopyBuffer(cb, src.buffer, st->buffer, 1, &c);
      }
    }));
    std::memcpy(h + first * bytes, st->mapped, n * bytes);
  }
  return ok_status();
}

// ---- weight mirrors -------------------------------------------------------------------------

Result<uint64_t> Device::mirror(const Tensor* root, MirrorHolds& holds) {
  std::lock_guard lock(mu_);
  auto upload = [&](size_t bytes) -> Result<std::unique_ptr<Allocation>> {
    KITE_ASSIGN_OR_RETURN(auto mem, alloc(bytes, "weight '" + root->name + "'"));
    KITE_TRY(write(*mem, 0, root->data, bytes));
    const size_t before = mirrors_.bytes();
    if ((before + bytes) / kLogEvery != before / kLogEvery)
      std::fprintf(stderr, "vulkan: %zu MiB of weights uploaded to %s\n", (before + bytes) / kMiB, name_.c_str());
    return mem;
  };
  KITE_ASSIGN_OR_RETURN(const auto* mem, mirrors_.acquire(root->data, root->nbytes(), holds, upload));
  return (*mem)->address;
}

Result<uint64_t> Device::codebooks() {
  std::lock_guard lock(mu_);
  if (codebooks_ == nullptr) {
    const quant::IqGrids& g = quant::iq_grids();
    KITE_ASSIGN_OR_RETURN(auto mem, alloc(sizeof g, "the IQ codebooks"));
    KITE_TRY(write(*mem, 0, &g, sizeof g));
    codebooks_ = std::move(mem);
  }
  return codebooks_->address;
}

void Device::release_mirrors(MirrorHolds& holds) {
  std::lock_guard lock(mu_);
  mirrors_.release(holds);
}

bool Device::has_mirror(const void* host, size_t bytes) const {
  std::lock_guard lock(mu_);
  return mirrors_.has(host, bytes);
}

size_t Device::mirrored_bytes() const {
  std::lock_guard lock(mu_);
  return mirrors_.bytes();
}

// ---- pipelines and submission ---------------------------------------------------------------

Result<VkPipeline> Device::pipeline(std::string_view name) {
  std::lock_guard lock(mu_);
  if (auto it = pipelines_.find(std::string(name)); it != pipelines_.end()) return it->second;
  const auto shaders = embedded_shaders();
  auto s = std::find_if(shaders.begin(), shaders.end(), [&](const EmbeddedShader& e) { return e.name == name; });
  if (s == shaders.end()) return make_error("vulkan: no shader named '", name, "' is built in");
  VkShaderModuleCreateInfo mci{VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO};
  mci.codeSize = s->spirv.size_bytes();
  mci.pCode = s->spirv.data();
  VkShaderModule module = VK_NULL_HANDLE;
  KITE_VK_CHECK(api_->vkCreateShaderModule(device_, &mci, nullptr, &module));
  VkComputePipelineCreateInfo pci{VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO};
  pci.stage.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO;
  pci.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
  pci.stage.module = module;
  pci.stage.pName = "main";
  pci.layout = layout_;
  VkPipeline p = VK_NULL_HANDLE;
  const VkResult r = api_->vkCreateComputePipelines(device_, VK_NULL_HANDLE, 1, &pci, nullptr, &p);
  api_->vkDestroyShaderModule(device_, module, nullptr);
  if (r != VK_SUCCESS) return vk_error(r, "vkCreateComputePipelines", __FILE__, __LINE__).with_context(std::string(name));
  pipelines_.emplace(std::string(name), p);
  return p;
}

Status Device::submit(VkCommandBuffer cb, VkFence fence) {
  std::lock_guard lock(mu_);
  VkSubmitInfo si{VK_STRUCTURE_TYPE_SUBMIT_INFO};
  si.commandBufferCount = 1;
  si.pCommandBuffers = &cb;
  KITE_VK_CHECK(api_->vkQueueSubmit(queue_, 1, &si, fence));
  return ok_status();
}

}  // namespace kite::vk

// The Vulkan Backend: compute() records every node's dispatches into one command buffer (a
// barrier between dispatches) and submits it; synchronize() waits for its fence.
#include "backends/vulkan/vulkan_backend.h"

#include <algorithm>
#include <cstring>

#include "backends/vulkan/device.h"
#include "backends/vulkan/stream.h"
#include "src/core/profile.h"

namespace kite::vk {

namespace {

constexpr uint32_t kMaxGroupsX = 65535;  // Vulkan's guaranteed maxComputeWorkGroupCount

class VulkanBuffer final : public Buffer {
 public:
  VulkanBuffer(Backend& backend, std::unique_ptr<Allocation> mem) : backend_(backend), mem_(std::move(mem)) {}
  ~VulkanBuffer() override { static_cast<void>(backend_.synchronize()); }  // submitted work may use it
  void* base() override { return reinterpret_cast<void*>(mem_->address); }
  size_t size() const override { return mem_->bytes; }
  Backend& backend() override { return backend_; }

 private:
  Backend& backend_;
  std::unique_ptr<Allocation> mem_;
};

class VulkanBackend final : public Backend, public Stream {
 public:
  explicit VulkanBackend(std::shared_ptr<Device> dev) : dev_(std::move(dev)) {}

  ~VulkanBackend() override {
    const Api& api = dev_->api();
    if (in_flight_) api.vkWaitForFences(dev_->handle(), 1, &fence_, VK_TRUE, UINT64_MAX);
    scratch_.clear();
    dev_->release_mirrors(refs_);
    if (fence_) api.vkDestroyFence(dev_->handle(), fence_, nullptr);
    if (queries_) api.vkDestroyQueryPool(dev_->handle(), queries_, nullptr);
    if (pool_) api.vkDestroyCommandPool(dev_->handle(), pool_, nullptr);
  }

  Status init() {
    const Api& api = dev_->api();
    VkCommandPoolCreateInfo pci{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
    pci.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
    pci.queueFamilyIndex = dev_->queue_family();
    KITE_VK_CHECK(api.vkCreateCommandPool(dev_->handle(), &pci, nullptr, &pool_));
    VkCommandBufferAllocateInfo ai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
    ai.commandPool = pool_;
    ai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    ai.commandBufferCount = 1;
    KITE_VK_CHECK(api.vkAllocateCommandBuffers(dev_->handle(), &ai, &cb_));
    VkFenceCreateInfo fci{VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    KITE_VK_CHECK(api.vkCreateFence(dev_->handle(), &fci, nullptr, &fence_));
    return ok_status();
  }

  // ---- Backend ----
  std::string_view name() const override { return "vulkan"; }
  bool is_host() const override { return false; }
  bool supports(const Tensor& n) const override { return node_supported(n); }

  Result<std::unique_ptr<Buffer>> alloc(size_t bytes) override {
    KITE_ASSIGN_OR_RETURN(auto mem, dev_->alloc(bytes, "a buffer"));
    return std::unique_ptr<Buffer>(std::make_unique<VulkanBuffer>(*this, std::move(mem)));
  }

  Status upload(const Tensor& t, const void* src, size_t bytes, size_t offset) override {
    size_t off = 0;
    const Allocation* a = dev_->find(reinterpret_cast<uint64_t>(t.data), &off);
    if (a == nullptr)
      return make_error("vulkan: upload to tensor '", t.name, "', which is not in a buffer of this device");
    KITE_TRY(synchronize());  // work in flight may read these bytes
    return dev_->write(*a, off + offset, src, bytes);
  }

  Status download(const Tensor& t, void* dst, size_t bytes, size_t offset) const override {
    size_t off = 0;
    const Allocation* a = dev_->find(reinterpret_cast<uint64_t>(t.data), &off);
    if (a == nullptr) {  // a weight still in host memory
      std::memcpy(dst, static_cast<const uint8_t*>(t.data) + offset, bytes);
      return ok_status();
    }
    KITE_TRY(const_cast<VulkanBackend*>(this)->synchronize());
    return dev_->read(*a, off + offset, dst, bytes);
  }

  Status download_many(const Tensor& t, std::span<const size_t> offsets, size_t bytes, void* dst) const override {
    size_t off = 0;
    const Allocation* a = dev_->find(reinterpret_cast<uint64_t>(t.data), &off);
    if (a == nullptr) return Backend::download_many(t, offsets, bytes, dst);
    KITE_TRY(const_cast<VulkanBackend*>(this)->synchronize());
    offsets_.resize(offsets.size());
    for (size_t i = 0; i < offsets.size(); ++i) offsets_[i] = off + offsets[i];
    return dev_->read_many(*a, offsets_, bytes, dst);
  }

  Status copy(const Tensor& dst, size_t dst_offset, const Tensor& src, size_t src_offset, size_t bytes) override {
    size_t doff = 0, soff = 0;
    const Allocation* d = dev_->find(reinterpret_cast<uint64_t>(dst.data), &doff);
    const Allocation* s = dev_->find(reinterpret_cast<uint64_t>(src.data), &soff);
    if (d == nullptr || s == nullptr)
      return make_error("vulkan: copy between '", src.name, "' and '", dst.name, "' needs both in this device's buffers");
    KITE_TRY(begin());
    VkMemoryBarrier mb{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
    mb.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
    mb.dstAccessMask = VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
    const Api& api = dev_->api();
    api.vkCmdPipelineBarrier(cb_, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                             VK_PIPELINE_STAGE_TRANSFER_BIT, 0, 1, &mb, 0, nullptr, 0, nullptr);
    VkBufferCopy c{soff + src_offset, doff + dst_offset, bytes};
    api.vkCmdCopyBuffer(cb_, s->buffer, d->buffer, 1, &c);
    barrier_after(VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT);
    return end_and_submit();
  }

  Status compute(std::span<Tensor* const> nodes) override {
    KITE_TRY(begin());
    const Api& api = dev_->api();
    if (profile_ != nullptr) {  // a timestamp before the first node and after each
      KITE_TRY(reserve_queries(nodes.size() + 1));
      api.vkCmdResetQueryPool(cb_, queries_, 0, static_cast<uint32_t>(nodes.size() + 1));
      api.vkCmdWriteTimestamp(cb_, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, queries_, 0);
    }
    for (size_t i = 0; i < nodes.size(); ++i) {
      Tensor* n = nodes[i];
      if (auto st = run_node(*this, n); !st) {
        abandon();
        return st.error().with_context(std::string("vulkan: ") + op_name(n->op) + " '" + n->name + "'");
      }
      // (Written when everything before it has finished: each node's interval is its own work.)
      if (profile_ != nullptr)
        api.vkCmdWriteTimestamp(cb_, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, queries_, static_cast<uint32_t>(i + 1));
    }
    KITE_TRY(end_and_submit());
    return profile_ != nullptr ? add_profile(nodes) : ok_status();
  }

  Result<std::string> set_profile(OpProfile* p) override {
    if (p != nullptr && dev_->timestamp_bits() == 0)
      return make_error("vulkan: ", dev_->name(), "'s compute queue writes no timestamps: it cannot be profiled");
    profile_ = p;
    return std::string("each node timed by GPU timestamps after it; steps waited for at their end");
  }

  Status synchronize() override {
    if (!in_flight_) return ok_status();
    const Api& api = dev_->api();
    in_flight_ = false;
    KITE_VK_CHECK(api.vkWaitForFences(dev_->handle(), 1, &fence_, VK_TRUE, UINT64_MAX));
    KITE_VK_CHECK(api.vkResetFences(dev_->handle(), 1, &fence_));
    return ok_status();
  }

  std::optional<MemoryInfo> memory_info() const override {
    MemoryInfo m;
    m.total = dev_->memory_total();
    m.free = m.total - std::min(m.total, dev_->memory_used());
    return m;
  }

  bool is_gpu() const override { return dev_->is_gpu(); }

  bool holds_weight(const Tensor& t) const override { return dev_->has_mirror(t.data, t.nbytes()); }

  // ---- Stream ----
  Result<uint64_t> address(const Tensor* t) override {
    if (t->data == nullptr) return make_error("vulkan: tensor '", t->name, "' has no memory");
    if (dev_->is_device(t->data)) return reinterpret_cast<uint64_t>(t->data);
    const Tensor* root = t;
    while (root->op == Op::kView && root->src[0] != nullptr) root = root->src[0];
    if (root->op != Op::kNone || root->data == nullptr)
      return make_error("vulkan: tensor '", t->name, "' is in host memory but is not a weight");
    KITE_ASSIGN_OR_RETURN(uint64_t base, dev_->mirror(root, refs_));
    return base + static_cast<uint64_t>(static_cast<const uint8_t*>(t->data) - static_cast<const uint8_t*>(root->data));
  }

  Result<uint64_t> codebooks() override { return dev_->codebooks(); }

  Status dispatch(std::string_view shader, const void* push, size_t push_bytes, uint64_t groups) override {
    if (push_bytes > kMaxPush) return make_error("vulkan: ", shader, ": ", push_bytes, " bytes of push constants");
    if (groups == 0) return ok_status();
    const uint64_t gy = (groups + kMaxGroupsX - 1) / kMaxGroupsX;
    if (gy > kMaxGroupsX) return make_error("vulkan: ", shader, ": ", groups, " workgroups is too many");
    KITE_ASSIGN_OR_RETURN(VkPipeline p, dev_->pipeline(shader));
    const Api& api = dev_->api();
    api.vkCmdBindPipeline(cb_, VK_PIPELINE_BIND_POINT_COMPUTE, p);
    api.vkCmdPushConstants(cb_, dev_->layout(), VK_SHADER_STAGE_COMPUTE_BIT, 0, static_cast<uint32_t>(push_bytes), push);
    api.vkCmdDispatch(cb_, static_cast<uint32_t>(std::min<uint64_t>(groups, kMaxGroupsX)), static_cast<uint32_t>(gy), 1);
    barrier_after(VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_WRITE_BIT);
    return ok_status();
  }

  Result<uint64_t> scratch(std::string_view slot, size_t bytes) override {
    auto it = std::find_if(scratch_.begin(), scratch_.end(), [&](const auto& e) { return e.first == slot; });
    if (it == scratch_.end()) it = scratch_.emplace(scratch_.end(), std::string(slot), nullptr);
    std::unique_ptr<Allocation>& mem = it->second;
    if (mem && mem->bytes >= bytes) return mem->address;
    // The old memory may be read by dispatches already recorded in this command buffer: keep it
    // until the buffer has run.
    if (mem) retired_.push_back(std::move(mem));
    KITE_ASSIGN_OR_RETURN(mem, dev_->alloc(bytes + bytes / 4 + 256, std::string(slot) + " scratch"));
    return mem->address;
  }


 private:
  // Starts recording (after the previous command buffer has run: one in flight at a time).
  Status begin() {
    KITE_TRY(synchronize());
    retired_.clear();
    const Api& api = dev_->api();
    KITE_VK_CHECK(api.vkResetCommandBuffer(cb_, 0));
    VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
    bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
    KITE_VK_CHECK(api.vkBeginCommandBuffer(cb_, &bi));
    // Host writes (uploads into mapped memory) and earlier submissions' writes before this one.
    VkMemoryBarrier mb{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
    mb.srcAccessMask = VK_ACCESS_HOST_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT | VK_ACCESS_SHADER_WRITE_BIT;
    mb.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_READ_BIT |
                       VK_ACCESS_TRANSFER_WRITE_BIT;
    api.vkCmdPipelineBarrier(cb_, VK_PIPELINE_STAGE_HOST_BIT | VK_PIPELINE_STAGE_ALL_COMMANDS_BIT,
                             VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT, 0, 1, &mb, 0,
                             nullptr, 0, nullptr);
    return ok_status();
  }

  void barrier_after(VkPipelineStageFlags stage, VkAccessFlags access) {
    VkMemoryBarrier mb{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
    mb.srcAccessMask = access;
    mb.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_READ_BIT |
                       VK_ACCESS_TRANSFER_WRITE_BIT | VK_ACCESS_HOST_READ_BIT;
    dev_->api().vkCmdPipelineBarrier(cb_, stage,
                                     VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT |
                                         VK_PIPELINE_STAGE_HOST_BIT,
                                     0, 1, &mb, 0, nullptr, 0, nullptr);
  }

  Status end_and_submit() {
    KITE_VK_CHECK(dev_->api().vkEndCommandBuffer(cb_));
    KITE_TRY(dev_->submit(cb_, fence_));
    in_flight_ = true;
    return ok_status();
  }

  // Profiling: a timestamp query pool of at least `n` queries.
  Status reserve_queries(size_t n) {
    if (n <= n_queries_) return ok_status();
    const Api& api = dev_->api();
    if (queries_) api.vkDestroyQueryPool(dev_->handle(), queries_, nullptr);
    queries_ = VK_NULL_HANDLE;
    n_queries_ = 0;
    VkQueryPoolCreateInfo qi{VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO};
    qi.queryType = VK_QUERY_TYPE_TIMESTAMP;
    qi.queryCount = static_cast<uint32_t>(std::max<size_t>(n, 256));
    KITE_VK_CHECK(api.vkCreateQueryPool(dev_->handle(), &qi, nullptr, &queries_));
    n_queries_ = qi.queryCount;
    return ok_status();
  }

  // Profiling: waits for the step, then adds each node's time between its two timestamps.
  Status add_profile(std::span<Tensor* const> nodes) {
    KITE_TRY(synchronize());
    stamps_.resize(nodes.size() + 1);
    KITE_VK_CHECK(dev_->api().vkGetQueryPoolResults(dev_->handle(), queries_, 0, static_cast<uint32_t>(stamps_.size()),
                                                    stamps_.size() * sizeof(uint64_t), stamps_.data(), sizeof(uint64_t),
                                                    VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT));
    const uint64_t mask = dev_->timestamp_bits() >= 64 ? ~uint64_t{0} : (uint64_t{1} << dev_->timestamp_bits()) - 1;
    for (size_t i = 0; i < nodes.size(); ++i) {
      const uint64_t ticks = (stamps_[i + 1] - stamps_[i]) & mask;
      profile_->add(nodes.subspan(i, 1), 1e-9 * dev_->timestamp_ns() * static_cast<double>(ticks));
    }
    return ok_status();
  }

  // A recording that failed part-way is ended and dropped, not submitted.
  void abandon() {
    dev_->api().vkEndCommandBuffer(cb_);
    dev_->api().vkResetCommandBuffer(cb_, 0);
  }

  std::shared_ptr<Device> dev_;
  VkCommandPool pool_ = VK_NULL_HANDLE;
  VkCommandBuffer cb_ = VK_NULL_HANDLE;
  VkFence fence_ = VK_NULL_HANDLE;
  bool in_flight_ = false;
  MirrorHolds refs_;
  std::vector<std::pair<std::string, std::unique_ptr<Allocation>>> scratch_;
  std::vector<std::unique_ptr<Allocation>> retired_;
  mutable std::vector<size_t> offsets_;  // download_many's offsets in the allocation (reused)
  OpProfile* profile_ = nullptr;         // (set_profile)
  VkQueryPool queries_ = VK_NULL_HANDLE;  // profiling: timestamps (reserve_queries)
  size_t n_queries_ = 0;
  std::vector<uint64_t> stamps_;
};

}  // namespace

std::vector<std::string> vulkan_devices() {
  std::vector<std::string> names;
  if (auto devs = list_vulkan_devices(); devs.ok())
    for (const DeviceInfo& d : *devs) names.push_back(d.name);
  return names;
}

Result<std::unique_ptr<Backend>> make_vulkan_backend(const BackendOptions& opts) {
  KITE_ASSIGN_OR_RETURN(auto dev, Device::get(opts.device));
  auto be = std::make_unique<VulkanBackend>(std::move(dev));
  KITE_TRY(be->init());
  return std::unique_ptr<Backend>(std::move(be));
}

size_t vulkan_mirrored_bytes(int index) {
  auto dev = Device::get(index);
  return dev.ok() ? (*dev)->mirrored_bytes() : 0;
}

bool vulkan_unified_memory(int index) {
  auto dev = Device::get(index);
  return dev.ok() && (*dev)->unified();
}

}  // namespace kite::vk

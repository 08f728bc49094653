// kite/src/core/backend.h — the interface every compute backend implements.
//
// Shaped for devices whose memory is not host memory and whose execution is asynchronous:
// tensors live in Buffers the backend allocates; bytes cross with upload()/download();
// compute() may return before the work is done (synchronize() waits). The CPU backend is the
// fallback and the reference; CUDA and Vulkan register themselves the same way.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "src/base/status.h"
#include "src/core/tensor.h"

namespace kite {

class Backend;

class Buffer {
 public:
  virtual ~Buffer() = default;
  virtual void* base() = 0;  // host pointer or device address; tensors point at base + offset
  virtual size_t size() const = 0;
  virtual Backend& backend() = 0;
};

// A device's own memory, in bytes.
struct MemoryInfo {
  size_t free = 0;
  size_t total = 0;
};

class Communicator;
class OpProfile;

struct BackendOptions {
  int n_threads = 0;  // CPU: 0 = all physical cores (with a tensor-parallel group: its share of them)
  int device = 0;     // GPU index
  // Tensor parallelism: the group this backend's all_reduce nodes sum over, and its rank there
  // (the communicator must come from create_communicator for this backend and outlive it).
  Communicator* comm = nullptr;
  int rank = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;
  // True when tensors of this backend are plain host memory (the CPU).
  virtual bool is_host() const = 0;
  virtual bool supports(const Tensor& node) const = 0;
  virtual Result<std::unique_ptr<Buffer>> alloc(size_t bytes) = 0;
  // Host <-> tensor bytes (tensor's own buffer); `offset` in bytes from the tensor's start.
  virtual Status upload(const Tensor& t, const void* src, size_t bytes, size_t offset = 0) = 0;
  // download() waits for the work queued before it (its wait can be a step's only one).
  virtual Status download(const Tensor& t, void* dst, size_t bytes, size_t offset = 0) const = 0;
  // `bytes` at each of `offsets` into consecutive runs of dst, waiting once (a step's rows
  // fetched together). The default downloads them one by one.
  virtual Status download_many(const Tensor& t, std::span<const size_t> offsets, size_t bytes, void* dst) const;
  // Bytes from one tensor of this backend to another (both in its buffers), e.g. a KV block
  // copied on write. The default stages through the host; device backends copy on the device.
  virtual Status copy(const Tensor& dst, size_t dst_offset, const Tensor& src, size_t src_offset, size_t bytes);
  // Runs nodes (in order) whose inputs are ready; may be asynchronous.
  virtual Status compute(std::span<Tensor* const> nodes) = 0;
  virtual Status synchronize() { return ok_status(); }
  // The device memory left and in all; nullopt for backends that compute in host memory.
  virtual std::optional<MemoryInfo> memory_info() const { return std::nullopt; }
  // True when this device already holds a copy of host weight `t` (backends that share weight
  // copies between contexts): placement does not count it against the free memory again.
  virtual bool holds_weight(const Tensor& t) const { return false; }
  // Profiling (`kite bench --profile`, src/core/profile.h): from now on every launch's time is
  // added to `p` (nullptr stops it). Returns how this backend times its launches, for the
  // report; the default says it cannot.
  virtual Result<std::string> set_profile(OpProfile* p);
};

// The backend registry: backends add a factory at static-init time (CPU registers last and is
// the fallback). `create_backend("cpu", opts)`; "cuda:1" / "vulkan:1" name a device index
// (overriding opts.device).
using BackendFactory = std::function<Result<std::unique_ptr<Backend>>(const BackendOptions&)>;
void register_backend(std::string name, BackendFactory factory);
std::vector<std::string> backend_names();
Result<std::unique_ptr<Backend>> create_backend(std::string_view name, const BackendOptions& opts = {});

}  // namespace kite

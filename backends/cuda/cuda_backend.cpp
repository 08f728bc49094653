// The CUDA Backend: buffers are cudaMalloc'd device memory; compute() launches each node's
// kernel on the device's one stream and returns without waiting (synchronize() waits). A step
// seen twice is captured as a CUDA graph and replayed (one launch instead of one per node: a
// decode step of an 8B model is ~500 kernels, whose launches alone would cost more host time
// than the GPU needs for the step); with KITE_CUDA_GRAPHS=0 every step runs op by op.
#include "backends/cuda/cuda_backend.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "backends/cuda/device.h"
#include "backends/cuda/kernels.h"
#include "src/core/comm.h"
#include "src/core/profile.h"

namespace kite::cuda {
namespace {

std::atomic<uint64_t> g_graph_launches{0};

class CudaBuffer final : public Buffer {
 public:
  CudaBuffer(Backend& backend, Device& dev, DevicePtr p, size_t bytes)
      : backend_(backend), dev_(dev), ptr_(std::move(p)), size_(bytes) {
    dev_.register_range(ptr_.get(), size_);
  }
  ~CudaBuffer() override {
    cudaStreamSynchronize(dev_.stream());  // kernels may still read or write it
    dev_.unregister_range(ptr_.get());
  }
  void* base() override { return ptr_.get(); }
  size_t size() const override { return size_; }
  Backend& backend() override { return backend_; }

 private:
  Backend& backend_;
  Device& dev_;
  DevicePtr ptr_;
  size_t size_;
};

class CudaBackend final : public Backend {
 public:
  CudaBackend(std::unique_ptr<Device> dev, Communicator* comm, int rank)
      : dev_(std::move(dev)), comm_(comm), rank_(rank) {}

  std::string_view name() const override { return "cuda"; }
  bool is_host() const override { return false; }
  bool supports(const Tensor& n) const override {
    if (n.op == Op::kAllReduce)
      return comm_ != nullptr && n.src[0]->type == DType::F32 && n.src[0]->is_contiguous();
    return node_supported(n);
  }

  Result<std::unique_ptr<Buffer>> alloc(size_t bytes) override {
    KITE_TRY(dev_->activate());
    KITE_ASSIGN_OR_RETURN(DevicePtr p, dev_->malloc(bytes, "a buffer"));
    return std::unique_ptr<Buffer>(std::make_unique<CudaBuffer>(*this, *dev_, std::move(p), bytes));
  }

  Status upload(const Tensor& t, const void* src, size_t bytes, size_t offset) override {
    KITE_TRY(dev_->activate());
    if (!dev_->is_device(t.data))
      return make_error("cuda: upload to tensor '", t.name, "', which is not in a buffer of this device");
    return dev_->upload(static_cast<uint8_t*>(t.data) + offset, src, bytes);
  }

  Status download(const Tensor& t, void* dst, size_t bytes, size_t offset) const override {
    KITE_TRY(dev_->activate());
    if (!dev_->is_device(t.data)) {  // a weight still in host memory
      std::memcpy(dst, static_cast<const uint8_t*>(t.data) + offset, bytes);
      return ok_status();
    }
    return dev_->download(dst, static_cast<const uint8_t*>(t.data) + offset, bytes);
  }

  Status download_many(const Tensor& t, std::span<const size_t> offsets, size_t bytes, void* dst) const override {
    if (!dev_->is_device(t.data)) return Backend::download_many(t, offsets, bytes, dst);
    KITE_TRY(dev_->activate());
    srcs_.resize(offsets.size());
    for (size_t i = 0; i < offsets.size(); ++i) srcs_[i] = static_cast<const uint8_t*>(t.data) + offsets[i];
    return dev_->download_many(dst, srcs_, bytes);
  }

  Status copy(const Tensor& dst, size_t dst_offset, const Tensor& src, size_t src_offset, size_t bytes) override {
    KITE_TRY(dev_->activate());
    if (!dev_->is_device(dst.data) || !dev_->is_device(src.data))
      return make_error("cuda: copy between '", src.name, "' and '", dst.name, "' needs both in this device's buffers");
    KITE_CUDA_CHECK(cudaMemcpyAsync(static_cast<uint8_t*>(dst.data) + dst_offset,
                                    static_cast<const uint8_t*>(src.data) + src_offset, bytes,
                                    cudaMemcpyDeviceToDevice, dev_->stream()));
    return ok_status();
  }

  Status compute(std::span<Tensor* const> nodes) override {
    KITE_TRY(dev_->activate());
    if (!use_graphs_ || nodes.size() < kMinGraphNodes || profile_ != nullptr) return run_eager(nodes);
    if (comm_ != nullptr && !comm_->capturable())  // (a step with all_reduce synchronizes)
      for (const Tensor* n : nodes)
        if (n->op == Op::kAllReduce) return run_eager(nodes);
    return run_graph(nodes);
  }

  Status synchronize() override {
    KITE_TRY(dev_->activate());
    return dev_->synchronize();
  }

  bool holds_weight(const Tensor& t) const override { return dev_->has_mirror(t); }

  Result<std::string> set_profile(OpProfile* p) override {
    profile_ = p;
    return std::string(
        "each launch timed by CUDA events around it; steps run launch by launch (no CUDA graphs), each "
        "waited for at its end");
  }

  std::optional<MemoryInfo> memory_info() const override {
    if (!dev_->activate()) return std::nullopt;
    MemoryInfo m;
    if (cudaMemGetInfo(&m.free, &m.total) != cudaSuccess) {
      cudaGetLastError();
      return std::nullopt;
    }
    return m;
  }

 private:
  static constexpr size_t kMinGraphNodes = 8;  // smaller spans (op-by-op debugging) run eagerly
  static constexpr size_t kMaxGraphs = 128;

  struct EventDestroy {
    void operator()(CUevent_st* e) const { cudaEventDestroy(e); }
  };
  struct GraphExecDestroy {
    void operator()(CUgraphExec_st* g) const { cudaGraphExecDestroy(g); }
  };
  // A captured step: valid while the device's memory generation is the one it was captured in.
  struct CachedGraph {
    std::unique_ptr<CUgraphExec_st, GraphExecDestroy> exec;
    uint64_t generation = 0;
    bool seen = false;    // ran eagerly once at `generation`
    bool failed = false;  // capture failed: always eager
  };

  Status run_eager(std::span<Tensor* const> nodes) {
    scratch_.int8 = {};  // (the scratch's int8 activations were another step's tensors')
    const Fusions fuse = fusions_from_env();
    launches_.clear();
    for (size_t i = 0; i < nodes.size();) {
      if (profile_ != nullptr) KITE_TRY(record_event(2 * launches_.size()));
      Result<size_t> ran = launch(nodes.subspan(i), fuse);
      if (!ran) return ran.error();
      if (profile_ != nullptr) {
        KITE_TRY(record_event(2 * launches_.size() + 1));
        launches_.emplace_back(i, *ran);
      }
      i += *ran;
    }
    return profile_ != nullptr ? add_profile(nodes) : ok_status();
  }

  // The launch that computes nodes[0] (and the nodes after it that it fuses): how many it took.
  Result<size_t> launch(std::span<Tensor* const> nodes, const Fusions& fuse) {
    Tensor* n = nodes[0];
    if (n->op == Op::kAllReduce) {  // (tensor parallelism: the sum is queued on the stream)
      if (comm_ == nullptr) return make_error("cuda: all_reduce '", n->name, "' without a tensor-parallel group");
      KITE_ASSIGN_OR_RETURN(uint8_t * src, dev_->address(n->src[0]));
      KITE_ASSIGN_OR_RETURN(uint8_t * dst, dev_->address(n));
      KITE_CUDA_CHECK(cudaMemcpyAsync(dst, src, n->nbytes(), cudaMemcpyDeviceToDevice, dev_->stream()));
      KITE_TRY(comm_->all_reduce_sum(rank_, reinterpret_cast<float*>(dst), static_cast<size_t>(n->n_elements()),
                                     dev_->stream()));
      return size_t{1};
    }
    Result<size_t> ran = run_fused(*dev_, scratch_, nodes, fuse);
    if (!ran) return ran.error().with_context(std::string("cuda: ") + op_name(n->op) + " '" + n->name + "'");
    return ran;
  }

  // Profiling: event `i` of the step (2j before launch j, 2j + 1 after it) recorded on the stream.
  Status record_event(size_t i) {
    while (events_.size() <= i) {
      cudaEvent_t e = nullptr;
      KITE_CUDA_CHECK(cudaEventCreate(&e));
      events_.emplace_back(e);
    }
    KITE_CUDA_CHECK(cudaEventRecord(events_[i].get(), dev_->stream()));
    return ok_status();
  }

  // Profiling: waits for the step, then adds each launch's time between its two events.
  Status add_profile(std::span<Tensor* const> nodes) {
    if (launches_.empty()) return ok_status();
    KITE_CUDA_CHECK(cudaEventSynchronize(events_[2 * launches_.size() - 1].get()));
    for (size_t j = 0; j < launches_.size(); ++j) {
      float ms = 0;
      KITE_CUDA_CHECK(cudaEventElapsedTime(&ms, events_[2 * j].get(), events_[2 * j + 1].get()));
      profile_->add(nodes.subspan(launches_[j].first, launches_[j].second), 1e-3 * ms);
    }
    return ok_status();
  }

  // The identity of a step: its nodes, their shapes and every address they touch (the arena can
  // move; inputs that change per step are read from device memory, not baked in).
  static uint64_t step_key(std::span<Tensor* const> nodes) {
    uint64_t h = 1469598103934665603ull;
    auto mix = [&h](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
    mix(nodes.size());
    for (const Tensor* n : nodes) {
      mix(reinterpret_cast<uintptr_t>(n));
      mix(reinterpret_cast<uintptr_t>(n->data));
      for (int64_t e : n->ne) mix(static_cast<uint64_t>(e));
      for (const Tensor* src : n->src) mix(src != nullptr ? reinterpret_cast<uintptr_t>(src->data) : 0);
    }
    return h;
  }

  // CUDA graphs (unless KITE_CUDA_GRAPHS=0): a step's first run at a memory generation is eager
  // (it uploads weights and sizes scratch); the second is captured into a graph, instantiated
  // and launched; later runs launch the graph (one launch instead of one per node).
  Status run_graph(std::span<Tensor* const> nodes) {
    if (graphs_.size() >= kMaxGraphs) graphs_.clear();
    CachedGraph& g = graphs_[step_key(nodes)];
    const cudaStream_t s = dev_->stream();
    const uint64_t gen = dev_->generation();
    if (g.exec && g.generation == gen) {
      KITE_CUDA_CHECK(cudaGraphLaunch(g.exec.get(), s));
      g_graph_launches.fetch_add(1, std::memory_order_relaxed);
      return ok_status();
    }
    if (g.failed) return run_eager(nodes);
    if (!g.seen || g.generation != gen) {
      KITE_TRY(run_eager(nodes));
      g.exec.reset();
      g.seen = true;
      g.generation = dev_->generation();
      return ok_status();
    }
    KITE_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    scratch_.capturing = true;
    const Status run = run_eager(nodes);
    scratch_.capturing = false;
    cudaGraph_t graph = nullptr;
    const cudaError_t end = cudaStreamEndCapture(s, &graph);
    cudaGraphExec_t exec = nullptr;
    cudaError_t inst = cudaErrorUnknown;
    if (run && end == cudaSuccess && graph != nullptr && dev_->generation() == gen)
      inst = cudaGraphInstantiate(&exec, graph, 0);
    if (graph != nullptr) cudaGraphDestroy(graph);
    if (inst != cudaSuccess) {
      cudaGetLastError();
      g.failed = true;
      std::fprintf(stderr, "cuda: graph capture failed (%s); this step runs op by op\n",
                   !run ? run.error().message.c_str() : cudaGetErrorString(end != cudaSuccess ? end : inst));
      return run_eager(nodes);  // the captured work did not run
    }
    g.exec.reset(exec);
    g.generation = gen;
    KITE_CUDA_CHECK(cudaGraphLaunch(exec, s));
    g_graph_launches.fetch_add(1, std::memory_order_relaxed);
    return ok_status();
  }

  // Declared before the scratch so that it is destroyed after it (the scratch frees on it).
  std::unique_ptr<Device> dev_;
  Communicator* comm_;  // tensor parallelism: the group (its backend "cuda") and this rank
  int rank_;
  OpScratch scratch_;
  std::unordered_map<uint64_t, CachedGraph> graphs_;
  mutable std::vector<const uint8_t*> srcs_;  // download_many's device addresses (reused)
  OpProfile* profile_ = nullptr;                // (set_profile)
  std::vector<std::unique_ptr<CUevent_st, EventDestroy>> events_;  // profiling: two a launch
  std::vector<std::pair<size_t, size_t>> launches_;  // profiling: each launch's first node and count
  const bool use_graphs_ = [] {
    const char* e = std::getenv("KITE_CUDA_GRAPHS");
    return e == nullptr || std::string_view(e) != "0";
  }();
};

}  // namespace

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

uint64_t cuda_graph_launches() { return g_graph_launches.load(std::memory_order_relaxed); }

size_t cuda_mirrored_bytes(int device) { return Device::mirrored_bytes(device); }

namespace {

// The number of devices, or why there are none.
Result<int> count_devices() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return make_error("cuda: no CUDA device found (cudaGetDeviceCount: ", cudaGetErrorString(e), ")");
  }
  if (n == 0) return make_error("cuda: no CUDA device found (cudaGetDeviceCount: 0 devices)");
  return n;
}

}  // namespace

Result<std::vector<DeviceInfo>> list_cuda_devices() {
  KITE_ASSIGN_OR_RETURN(const int n, count_devices());
  int current = 0;
  KITE_CUDA_CHECK(cudaGetDevice(&current));
  std::vector<DeviceInfo> out;
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    KITE_CUDA_CHECK(cudaGetDeviceProperties(&p, i));
    DeviceInfo d;
    d.name = p.name;
    d.details = "sm_" + std::to_string(p.major) + std::to_string(p.minor) + ", " +
                std::to_string(p.multiProcessorCount) + " SMs";
    d.memory_total = p.totalGlobalMem;
    KITE_CUDA_CHECK(cudaSetDevice(i));
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) d.memory_free = free_b;
    cudaGetLastError();
    out.push_back(std::move(d));
  }
  KITE_CUDA_CHECK(cudaSetDevice(current));
  return out;
}

Result<std::unique_ptr<Backend>> make_cuda_backend(const BackendOptions& opts) {
  KITE_ASSIGN_OR_RETURN(const int n, count_devices());
  if (opts.device < 0 || opts.device >= n)
    return make_error("cuda: device ", opts.device, " does not exist (", n, " device", n == 1 ? "" : "s", ")");
  if (opts.comm != nullptr && opts.comm->backend() != "cuda")
    return make_error("cuda: a tensor-parallel group of another backend (", opts.comm->backend(), ")");
  KITE_ASSIGN_OR_RETURN(auto dev, Device::open(opts.device));
  return std::unique_ptr<Backend>(std::make_unique<CudaBackend>(std::move(dev), opts.comm, opts.rank));
}

Result<BandwidthReport> cuda_measure_bandwidth(int device, size_t bytes, int reps) {
  constexpr size_t kHostCopyBytes = size_t{64} << 20;
  const int n = cuda_device_count();
  if (n == 0) return make_error("cuda: no CUDA device found");
  if (device < 0 || device >= n) return make_error("cuda: device ", device, " does not exist");
  KITE_ASSIGN_OR_RETURN(auto dev, Device::open(device));
  BandwidthReport r;
  r.device_name = dev->name();
  size_t free_b = 0, total_b = 0;
  KITE_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  r.total_gib = static_cast<double>(total_b) / (1024.0 * 1024.0 * 1024.0);
  bytes = bytes / 256 * 256;
  reps = std::max(reps, 1);
  KITE_ASSIGN_OR_RETURN(DevicePtr src, dev->malloc(bytes, "bandwidth source"));
  KITE_ASSIGN_OR_RETURN(DevicePtr dst, dev->malloc(bytes, "bandwidth destination"));
  KITE_CUDA_CHECK(cudaMemsetAsync(src.get(), 1, bytes, dev->stream()));
  cudaEvent_t start = nullptr, stop = nullptr;
  KITE_CUDA_CHECK(cudaEventCreate(&start));
  std::unique_ptr<CUevent_st, decltype(&cudaEventDestroy)> start_guard(start, &cudaEventDestroy);
  KITE_CUDA_CHECK(cudaEventCreate(&stop));
  std::unique_ptr<CUevent_st, decltype(&cudaEventDestroy)> stop_guard(stop, &cudaEventDestroy);
  // GB/s of `moved` bytes per run of `op`: the median of `reps` runs after one to warm up.
  auto time_op = [&](auto op, double moved) -> Result<double> {
    std::vector<float> ms;
    for (int i = 0; i < reps + 1; ++i) {
      KITE_CUDA_CHECK(cudaEventRecord(start, dev->stream()));
      KITE_CUDA_CHECK(op());
      KITE_CUDA_CHECK(cudaEventRecord(stop, dev->stream()));
      KITE_CUDA_CHECK(cudaEventSynchronize(stop));
      float t = 0;
      KITE_CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
      if (i > 0) ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    return moved / (ms[ms.size() / 2] / 1e3) / 1e9;
  };
  const double both_ways = 2.0 * static_cast<double>(bytes);
  KITE_ASSIGN_OR_RETURN(r.copy_gbps, time_op([&] { return launch_copy_kernel(src.get(), dst.get(), bytes, dev->stream()); },
                                             both_ways));
  KITE_ASSIGN_OR_RETURN(r.memcpy_gbps, time_op([&] {
                          return cudaMemcpyAsync(dst.get(), src.get(), bytes, cudaMemcpyDeviceToDevice, dev->stream());
                        }, both_ways));
  // Across the bus, to and from pinned memory: what a step's logits download costs.
  r.host_bytes = std::min(bytes, kHostCopyBytes);
  void* pinned = nullptr;
  KITE_CUDA_CHECK(cudaMallocHost(&pinned, r.host_bytes));
  const HostPtr host(pinned);
  const double once = static_cast<double>(r.host_bytes);
  KITE_ASSIGN_OR_RETURN(r.d2h_gbps, time_op([&] {
                          return cudaMemcpyAsync(host.get(), src.get(), r.host_bytes, cudaMemcpyDeviceToHost,
                                                 dev->stream());
                        }, once));
  KITE_ASSIGN_OR_RETURN(r.h2d_gbps, time_op([&] {
                          return cudaMemcpyAsync(dst.get(), host.get(), r.host_bytes, cudaMemcpyHostToDevice,
                                                 dev->stream());
                        }, once));
  return r;
}

}  // namespace kite::cuda

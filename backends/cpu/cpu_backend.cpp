#include "backends/cpu/cpu_backend.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>

#include "backends/cpu/cpu_features.h"
#include "backends/cpu/one_row.h"
#include "backends/cpu/ops.h"
#include "backends/cpu/threadpool.h"
#include "src/core/comm.h"
#include "src/core/profile.h"

namespace kite::cpu {
namespace {

class HostBuffer final : public Buffer {
 public:
  HostBuffer(Backend& backend, size_t bytes) : backend_(backend), size_(bytes) {
    data_ = static_cast<uint8_t*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64 + 64));
  }
  ~HostBuffer() override { std::free(data_); }
  void* base() override { return data_; }
  size_t size() const override { return size_; }
  Backend& backend() override { return backend_; }
  bool ok() const { return data_ != nullptr; }

 private:
  Backend& backend_;
  uint8_t* data_;
  size_t size_;
};

using Kernel = void (*)(Tensor*, const KernelCtx&);

Kernel kernel_for(Op op) {
  switch (op) {
    case Op::kGetRows: return op_get_rows;
    case Op::kMulMat: return op_mul_mat;
    case Op::kAdd: return op_add;
    case Op::kMul: return op_mul;
    case Op::kScale: return op_scale;
    case Op::kRmsNorm: return op_rms_norm;
    case Op::kRope: return op_rope;
    case Op::kSwiglu: return op_swiglu;
    case Op::kGeglu: return op_geglu;
    case Op::kKvWrite: return op_kv_write;
    case Op::kAttention: return op_attention;
    case Op::kCopy: return op_copy;
    case Op::kTopK: return op_top_k;
    case Op::kMulMatId: return op_mul_mat_id;
    case Op::kMoeSum: return op_moe_sum;
    case Op::kAllReduce:  // (run by the backend itself, on the calling thread)
    case Op::kNone:
    case Op::kView: return nullptr;
  }
  return nullptr;
}

bool computable(DType t) {
  const quant::TypeTraits* tr = quant::find_traits(t);
  return t == DType::F32 || t == DType::F16 || t == DType::BF16 || (tr != nullptr && tr->dequantize != nullptr);
}

// KV cache types: F32, F16, BF16, and Q8_0 when `n` (a row or a head) is whole blocks.
bool kv_type_ok(DType t, int64_t n) {
  return t == DType::F32 || t == DType::F16 || t == DType::BF16 || (t == DType::Q8_0 && n % 32 == 0);
}

class CpuBackend final : public Backend {
 public:
  CpuBackend(int n_threads, Communicator* comm, int rank)
      : pool_(n_threads), scratch_(static_cast<size_t>(pool_.size())), barrier_(pool_.size()), comm_(comm),
        rank_(rank), one_row_(pool_.size()) {}

  std::string_view name() const override { return "cpu"; }
  bool is_host() const override { return true; }

  bool supports(const Tensor& n) const override {
    if (n.op == Op::kNone || n.op == Op::kView) return true;
    if (n.op == Op::kAllReduce) return comm_ != nullptr && n.src[0]->type == DType::F32;
    if (kernel_for(n.op) == nullptr) return false;
    if (n.op == Op::kMulMat || n.op == Op::kMulMatId || n.op == Op::kGetRows || n.op == Op::kCopy)
      return computable(n.src[0]->type);
    if (n.op == Op::kKvWrite) return kv_type_ok(n.src[0]->type, n.src[0]->ne[0]);
    if (n.op == Op::kTopK) return n.src[0]->type == DType::F32 && n.src[0]->nb[0] == sizeof(float);
    if (n.op == Op::kAttention)  // Q8_0 needs whole blocks per head
      return kv_type_ok(n.src[1]->type, n.src[0]->ne[0]) && kv_type_ok(n.src[2]->type, n.src[0]->ne[0]);
    return true;
  }

  Result<std::unique_ptr<Buffer>> alloc(size_t bytes) override {
    auto b = std::make_unique<HostBuffer>(*this, bytes);
    if (!b->ok()) return make_error("cpu: out of memory allocating ", bytes, " bytes");
    return std::unique_ptr<Buffer>(std::move(b));
  }

  Status upload(const Tensor& t, const void* src, size_t bytes, size_t offset) override {
    std::memcpy(static_cast<uint8_t*>(t.data) + offset, src, bytes);
    return ok_status();
  }
  Status download(const Tensor& t, void* dst, size_t bytes, size_t offset) const override {
    std::memcpy(dst, static_cast<const uint8_t*>(t.data) + offset, bytes);
    return ok_status();
  }
  Status copy(const Tensor& dst, size_t dst_offset, const Tensor& src, size_t src_offset, size_t bytes) override {
    std::memmove(static_cast<uint8_t*>(dst.data) + dst_offset, static_cast<const uint8_t*>(src.data) + src_offset, bytes);
    return ok_status();
  }

  Status compute(std::span<Tensor* const> nodes) override {
    one_row_.prepare(nodes, [&](Tensor* n, OneRowWay way) {
      const auto t0 = std::chrono::steady_clock::now();
      run(n, op_mul_mat, way);
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    });
    using Clock = std::chrono::steady_clock;
    for (Tensor* const& n : nodes) {
      const Kernel k = kernel_for(n->op);
      if (k == nullptr && n->op != Op::kAllReduce) continue;  // views: nothing to compute
      const Clock::time_point t0 = profile_ != nullptr ? Clock::now() : Clock::time_point{};
      if (n->op == Op::kAllReduce) KITE_TRY(all_reduce(n));
      else run(n, k, n->op == Op::kMulMat ? one_row_.way(n) : OneRowWay::kRows);
      if (profile_ != nullptr)
        profile_->add(std::span<Tensor* const>(&n, 1), std::chrono::duration<double>(Clock::now() - t0).count());
    }
    return ok_status();
  }

  Result<std::string> set_profile(OpProfile* p) override {
    profile_ = p;
    return "each node timed by the host clock around its run on " + std::to_string(pool_.size()) + " thread" +
           (pool_.size() == 1 ? "" : "s");
  }

 private:
  void run(Tensor* n, Kernel k, OneRowWay way) {
    const size_t shared_bytes = op_shared_bytes(n, way);
    if (shared_.size() < shared_bytes) shared_.resize(shared_bytes);
    counter_.store(0, std::memory_order_relaxed);
    if (pool_.size() > 1 && solo(*n)) {
      KernelCtx c{0, 1, &scratch_[0], &shared_, &solo_barrier_, &counter_, way};
      k(n, c);
      return;
    }
    pool_.run([&](int ith, int nth) {
      KernelCtx c{ith, nth, &scratch_[static_cast<size_t>(ith)], &shared_, &barrier_, &counter_, way};
      k(n, c);
    });
  }

  // Whether `n` is so little work that handing it to the pool's threads (a wake-up and a wait
  // for the last, ~1.5 us at 2 threads) costs more than the calling thread doing it all: ops
  // whose rows are independent (the same bits on any number of threads) touching under
  // kSoloBytes. (A tiny model's decode step is mostly such nodes.)
  static bool solo(const Tensor& n) {
    constexpr size_t kSoloBytes = 32 << 10;
    size_t bytes = 0;
    switch (n.op) {
      case Op::kAdd:
      case Op::kMul:
      case Op::kScale:
      case Op::kRmsNorm:
      case Op::kRope:
      case Op::kSwiglu:
      case Op::kGeglu:
      case Op::kCopy:
      case Op::kGetRows: bytes = 3 * n.nbytes(); break;
      case Op::kKvWrite: bytes = 2 * n.src[1]->nbytes(); break;
      case Op::kMulMat: bytes = n.src[0]->nbytes() + n.src[1]->nbytes(); break;
      default: return false;
    }
    return bytes < kSoloBytes;
  }

  // dst = src, then summed in place with the other ranks' (which wait for this one).
  Status all_reduce(Tensor* n) {
    if (comm_ == nullptr) return make_error("cpu: all_reduce without a tensor-parallel group");
    const Tensor* a = n->src[0];
    auto* dst = static_cast<float*>(n->data);
    const int64_t ne0 = a->ne[0];
    for (int64_t r = 0; r < a->n_rows(); ++r) {
      const int64_t i1 = r % a->ne[1], i2 = (r / a->ne[1]) % a->ne[2], i3 = r / (a->ne[1] * a->ne[2]);
      std::memcpy(dst + r * ne0, static_cast<const uint8_t*>(a->data) + i1 * a->nb[1] + i2 * a->nb[2] + i3 * a->nb[3],
                  static_cast<size_t>(ne0) * sizeof(float));
    }
    return comm_->all_reduce_sum(rank_, dst, static_cast<size_t>(n->n_elements()), nullptr);
  }

  ThreadPool pool_;
  std::vector<std::vector<float>> scratch_;
  std::vector<uint8_t> shared_;  // op-wide scratch (quantized activations); grows, never shrinks
  Barrier barrier_;
  Barrier solo_barrier_{1};  // (ops run on the calling thread alone: solo())
  std::atomic<int64_t> counter_{0};
  Communicator* comm_;
  int rank_;
  OneRowTuner one_row_;  // which way one-row mul_mats take (one_row.h)
  OpProfile* profile_ = nullptr;  // (set_profile)
};

#if defined(__x86_64__)
constexpr const char* kArchName = "x86-64 CPU";
#elif defined(__aarch64__)
constexpr const char* kArchName = "aarch64 CPU";
#else
constexpr const char* kArchName = "CPU";
#endif

}  // namespace

Result<std::unique_ptr<Backend>> make_cpu_backend(const BackendOptions& opts) {
  int n = opts.n_threads > 0 ? opts.n_threads : ThreadPool::physical_cores();
  if (opts.comm != nullptr) {
    if (opts.n_threads <= 0) n = std::max(1, n / opts.comm->world());  // the group's ranks share the cores
    if (opts.comm->backend() != "cpu")
      return make_error("cpu: a tensor-parallel group of another backend (", opts.comm->backend(), ")");
    if (opts.rank < 0 || opts.rank >= opts.comm->world())
      return make_error("cpu: rank ", opts.rank, " outside a tensor-parallel group of ", opts.comm->world());
  }
  return std::unique_ptr<Backend>(std::make_unique<CpuBackend>(n, opts.comm, opts.rank));
}

Result<std::vector<DeviceInfo>> list_cpu_devices() {
  DeviceInfo d;
  // /proc/cpuinfo's "model name" (x86) or "Model" (some aarch64 boards); else the architecture.
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; d.name.empty() && std::getline(cpuinfo, line);)
    if (line.rfind("model name", 0) == 0 || line.rfind("Model", 0) == 0)
      if (const size_t colon = line.find(':'); colon != std::string::npos && colon + 2 <= line.size())
        d.name = line.substr(colon + 2);
  if (d.name.empty()) d.name = kArchName;
  d.details = std::to_string(ThreadPool::physical_cores()) + " physical cores, " +
              std::to_string(std::max(1u, std::thread::hardware_concurrency())) + " logical, kernels " +
              simd_level_name(best_simd_level());
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  if (pages > 0 && page > 0) d.memory_total = static_cast<size_t>(pages) * static_cast<size_t>(page);
  std::ifstream meminfo("/proc/meminfo");
  for (std::string key; meminfo >> key;) {
    size_t kib = 0;
    meminfo >> kib;
    if (key == "MemAvailable:") {
      d.memory_free = kib * 1024;
      break;
    }
    meminfo.ignore(256, '\n');
  }
  return std::vector<DeviceInfo>{d};
}

}  // namespace kite::cpu

#include "backends/cuda/device.h"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "backends/cuda/kernels.h"

namespace kite::cuda {
namespace {

constexpr size_t kStagingBytes = size_t{16} << 20;  // pinned host staging for upload/download
constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kLogEvery = size_t{1} << 30;       // weight upload progress, every GiB

// The lowest compute capability of the devices opened so far.
std::atomic<int> g_min_cc{INT_MAX};
const bool g_pdl_allowed = [] {
  const char* e = std::getenv("KITE_CUDA_PDL");
  return e == nullptr || std::string_view(e) != "0";
}();

}  // namespace

void note_compute_capability(int cc) {
  int cur = g_min_cc.load();
  while (cc < cur && !g_min_cc.compare_exchange_weak(cur, cc)) {
  }
}

bool programmatic_launch() {
  const int cc = g_min_cc.load(std::memory_order_relaxed);
  return g_pdl_allowed && cc >= 90 && cc != INT_MAX;
}

Error cuda_error(cudaError_t e, const char* call, const char* file, int line) {
  return make_error("cuda: ", call, " failed: ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ") at ", file, ":",
                    line);
}

Error cublas_error(cublasStatus_t e, const char* call, const char* file, int line) {
  auto api = cublas_api();
  if (!api.ok()) return make_error("cuda: ", call, " failed: cuBLAS status ", static_cast<int>(e), " at ", file, ":", line);
  return make_error("cuda: ", call, " failed: ", (*api)->status_name(e), " (", (*api)->status_string(e), ") at ", file,
                    ":", line);
}

std::shared_ptr<Device::SharedMirrors> Device::shared_mirrors(int index) {
  static std::mutex mu;
  static std::map<int, std::weak_ptr<SharedMirrors>> all;
  std::lock_guard lock(mu);
  auto m = all[index].lock();
  if (!m) all[index] = m = std::make_shared<SharedMirrors>();
  return m;
}

size_t Device::mirrored_bytes(int index) {
  auto m = shared_mirrors(index);
  std::lock_guard lock(m->mu);
  return m->mirrors.bytes();
}

Result<std::unique_ptr<Device>> Device::open(int index) {
  std::unique_ptr<Device> d(new Device());
  d->index_ = index;
  d->mirrors_ = shared_mirrors(index);
  KITE_CUDA_CHECK(cudaSetDevice(index));
  cudaDeviceProp prop{};
  KITE_CUDA_CHECK(cudaGetDeviceProperties(&prop, index));
  d->name_ = prop.name;
  d->sm_count_ = std::max(1, prop.multiProcessorCount);
  d->cc_ = 10 * prop.major + prop.minor;
  d->l2_bytes_ = static_cast<size_t>(std::max(0, prop.l2CacheSize));
  note_compute_capability(d->cc_);
  cudaStream_t s = nullptr;
  KITE_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  d->stream_.reset(s);
  void* staging = nullptr;
  KITE_CUDA_CHECK(cudaMallocHost(&staging, kStagingBytes));
  d->staging_.reset(staging);
  d->staging_bytes_ = kStagingBytes;
  return d;
}

Device::~Device() {
  // Work still queued must finish before the memory it uses goes away.
  if (stream_) cudaStreamSynchronize(stream_.get());
  if (mirrors_) {
    cudaSetDevice(index_);
    std::lock_guard lock(mirrors_->mu);
    mirrors_->mirrors.release(holds_);
  }
}

Result<cublasHandle_t> Device::cublas() {
  if (!cublas_) {
    KITE_ASSIGN_OR_RETURN(blas_, cublas_api());
    cublasHandle_t h = nullptr;
    KITE_CUBLAS_CHECK(blas_->create(&h));
    cublas_.reset(h);
    KITE_CUBLAS_CHECK(blas_->set_stream(h, stream()));
  }
  return cublas_.get();
}

Status Device::activate() const {
  KITE_CUDA_CHECK(cudaSetDevice(index_));
  return ok_status();
}

Result<DevicePtr> Device::malloc(size_t bytes, std::string_view what) {
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes == 0 ? 1 : bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear the (non-sticky) allocation error
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    return make_error("cuda: out of device memory allocating ", bytes / kMiB, " MiB for ", what, " on ", name_,
                      " (", free_b / kMiB, " MiB free of ", total_b / kMiB, " MiB; ", cudaGetErrorString(e), ")");
  }
  return DevicePtr(p);
}

bool Device::is_device(const void* p) const {
  const auto a = reinterpret_cast<uintptr_t>(p);
  auto it = ranges_.upper_bound(a);
  if (it == ranges_.begin()) return false;
  --it;
  return a < it->first + it->second;
}

Result<uint8_t*> Device::mirror(const Tensor* root) {
  std::lock_guard lock(mirrors_->mu);
  // A synchronous copy: the mirror is complete before any stream (this backend's or another
  // context's) can use it.
  auto upload = [&](size_t bytes) -> Result<DevicePtr> {
    KITE_ASSIGN_OR_RETURN(DevicePtr p, malloc(bytes, "weight '" + root->name + "'"));
    KITE_CUDA_CHECK(cudaMemcpy(p.get(), root->data, bytes, cudaMemcpyHostToDevice));
    const size_t before = mirrors_->mirrors.bytes();
    if ((before + bytes) / kLogEvery != before / kLogEvery)
      std::fprintf(stderr, "cuda: %zu MiB of weights uploaded to %s\n", (before + bytes) / kMiB, name_.c_str());
    return p;
  };
  bool newly_held = false;
  KITE_ASSIGN_OR_RETURN(const DevicePtr* p, mirrors_->mirrors.acquire(root->data, root->nbytes(), holds_, upload,
                                                                      &newly_held));
  if (newly_held) ++generation_;  // a captured graph of this backend cannot hold this address yet
  return static_cast<uint8_t*>(p->get());
}

bool Device::has_mirror(const Tensor& t) const {
  std::lock_guard lock(mirrors_->mu);
  return mirrors_->mirrors.has(t.data, t.nbytes());
}

Result<uint8_t*> Device::address(const Tensor* t) {
  if (t->data == nullptr) return make_error("cuda: tensor '", t->name, "' has no memory");
  if (is_device(t->data)) return static_cast<uint8_t*>(t->data);
  const Tensor* root = t;
  while (root->op == Op::kView && root->src[0] != nullptr) root = root->src[0];
  if (root->op != Op::kNone || root->data == nullptr)
    return make_error("cuda: tensor '", t->name, "' is in host memory but is not a weight");
  KITE_ASSIGN_OR_RETURN(uint8_t * base, mirror(root));
  return base + (static_cast<const uint8_t*>(t->data) - static_cast<const uint8_t*>(root->data));
}

Result<void*> Device::scratch(Scratch& s, size_t bytes, std::string_view what) {
  if (s.bytes >= bytes && s.ptr) return s.ptr.get();
  if (s.ptr) KITE_CUDA_CHECK(cudaStreamSynchronize(stream()));  // queued kernels may use it
  s.ptr.reset();
  s.bytes = 0;
  ++generation_;
  const size_t want = bytes + bytes / 4 + 256;  // headroom for the next, slightly larger shape
  KITE_ASSIGN_OR_RETURN(s.ptr, malloc(want, std::string(what) + " scratch"));
  s.bytes = want;
  return s.ptr.get();
}

Status Device::release(Scratch& s) {
  if (!s.ptr) return ok_status();
  KITE_CUDA_CHECK(cudaStreamSynchronize(stream()));
  s.ptr.reset();
  s.bytes = 0;
  ++generation_;
  return ok_status();
}

Status Device::upload(void* dst, const void* src, size_t bytes) {
  auto* d = static_cast<uint8_t*>(dst);
  const auto* h = static_cast<const uint8_t*>(src);
  while (bytes > 0) {
    if (staging_used_ == staging_bytes_) KITE_TRY(synchronize());  // staging full: wait for its copies
    const size_t n = std::min(bytes, staging_bytes_ - staging_used_);
    uint8_t* st = static_cast<uint8_t*>(staging_.get()) + staging_used_;
    std::memcpy(st, h, n);
    KITE_CUDA_CHECK(cudaMemcpyAsync(d, st, n, cudaMemcpyHostToDevice, stream()));
    staging_used_ = std::min(staging_bytes_, staging_used_ + (n + 255) / 256 * 256);  // keep copies aligned
    d += n, h += n, bytes -= n;
  }
  return ok_status();
}

Status Device::download(void* dst, const void* src, size_t bytes) {
  auto* h = static_cast<uint8_t*>(dst);
  const auto* d = static_cast<const uint8_t*>(src);
  // One wait per staging-sized chunk: the copy into staging is ordered after the step's kernels
  // and after the uploads still reading staging (one stream), and once it is done, so are they.
  while (bytes > 0) {
    const size_t n = std::min(bytes, staging_bytes_);
    KITE_CUDA_CHECK(cudaMemcpyAsync(staging_.get(), d, n, cudaMemcpyDeviceToHost, stream()));
    KITE_TRY(synchronize());
    std::memcpy(h, staging_.get(), n);
    d += n, h += n, bytes -= n;
  }
  return ok_status();
}

Status Device::download_many(void* dst, std::span<const uint8_t* const> srcs, size_t bytes) {
  auto* h = static_cast<uint8_t*>(dst);
  const size_t per = bytes == 0 ? 0 : staging_bytes_ / bytes;  // runs a staging-full holds
  if (per == 0) {  // (a run larger than staging)
    for (size_t i = 0; i < srcs.size(); ++i) KITE_TRY(download(h + i * bytes, srcs[i], bytes));
    return ok_status();
  }
  for (size_t first = 0; first < srcs.size(); first += per) {
    const size_t n = std::min(per, srcs.size() - first);
    auto* st = static_cast<uint8_t*>(staging_.get());
    for (size_t i = 0; i < n; ++i)
      KITE_CUDA_CHECK(cudaMemcpyAsync(st + i * bytes, srcs[first + i], bytes, cudaMemcpyDeviceToHost, stream()));
    KITE_TRY(synchronize());
    std::memcpy(h + first * bytes, st, n * bytes);
  }
  return ok_status();
}

Status Device::synchronize() {
  KITE_CUDA_CHECK(cudaStreamSynchronize(stream()));
  staging_used_ = 0;
  return ok_status();
}

}  // namespace kite::cuda

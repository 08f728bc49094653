// kite/backends/cuda/device.h — one CUDA device as the backend sees it: its stream and cuBLAS
// handle, the ranges of its buffers (to tell device addresses from host pointers), the device
// mirrors of host-resident weights, grow-only scratch buffers, and the checked-call macros.
// Internal to backends/cuda (host C++; includes the CUDA runtime headers).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>

#include "backends/cuda/cublas_api.h"
#include "src/base/status.h"
#include "src/core/tensor.h"
#include "src/core/weight_mirrors.h"

namespace kite::cuda {

// The error of a failed CUDA runtime call: the call, CUDA's name and text, and the source line.
Error cuda_error(cudaError_t e, const char* call, const char* file, int line);
Error cublas_error(cublasStatus_t e, const char* call, const char* file, int line);

#define KITE_CUDA_CHECK(call)                                                                 \
  do {                                                                                        \
    const cudaError_t kite_cuda_e_ = (call);                                                  \
    if (kite_cuda_e_ != cudaSuccess) return ::kite::cuda::cuda_error(kite_cuda_e_, #call, __FILE__, __LINE__); \
  } while (0)

#define KITE_CUBLAS_CHECK(call)                                                                     \
  do {                                                                                              \
    const cublasStatus_t kite_cublas_e_ = (call);                                                   \
    if (kite_cublas_e_ != CUBLAS_STATUS_SUCCESS)                                                    \
      return ::kite::cuda::cublas_error(kite_cublas_e_, #call, __FILE__, __LINE__);                  \
  } while (0)

struct DeviceFree {
  void operator()(void* p) const { cudaFree(p); }
};
struct HostFree {
  void operator()(void* p) const { cudaFreeHost(p); }
};
struct StreamDestroy {
  void operator()(CUstream_st* s) const { cudaStreamDestroy(s); }
};
struct CublasDestroy {
  void operator()(cublasContext* h) const {
    if (auto api = cublas_api(); api.ok()) (*api)->destroy(h);  // a handle exists only if it loaded
  }
};
using DevicePtr = std::unique_ptr<void, DeviceFree>;
using HostPtr = std::unique_ptr<void, HostFree>;

// Device memory that only grows (scratch reused by every step after the first).
struct Scratch {
  DevicePtr ptr;
  size_t bytes = 0;
};

class Device {
 public:
  static Result<std::unique_ptr<Device>> open(int index);
  // Bytes of host weights mirrored on GPU `index` now (shared by all its Devices).
  static size_t mirrored_bytes(int index);
  ~Device();

  int index() const { return index_; }
  const std::string& name() const { return name_; }
  int sm_count() const { return sm_count_; }
  // Compute capability as 10 * major + minor (90 for an H100/H200).
  int compute_capability() const { return cc_; }
  size_t l2_bytes() const { return l2_bytes_; }  // the L2 cache
  cudaStream_t stream() const { return stream_.get(); }
  // The cuBLAS handle, created on first use (most steps never call cuBLAS; creating one costs
  // tens of milliseconds and memory), and the library's entry points (cublas_api.h).
  Result<cublasHandle_t> cublas();
  const CublasApi& blas() const { return *blas_; }  // valid once cublas() succeeded
  // Makes this device current on the calling thread.
  Status activate() const;

  // cudaMalloc'd memory, registered as a range of this device (out of memory: an error).
  Result<DevicePtr> malloc(size_t bytes, std::string_view what);
  void register_range(const void* p, size_t bytes) { ranges_[reinterpret_cast<uintptr_t>(p)] = bytes; }
  void unregister_range(const void* p) { ranges_.erase(reinterpret_cast<uintptr_t>(p)); }
  bool is_device(const void* p) const;

  // The device address of a tensor's bytes: its own (a buffer of this device) or, for host
  // memory (a weight in the file mapping), the device mirror of its root leaf, uploaded on
  // first use by any backend on this GPU and shared by all (src/core/weight_mirrors.h).
  Result<uint8_t*> address(const Tensor* t);
  // At least `bytes` of scratch `s` (grows; shrinks only by release).
  Result<void*> scratch(Scratch& s, size_t bytes, std::string_view what);
  // Frees scratch `s` once the stream's queued work is done (the next scratch() allocates anew).
  Status release(Scratch& s);

  // Host <-> device through the pinned staging buffer.
  Status upload(void* dst, const void* src, size_t bytes);
  Status download(void* dst, const void* src, size_t bytes);
  // `bytes` from each of `srcs` into consecutive runs of dst: one wait per staging-full.
  Status download_many(void* dst, std::span<const uint8_t* const> srcs, size_t bytes);
  Status synchronize();

  // Whether host weight `t` has a mirror on this GPU (this backend's or another's).
  bool has_mirror(const Tensor& t) const;
  // Bumped whenever a mirror or scratch buffer is (re)allocated or freed: device addresses that a
  // captured CUDA graph holds are valid only for the generation it was captured in.
  uint64_t generation() const { return generation_; }

 private:
  Device() = default;
  Result<uint8_t*> mirror(const Tensor* root);

  // The weight mirrors of one GPU, shared by its Devices (one per backend).
  struct SharedMirrors {
    std::mutex mu;
    WeightMirrors<DevicePtr> mirrors;
  };
  static std::shared_ptr<SharedMirrors> shared_mirrors(int index);

  int index_ = 0;
  std::string name_;
  int sm_count_ = 1;
  int cc_ = 0;
  size_t l2_bytes_ = 0;
  std::unique_ptr<CUstream_st, StreamDestroy> stream_;
  std::unique_ptr<cublasContext, CublasDestroy> cublas_;
  const CublasApi* blas_ = nullptr;
  std::map<uintptr_t, size_t> ranges_;  // device allocations: base -> bytes
  std::shared_ptr<SharedMirrors> mirrors_;
  MirrorHolds holds_;  // the mirrors this backend uses
  uint64_t generation_ = 0;
  HostPtr staging_;
  size_t staging_bytes_ = 0;
  size_t staging_used_ = 0;  // bytes handed to in-flight copies since the last synchronize
};

// Per-op execution (ops.cpp): whether the kernels cover a node, and launching one.
bool node_supported(const Tensor& n);

// Int8 activations in scratch: launch_quantize_act's codes and scales of tensor `of` (none: null).
struct Int8Activations {
  const Tensor* of = nullptr;
  int8_t* q = nullptr;
  float* ds = nullptr;
};

struct OpScratch {
  Scratch x;      // activations made contiguous
  Scratch q;      // int8 activations
  Scratch ds;     // their block scales
  Scratch xh;     // F16 activations for cuBLAS
  Scratch w;      // dequantized weight chunk for cuBLAS
  Scratch part;   // attention partials
  Scratch split;  // mmq's split-k partial sums
  Scratch q2;     // a second pair for int8 activations that a launch writes while it reads
  Scratch ds2;    //   those of q and ds (the gate/up launch's swiglu output)
  Scratch count;  // counters, kept zeroed: that launch's 32-row stretches (MatVecJob::glu_count),
                  //   attention's split rows (AttentionArgs::count)
  // What q and ds (or q2 and ds2) hold: a matmul with the same input reuses them. Valid within
  // one compute() call (tensors are a step's), so the backend clears it when one starts, and
  // whenever one of those buffers is reallocated.
  Int8Activations int8;
  // Set while the backend captures a CUDA graph: nothing may wait on the stream, so a matmul
  // shape not yet timed (ops_matmul.cpp: mmq or cuBLAS) takes the default way untimed.
  bool capturing = false;
};
Status run_node(Device& dev, OpScratch& scratch, Tensor* n);
// Which fusions a step runs, read from the environment once per step (so tests can compare):
// KITE_CUDA_FUSE=0 turns them all off; KITE_CUDA_NORM_TAIL=0 leaves the norm after a residual
// add to its own launch.
struct Fusions {
  bool on = true;
  bool norm_tail = true;
  bool rope_tail = true;
};
Fusions fusions_from_env();
// Runs nodes[0], and with it, when `fuse.on`, the nodes after it that the same launches can
// compute: an rms_norm, or an attention of decode rows, that also quantizes its rows for the
// int8 matmuls after it (which then share them); matmuls of one input on the mat-vec kernels
// (up to kMaxMatVecOuts weights of one type), with the swiglu of a gate/up pair (and its int8
// activations), or one with the residual add after it (and for a single column, the next
// block's rms_norm of the sum, with its int8 activations, unless !fuse.norm_tail), or a layer's
// q, k and v of a single column with their ropes and cache writes (float caches, llama's
// adjacent pairs; unless !fuse.rope_tail); two ropes, with the two kv_writes of their layer
// where the caches are float; two kv_writes; two rms_norms of rows of one length (qwen3's
// q_norm and k_norm); attention, merging its split decode rows itself. Every node's result is
// still written.
// Returns how many ran.
Result<size_t> run_fused(Device& dev, OpScratch& scratch, std::span<Tensor* const> nodes, const Fusions& fuse);

}  // namespace kite::cuda

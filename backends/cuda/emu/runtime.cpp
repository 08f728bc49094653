// The CUDA runtime on the CPU (runtime.h): memory, streams as queues of work run at
// synchronization points, events, graph capture. Kernels run in scheduler.cpp.
#include "backends/cuda/emu/runtime.h"

#include "backends/cuda/emu/internal.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

struct CUstream_st;

struct CUgraph_st {
  std::vector<std::function<void()>> ops;
  bool invalidated = false;
};

struct CUgraphExec_st {
  std::vector<std::function<void()>> ops;
};

struct CUstream_st {
  std::mutex mu;
  std::vector<std::function<void()>> queue;
  CUgraph_st* capture = nullptr;  // being captured into
};

struct CUevent_st {
  CUstream_st* stream = nullptr;
  bool recorded = false;
  std::chrono::steady_clock::time_point at;
};

namespace kite::cuda::emu {

namespace detail {
std::mutex g_exec_mu;
std::atomic<uint64_t> g_launches{0};
}  // namespace detail
using detail::fail;
using detail::flush_all;
using detail::g_exec_mu;
using detail::kMaxDynamicShared;

namespace {

constexpr size_t kMiB = size_t{1} << 20;

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::atoi(v) : fallback;
}

// ---- errors -------------------------------------------------------------------------------
thread_local cudaError_t t_last_error = cudaSuccess;
std::mutex g_sticky_mu;
cudaError_t g_sticky = cudaSuccess;  // a kernel failure: every later synchronization reports it

cudaError_t sticky() {
  std::lock_guard lock(g_sticky_mu);
  return g_sticky;
}

// What the program asked of the runtime (counters(): tests of what a step does).
std::atomic<uint64_t> g_mallocs{0}, g_frees{0}, g_host_waits{0}, g_graph_launches{0}, g_uploads{0};

// ---- memory -------------------------------------------------------------------------------
struct Memory {
  std::mutex mu;
  std::map<uintptr_t, size_t> device;  // cudaMalloc: base -> bytes
  std::set<uintptr_t> pinned;          // cudaMallocHost bases
  std::map<uintptr_t, size_t> pinned_size;
  size_t used = 0;
};
Memory& memory() {
  static Memory m;
  return m;
}

// Device memory: KITE_CUDA_EMU_MEMORY_MB (default 16 GiB), to test what happens when it runs out.
size_t total_memory() { return static_cast<size_t>(std::max(env_int("KITE_CUDA_EMU_MEMORY_MB", 16384), 1)) * kMiB; }

bool in_map(const std::map<uintptr_t, size_t>& m, const void* p, size_t bytes) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  auto it = m.upper_bound(a);
  if (it == m.begin()) return false;
  --it;
  return a >= it->first && a + bytes <= it->first + it->second;
}

bool is_pinned_range(const void* p, size_t bytes) {
  Memory& m = memory();
  std::lock_guard lock(m.mu);
  return in_map(m.pinned_size, p, bytes);
}

// ---- streams ------------------------------------------------------------------------------
std::mutex g_streams_mu;
std::set<CUstream_st*> g_streams;

CUstream_st* legacy_stream() {
  static CUstream_st* s = [] {
    auto* st = new CUstream_st();
    std::lock_guard lock(g_streams_mu);
    g_streams.insert(st);
    return st;
  }();
  return s;
}

CUstream_st* resolve(cudaStream_t s) { return s != nullptr ? s : legacy_stream(); }

// Runs the stream's queued work (a synchronization point).
void flush(CUstream_st* s) {
  std::lock_guard lock(s->mu);
  std::vector<std::function<void()>> work;
  work.swap(s->queue);
  std::lock_guard exec(g_exec_mu);
  for (auto& w : work) {
    if (sticky() != cudaSuccess) break;  // after a kernel failure nothing more runs, as on a GPU
    w();
  }
}

}  // namespace

cudaError_t detail::fail(cudaError_t e) {
  t_last_error = e;
  return e;
}

void detail::flush_all() {
  std::vector<CUstream_st*> all;
  {
    std::lock_guard lock(g_streams_mu);
    all.assign(g_streams.begin(), g_streams.end());
  }
  for (CUstream_st* s : all) flush(s);
}

Counters counters() {
  return Counters{g_mallocs.load(), g_frees.load(), g_host_waits.load(), detail::g_launches.load(),
                  g_graph_launches.load(), g_uploads.load()};
}

// ---- what the launcher and cuBLAS use -----------------------------------------------------
cudaError_t enqueue(cudaStream_t stream, std::function<void()> work) {
  if (const cudaError_t e = sticky(); e != cudaSuccess) return fail(e);
  CUstream_st* s = resolve(stream);
  std::lock_guard lock(s->mu);
  if (s->capture != nullptr) s->capture->ops.push_back(std::move(work));
  else s->queue.push_back(std::move(work));
  return cudaSuccess;
}

bool is_device_range(const void* p, size_t bytes) {
  Memory& m = memory();
  std::lock_guard lock(m.mu);
  return in_map(m.device, p, bytes);
}

void clear_failure() {
  {
    std::lock_guard lock(g_streams_mu);
    for (CUstream_st* s : g_streams) {
      std::lock_guard sl(s->mu);
      s->queue.clear();
    }
  }
  std::lock_guard lock(g_sticky_mu);
  g_sticky = cudaSuccess;
  t_last_error = cudaSuccess;
}

void kernel_failed(const char* kernel, const char* what) {
  std::lock_guard lock(g_sticky_mu);
  // The first failure is the cause; the lanes that detect the same one after it stay quiet.
  if (g_sticky == cudaSuccess) std::fprintf(stderr, "cuda-emu: kernel %s failed: %s\n", kernel, what);
  g_sticky = cudaErrorLaunchFailure;
}

}  // namespace kite::cuda::emu

// ---- the runtime API ----------------------------------------------------------------------
using namespace kite::cuda::emu;

namespace {

thread_local int t_device = 0;

// KITE_CUDA_EMU_DEVICES devices (default 1; 0 is a machine without a GPU).
int device_count() { return std::max(0, env_int("KITE_CUDA_EMU_DEVICES", 1)); }

// A synchronization point's answer: the sticky kernel failure, if any.
cudaError_t synced() { return sticky() == cudaSuccess ? cudaSuccess : fail(sticky()); }

struct ErrorText {
  cudaError_t e;
  const char* name;
  const char* text;
};
constexpr ErrorText kErrors[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration", "invalid configuration argument"},
    {cudaErrorInvalidDevicePointer, "cudaErrorInvalidDevicePointer", "invalid device pointer"},
    {cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection", "invalid copy direction for memcpy"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorLaunchOutOfResources, "cudaErrorLaunchOutOfResources", "too many resources requested for launch"},
    {cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "unspecified launch failure"},
    {cudaErrorStreamCaptureUnsupported, "cudaErrorStreamCaptureUnsupported",
     "operation not permitted when stream is capturing"},
    {cudaErrorStreamCaptureInvalidated, "cudaErrorStreamCaptureInvalidated",
     "operation failed due to a previous error during capture"},
    {cudaErrorUnknown, "cudaErrorUnknown", "unknown error"},
};
const ErrorText& error_text(cudaError_t e) {
  for (const ErrorText& t : kErrors)
    if (t.e == e) return t;
  return kErrors[std::size(kErrors) - 1];
}

// A copy's pointers against its kind: device sides must lie in one cudaMalloc'd allocation and
// host sides outside all of them. (With unified addressing a GPU would accept some mistakes this
// rejects; kite names every side exactly, so a mismatch here is a bug.)
cudaError_t check_copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  if (bytes == 0) return cudaSuccess;
  const bool dst_dev = is_device_range(dst, bytes), src_dev = is_device_range(src, bytes);
  bool ok = true;
  switch (kind) {
    case cudaMemcpyHostToDevice: ok = dst_dev && !is_device_range(src, 1); break;
    case cudaMemcpyDeviceToHost: ok = src_dev && !is_device_range(dst, 1); break;
    case cudaMemcpyDeviceToDevice: ok = dst_dev && src_dev; break;
    case cudaMemcpyHostToHost: ok = !is_device_range(dst, 1) && !is_device_range(src, 1); break;
    case cudaMemcpyDefault: ok = true; break;
  }
  if (ok) return cudaSuccess;
  std::fprintf(stderr, "cuda-emu: memcpy of %zu bytes, kind %d, from %p (%s) to %p (%s): pointers do not match the kind\n",
               bytes, static_cast<int>(kind), src, src_dev ? "device" : "not device", dst,
               dst_dev ? "device" : "not device");
  return fail(cudaErrorInvalidValue);
}

// While a stream is captured, copies from pageable host memory are not allowed (as on a GPU):
// the graph would read memory the caller may have reused.
cudaError_t check_capture_copy(CUstream_st* s, const void* host, size_t bytes) {
  std::lock_guard lock(s->mu);
  if (s->capture == nullptr || bytes == 0 || is_pinned_range(host, bytes)) return cudaSuccess;
  s->capture->invalidated = true;
  return fail(cudaErrorStreamCaptureUnsupported);
}

}  // namespace

const char* cudaGetErrorName(cudaError_t e) { return error_text(e).name; }
const char* cudaGetErrorString(cudaError_t e) { return error_text(e).text; }

cudaError_t cudaGetLastError() {
  const cudaError_t e = t_last_error;
  t_last_error = sticky();
  return e != cudaSuccess ? e : sticky();
}

cudaError_t cudaGetDeviceCount(int* count) {
  *count = device_count();
  if (*count == 0) return fail(cudaErrorNoDevice);
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= device_count()) return fail(cudaErrorInvalidDevice);
  t_device = device;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  *device = t_device;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (device < 0 || device >= device_count()) return fail(cudaErrorInvalidDevice);
  *prop = cudaDeviceProp{};
  std::snprintf(prop->name, sizeof(prop->name), "kite CUDA emulator %d (CPU)", device);
  prop->totalGlobalMem = total_memory();
  prop->multiProcessorCount = 4;
  prop->major = 9, prop->minor = 0;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  prop->sharedMemPerBlock = kMaxDynamicShared;
  prop->l2CacheSize = 4 << 20;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (device < 0 || device >= device_count()) return fail(cudaErrorInvalidDevice);
  switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock: *value = 1024; return cudaSuccess;
    case cudaDevAttrMultiProcessorCount: *value = 4; return cudaSuccess;
  }
  return fail(cudaErrorInvalidValue);
}

cudaError_t cudaDeviceSynchronize() {
  ++g_host_waits;
  flush_all();
  return synced();
}

cudaError_t cudaMalloc(void** p, size_t bytes) {
  *p = nullptr;
  ++g_mallocs;
  Memory& m = memory();
  std::lock_guard lock(m.mu);
  if (m.used + bytes > total_memory()) return fail(cudaErrorMemoryAllocation);
  void* a = nullptr;  // (exactly `bytes`: a sanitized build sees a read one past the end)
  if (posix_memalign(&a, 256, std::max<size_t>(bytes, 1)) != 0) return fail(cudaErrorMemoryAllocation);
  std::memset(a, 0xff, bytes);  // uninitialized device memory reads as NaN, never as zeros
  m.device[reinterpret_cast<uintptr_t>(a)] = bytes;
  m.used += bytes;
  *p = a;
  return cudaSuccess;
}

cudaError_t cudaFree(void* p) {
  if (p == nullptr) return cudaSuccess;
  ++g_frees;
  flush_all();  // cudaFree waits for the device, as on a GPU
  Memory& m = memory();
  std::lock_guard lock(m.mu);
  auto it = m.device.find(reinterpret_cast<uintptr_t>(p));
  if (it == m.device.end()) return fail(cudaErrorInvalidDevicePointer);
  m.used -= it->second;
  m.device.erase(it);
  std::free(p);
  return cudaSuccess;
}

cudaError_t cudaMallocHost(void** p, size_t bytes) {
  *p = std::aligned_alloc(4096, (std::max<size_t>(bytes, 1) + 4095) / 4096 * 4096);
  if (*p == nullptr) return fail(cudaErrorMemoryAllocation);
  Memory& m = memory();
  std::lock_guard lock(m.mu);
  m.pinned_size[reinterpret_cast<uintptr_t>(*p)] = bytes;
  return cudaSuccess;
}

cudaError_t cudaFreeHost(void* p) {
  if (p == nullptr) return cudaSuccess;
  flush_all();
  Memory& m = memory();
  std::lock_guard lock(m.mu);
  if (m.pinned_size.erase(reinterpret_cast<uintptr_t>(p)) == 0) return fail(cudaErrorInvalidValue);
  std::free(p);
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  Memory& m = memory();
  std::lock_guard lock(m.mu);
  *total_bytes = total_memory();
  *free_bytes = *total_bytes > m.used ? *total_bytes - m.used : 0;
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  if (const cudaError_t e = check_copy(dst, src, bytes, kind); e != cudaSuccess) return e;
  ++g_host_waits;  // (a blocking copy)
  if (kind == cudaMemcpyHostToDevice) ++g_uploads;
  // (The legacy default stream: it waits for work on blocking streams only, and kite's stream is
  // non-blocking, so nothing queued is run first.)
  flush(legacy_stream());
  std::memmove(dst, src, bytes);
  return synced();
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s) {
  if (const cudaError_t e = check_copy(dst, src, bytes, kind); e != cudaSuccess) return e;
  if (kind == cudaMemcpyHostToDevice) {
    if (const cudaError_t e = check_capture_copy(resolve(s), src, bytes); e != cudaSuccess) return e;
    ++g_uploads;
  }
  if (kind == cudaMemcpyDeviceToHost)
    if (const cudaError_t e = check_capture_copy(resolve(s), dst, bytes); e != cudaSuccess) return e;
  return enqueue(s, [dst, src, bytes] { std::memmove(dst, src, bytes); });
}

cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t s) {
  if (bytes > 0 && !is_device_range(p, bytes)) return fail(cudaErrorInvalidValue);
  return enqueue(s, [p, value, bytes] { std::memset(p, value, bytes); });
}



cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) {
  *s = new CUstream_st();
  std::lock_guard lock(g_streams_mu);
  g_streams.insert(*s);
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t s) {
  if (s == nullptr) return fail(cudaErrorInvalidResourceHandle);
  flush(s);  // (queued work still completes, as on a GPU)
  {
    std::lock_guard lock(g_streams_mu);
    if (g_streams.erase(s) == 0) return fail(cudaErrorInvalidResourceHandle);
  }
  delete s;
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  CUstream_st* s = resolve(stream);
  {
    std::lock_guard lock(s->mu);
    if (s->capture != nullptr) {
      s->capture->invalidated = true;
      return fail(cudaErrorStreamCaptureUnsupported);
    }
  }
  ++g_host_waits;
  flush(s);
  return synced();
}

cudaError_t cudaEventCreate(cudaEvent_t* e) {
  *e = new CUevent_st();
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete e;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  e->stream = resolve(s);
  e->recorded = false;
  return enqueue(s, [e] {
    e->at = std::chrono::steady_clock::now();
    e->recorded = true;
  });
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  ++g_host_waits;
  if (e->stream != nullptr) flush(e->stream);
  return synced();
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t stop) {
  if (!start->recorded || !stop->recorded) return fail(cudaErrorNotReady);
  *ms = std::chrono::duration<float, std::milli>(stop->at - start->at).count();
  return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode) {
  CUstream_st* s = resolve(stream);
  std::lock_guard lock(s->mu);
  if (s->capture != nullptr) return fail(cudaErrorStreamCaptureUnsupported);
  s->capture = new CUgraph_st();
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  CUstream_st* s = resolve(stream);
  std::lock_guard lock(s->mu);
  *graph = nullptr;
  if (s->capture == nullptr) return fail(cudaErrorInvalidValue);
  std::unique_ptr<CUgraph_st> g(s->capture);
  s->capture = nullptr;
  if (g->invalidated) return fail(cudaErrorStreamCaptureInvalidated);
  *graph = g.release();
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  if (graph == nullptr) return fail(cudaErrorInvalidValue);
  *exec = new CUgraphExec_st{graph->ops};
  return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s) {
  if (exec == nullptr) return fail(cudaErrorInvalidValue);
  ++g_graph_launches;
  return enqueue(s, [exec] {
    for (auto& op : exec->ops) op();
  });
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete graph;
  return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  flush_all();  // a launched graph may still be queued
  delete exec;
  return cudaSuccess;
}

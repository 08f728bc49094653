// kite/backends/cuda/emu/runtime.h — the part of the CUDA runtime API that kite uses, implemented
// on the CPU (runtime.cpp) so that the CUDA backend, its kernels included, runs in CI on a machine
// without a GPU (cmake -DKITE_CUDA_EMU=ON; see emu/README.md).
//
// Faithful where it finds bugs: work on a stream is queued and runs only at a synchronization
// point (as on a GPU, a host buffer changed before its copy ran is a visible bug); cudaMalloc'd
// memory starts as NaN bytes; copies check their direction against what was allocated; graph
// capture records the stream's work with its arguments as they were at capture; launch
// configurations and barriers are checked as the hardware would. Not modelled: timing,
// concurrency between streams, the memory model.
#pragma once

#include <cstddef>
#include <cstdint>

// ---- errors -------------------------------------------------------------------------------
enum cudaError {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevicePointer = 17,
  cudaErrorInvalidMemcpyDirection = 21,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidDevice = 101,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorNotReady = 600,
  cudaErrorLaunchOutOfResources = 701,
  cudaErrorLaunchFailure = 719,
  cudaErrorStreamCaptureUnsupported = 900,
  cudaErrorStreamCaptureInvalidated = 901,
  cudaErrorUnknown = 999,
};
using cudaError_t = cudaError;

const char* cudaGetErrorName(cudaError_t e);
const char* cudaGetErrorString(cudaError_t e);
cudaError_t cudaGetLastError();

// ---- devices ------------------------------------------------------------------------------
struct cudaDeviceProp {
  char name[256];
  size_t totalGlobalMem;
  int multiProcessorCount;
  int major, minor;
  int warpSize;
  int maxThreadsPerBlock;
  size_t sharedMemPerBlock;
  int l2CacheSize;
};
enum cudaDeviceAttr { cudaDevAttrMaxThreadsPerBlock = 1, cudaDevAttrMultiProcessorCount = 16 };

cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device);
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device);
cudaError_t cudaDeviceSynchronize();

// ---- memory -------------------------------------------------------------------------------
enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};

struct CUstream_st;
using cudaStream_t = CUstream_st*;

cudaError_t cudaMalloc(void** p, size_t bytes);
cudaError_t cudaFree(void* p);
cudaError_t cudaMallocHost(void** p, size_t bytes);
cudaError_t cudaFreeHost(void* p);
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes);
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s = nullptr);
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t s = nullptr);

// ---- streams and events -------------------------------------------------------------------
enum : unsigned { cudaStreamDefault = 0, cudaStreamNonBlocking = 1 };
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);

struct CUevent_st;
using cudaEvent_t = CUevent_st*;
cudaError_t cudaEventCreate(cudaEvent_t* e);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s = nullptr);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t stop);

// ---- graphs -------------------------------------------------------------------------------
enum cudaStreamCaptureMode {
  cudaStreamCaptureModeGlobal = 0,
  cudaStreamCaptureModeThreadLocal = 1,
  cudaStreamCaptureModeRelaxed = 2,
};
struct CUgraph_st;
struct CUgraphExec_st;
using cudaGraph_t = CUgraph_st*;
using cudaGraphExec_t = CUgraphExec_st*;
cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* graph);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long flags = 0);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);

// ---- what the emulator adds (for its kernel launcher and cuBLAS) ---------------------------
#include <functional>
#include <string>

namespace kite::cuda::emu {

// Queues `work` on stream `s` (recorded instead when the stream is being captured); it runs at
// the stream's next synchronization point.
cudaError_t enqueue(cudaStream_t s, std::function<void()> work);
// Whether [p, p + bytes) lies in one cudaMalloc'd allocation.
bool is_device_range(const void* p, size_t bytes);
// A failure inside a kernel (a barrier not every thread reaches, ...): the first one is reported
// on stderr, and every later synchronization returns cudaErrorLaunchFailure (sticky, as on a GPU).
void kernel_failed(const char* kernel, const char* what);
// What the program has asked of the runtime so far, for tests of what a step does (no
// allocation, no wait, no kernel launched from the host while a graph replays it).
struct Counters {
  uint64_t mallocs = 0, frees = 0;
  uint64_t host_waits = 0;      // stream, event and device synchronizations, blocking copies
  uint64_t launches = 0;        // kernels launched from the host (captured ones included)
  uint64_t graph_launches = 0;  // cudaGraphLaunch
  uint64_t uploads = 0;         // host-to-device copies (cudaMemcpy, cudaMemcpyAsync)
};
Counters counters();
// The order blocks, and threads between barriers, run in: "forward", "reverse", "shuffle" or
// "shuffle:SEED" (the environment's KITE_CUDA_EMU_SCHEDULE sets it at start; false for anything
// else). Queued work runs first.
bool set_schedule(const std::string& how);
// Forgets a kernel failure and the work queued behind it (for the emulator's own tests: on a
// GPU the process would have to start over).
void clear_failure();

}  // namespace kite::cuda::emu

// kite/backends/cuda/cuda_backend.h — the CUDA backend (plain C++: no CUDA headers here).
//
// make_cuda_backend() opens one device (BackendOptions::device) with one stream; tensors in its
// Buffers are device addresses (cudaMalloc, never managed memory). Weights that live in host
// memory (leaves of the file mapping, `buffer == nullptr`) are mirrored on the device on first
// use and read from the mirror afterwards. Every CUDA failure becomes a Status naming the call
// and its source line; out-of-memory is an error, never a crash.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "src/base/status.h"
#include "src/core/backend.h"
#include "src/core/devices.h"

namespace kite::cuda {

// Devices visible to the runtime; 0 when there is no driver or no device (never throws).
int cuda_device_count();

Result<std::unique_ptr<Backend>> make_cuda_backend(const BackendOptions& opts);

// The devices: name, compute capability, SMs, memory (total and free); an error where none.
Result<std::vector<DeviceInfo>> list_cuda_devices();

// Bytes of host weights with a copy on GPU `device` now: one copy per GPU, shared by every
// context (backend) using it, freed with the last.
size_t cuda_mirrored_bytes(int device);

// Steps launched as CUDA graphs so far in this process (all backends), for tests.
uint64_t cuda_graph_launches();

// Opens cuBLAS now (the backend opens it with dlopen on its first cuBLAS matmul, so a missing
// or wrong library shows up only then): for tests and diagnostics; needs no device.
Status cuda_check_cublas();

// Device read+write bandwidth measured with a device-to-device copy kernel over `bytes` (each
// of source and destination), median of `reps` runs: bytes read + bytes written per second.
struct BandwidthReport {
  double copy_gbps = 0;      // the kite copy kernel
  double memcpy_gbps = 0;    // cudaMemcpyAsync device-to-device, for comparison
  double d2h_gbps = 0;       // device to pinned host memory (a step's logits come back this way)
  double h2d_gbps = 0;       // pinned host memory to device
  size_t host_bytes = 0;     // bytes of those copies (at most 64 MiB)
  std::string device_name;
  double total_gib = 0;      // device memory
};
Result<BandwidthReport> cuda_measure_bandwidth(int device, size_t bytes = size_t{1} << 30, int reps = 10);

// A quantized matmul shape with more columns than the mat-vec kernels take, which the backend
// timed both ways the first time it ran (outside a graph capture): the int8 tensor-core kernel
// (mmq) and dequantize-to-F16 + cuBLAS. Every matmul of the shape takes the faster from then on
// in this process (ops_matmul.cpp).
struct MatmulChoice {
  int device = 0;
  DType type = DType::F32;
  int64_t k = 0, m = 0;  // the weight: m rows of k
  int64_t cols = 0;      // activation columns rounded up to a power of two (cols/2+1 .. cols)
  bool mmq = false;
  double mmq_ms = 0, cublas_ms = 0;  // each way's faster timed run (0: not timed, cuBLAS could not run)
};
std::vector<MatmulChoice> cuda_matmul_choices();
// The choices as lines ("q4_K 4096 x 14336, 33-64 columns: mmq (mmq 0.210 ms, cuBLAS 0.352 ms)"),
// for `kite bench` (register_choice_reporter).
std::vector<std::string> cuda_matmul_report();
// Forgets them, so that the next matmul of each shape is timed again. For tests.
void reset_cuda_matmul_choices();

}  // namespace kite::cuda

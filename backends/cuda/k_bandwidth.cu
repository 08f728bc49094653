// A device-to-device copy kernel: the measure of the card's achievable read + write bandwidth.
#include "backends/cuda/kernels.h"
#include "backends/cuda/launch.cuh"

namespace kite::cuda {
namespace {

__global__ void copy_kernel(const int4* __restrict__ src, int4* __restrict__ dst, size_t n) {
  KITE_GRID_DEPENDENCY();
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    dst[i] = src[i];
}

}  // namespace

cudaError_t launch_copy_kernel(const void* src, void* dst, size_t bytes, cudaStream_t s) {
  const size_t n = bytes / sizeof(int4);
  int device = 0, sms = 1;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  KITE_KERNEL(static_cast<unsigned>(sms * 8), 512, 0, s, copy_kernel)(static_cast<const int4*>(src), static_cast<int4*>(dst), n);
  return cudaGetLastError();
}

}  // namespace kite::cuda

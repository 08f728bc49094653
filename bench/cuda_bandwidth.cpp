// kite-cuda-bandwidth: the GPU's device-memory bandwidth, the bound a decode step cannot beat.
// A device-to-device copy (kite's copy kernel, and cudaMemcpyAsync for comparison) over 1 GiB,
// median of 10 runs; GB/s counts bytes read plus bytes written (1e9 bytes). Then copies to and
// from pinned host memory (up to 64 MiB, bytes counted once): the bus a step's logits cross.
//   kite-cuda-bandwidth [DEVICE] [MiB]
#include <cstdio>
#include <cstdlib>

#include "backends/cuda/cuda_backend.h"

int main(int argc, char** argv) {
  const int device = argc > 1 ? std::atoi(argv[1]) : 0;
  const size_t mib = argc > 2 ? static_cast<size_t>(std::atoll(argv[2])) : 1024;
  std::printf("cuda devices: %d\n", kite::cuda::cuda_device_count());
  auto r = kite::cuda::cuda_measure_bandwidth(device, mib << 20, 10);
  if (!r.ok()) {
    std::fprintf(stderr, "kite-cuda-bandwidth: %s\n", r.error().message.c_str());
    return 1;
  }
  std::printf("device %d: %s, %.1f GiB\n", device, r->device_name.c_str(), r->total_gib);
  std::printf("copy kernel: %.1f GB/s (read + write, %zu MiB each way)\n", r->copy_gbps, mib);
  std::printf("cudaMemcpy d2d: %.1f GB/s\n", r->memcpy_gbps);
  // What downloading a step's logits costs: 64 sequences x Llama-3's 128256-token vocabulary (F32).
  const double logits_mb = 64.0 * 128256 * 4 / 1e6;
  std::printf("pinned host: device->host %.1f GB/s, host->device %.1f GB/s (%zu MiB); 64 x 128256 F32 logits "
              "(%.1f MB) come back in %.2f ms\n",
              r->d2h_gbps, r->h2d_gbps, r->host_bytes >> 20, logits_mb, logits_mb / 1e3 / r->d2h_gbps * 1e3);
  std::printf("{\"device\": \"%s\", \"copy_gbps\": %.1f, \"memcpy_gbps\": %.1f, \"d2h_gbps\": %.1f, \"h2d_gbps\": %.1f}\n",
              r->device_name.c_str(), r->copy_gbps, r->memcpy_gbps, r->d2h_gbps, r->h2d_gbps);
  return 0;
}

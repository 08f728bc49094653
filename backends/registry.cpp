// The one place that knows which backends were compiled in. GPU backends register first; the
// CPU registers last and is the fallback.
#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/one_row.h"
#include "src/core/backend.h"
#include "src/core/devices.h"
#ifdef KITE_CUDA
#include "backends/cuda/cuda_backend.h"
#endif
#ifdef KITE_NCCL
#include "backends/cuda/nccl_comm.h"
#include "src/core/comm.h"
#endif
#ifdef KITE_VULKAN
#include "backends/vulkan/vulkan_backend.h"
#endif

namespace kite {

void register_builtin_backends() {
#ifdef KITE_CUDA
  register_backend("cuda", cuda::make_cuda_backend);
  register_device_lister("cuda", cuda::list_cuda_devices);
  register_choice_reporter("cuda", cuda::cuda_matmul_report);
#endif
#ifdef KITE_NCCL
  register_communicator("cuda", cuda::make_nccl_communicator);
#endif
#ifdef KITE_VULKAN
  register_backend("vulkan", vk::make_vulkan_backend);
  register_device_lister("vulkan", vk::list_vulkan_devices);
#endif
  register_backend("cpu", cpu::make_cpu_backend);
  register_device_lister("cpu", cpu::list_cpu_devices);
  register_choice_reporter("cpu", cpu::one_row_report);
}

}  // namespace kite

// The CUDA emulator's stand-in for NCCL (backends/cuda/emu): the "cuda" communicator of
// KITE_CUDA_EMU builds, so tensor parallelism over emulated GPUs (KITE_CUDA_EMU_DEVICES >= 2)
// runs the CUDA backend's all_reduce path in CI. A rank's all_reduce first runs its stream's
// queued work, then sums with the other ranks on the host (the emulated device memory is host
// memory), in rank order, before returning: a synchronization point where NCCL would only queue
// the sum on the stream. (So it is not capturable(): steps with all_reduce run op by op here,
// not as CUDA graphs.)
#include "backends/cuda/nccl_comm.h"

#include <cuda_runtime_api.h>

namespace kite::cuda {
namespace {

class EmuNcclCommunicator final : public Communicator {
 public:
  explicit EmuNcclCommunicator(int world) : Communicator(world), host_(world) {}
  std::string_view backend() const override { return "cuda"; }

  Status all_reduce_sum(int rank, float* data, size_t n, void* stream) override {
    if (const cudaError_t e = cudaStreamSynchronize(static_cast<cudaStream_t>(stream)); e != cudaSuccess) {
      host_.abort(std::string("rank ") + std::to_string(rank) + "'s stream failed: " + cudaGetErrorString(e));
      return make_error("all_reduce: rank ", rank, "'s stream failed: ", cudaGetErrorString(e));
    }
    return host_.all_reduce_sum(rank, data, n, nullptr);
  }
  void abort(const std::string& why) override { host_.abort(why); }
  void reset() override { host_.reset(); }

 private:
  HostCommunicator host_;
};

}  // namespace

Result<std::unique_ptr<Communicator>> make_nccl_communicator(int world) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
  if (devices < world)
    return make_error("cuda: tensor parallelism over ", world, " ranks needs ", world, " GPUs; this machine has ",
                      devices);
  return std::unique_ptr<Communicator>(std::make_unique<EmuNcclCommunicator>(world));
}

}  // namespace kite::cuda

// kite/src/core/comm.h — collectives between the ranks of a tensor-parallel group.
//
// Tensor parallelism (docs/ARCHITECTURE.md, "Multi-GPU") runs one graph per rank, each over its
// slice of every layer's weights, and sums partial results across the ranks with all_reduce
// nodes. A Communicator connects the ranks: each rank's backend is created with it and its rank
// (BackendOptions) and performs the all_reduce nodes through it. The host implementation sums
// host memory between threads of one process (CPU ranks: the sharding logic runs and is tested
// on any machine); GPU backends register their own (NCCL for CUDA).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "src/base/status.h"

namespace kite {

class Communicator {
 public:
  explicit Communicator(int world) : world_(world) {}
  virtual ~Communicator() = default;
  int world() const { return world_; }
  // The backend whose memory the sums are in ("cpu": host memory; "cuda": device memory).
  virtual std::string_view backend() const = 0;
  // Sums the n floats at `data` in place over the ranks. Every rank calls it with the same n, in
  // the same order; `stream` is the backend's queue (a cudaStream_t; null on the host), and on a
  // GPU the sum is queued there, not waited for.
  virtual Status all_reduce_sum(int rank, float* data, size_t n, void* stream) = 0;
  // Whether all_reduce_sum only queues work on `stream`, so that a GPU backend may record it
  // into a CUDA graph (NCCL); otherwise steps with all_reduce nodes run op by op.
  virtual bool capturable() const { return false; }
  // Makes every rank waiting in a collective, or entering one, fail with `why` instead of
  // waiting for a rank that will not come (it failed its step). reset() re-arms the group for
  // the next step, once every rank has returned.
  virtual void abort(const std::string& why) = 0;
  virtual void reset() = 0;

 private:
  int world_;
};

// Ranks are threads of this process summing host memory: each rank's data becomes the sum over
// ranks 0, 1, ... in that order, so every rank holds identical bits. all_reduce_sum blocks until
// every rank has arrived.
class HostCommunicator final : public Communicator {
 public:
  explicit HostCommunicator(int world);
  std::string_view backend() const override { return "cpu"; }
  Status all_reduce_sum(int rank, float* data, size_t n, void* stream = nullptr) override;
  void abort(const std::string& why) override;
  void reset() override;

 private:
  // Waits until all ranks arrived at this generation's barrier (or an abort).
  Status arrive(std::unique_lock<std::mutex>& lock);

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<float*> data_;
  std::vector<size_t> sizes_;
  std::vector<float> sum_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  bool aborted_ = false;
  std::string why_;
};

// Communicators by backend name: "cpu" is the host one; GPU backends register theirs.
using CommunicatorFactory = std::function<Result<std::unique_ptr<Communicator>>(int world)>;
void register_communicator(std::string backend, CommunicatorFactory factory);
// A group of `world` ranks for backend `backend` ("cpu", "cuda"; no device index).
Result<std::unique_ptr<Communicator>> create_communicator(std::string_view backend, int world);

}  // namespace kite

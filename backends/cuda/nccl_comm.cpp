#include "backends/cuda/nccl_comm.h"

#include "backends/cuda/dynlib.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <mutex>
#include <string>
#include <vector>

namespace kite::cuda {
namespace {

#ifndef KITE_CUDA_LIBDIR
#define KITE_CUDA_LIBDIR "/usr/local/cuda/lib64"
#endif

struct NcclApi {
  decltype(&ncclCommInitAll) init_all = nullptr;
  decltype(&ncclAllReduce) all_reduce = nullptr;
  decltype(&ncclCommAbort) abort = nullptr;
  decltype(&ncclCommDestroy) destroy = nullptr;
  decltype(&ncclGetErrorString) error_string = nullptr;
};

Result<NcclApi> load() {
  const std::string soname = "libnccl.so." + std::to_string(NCCL_MAJOR);
  KITE_ASSIGN_OR_RETURN(void* handle, open_library(soname, {KITE_CUDA_LIBDIR, std::string(KITE_CUDA_LIBDIR) + "/../lib"},
                                                   "NCCL, which tensor parallelism needs"));
  NcclApi api;
  if (!(resolve(handle, "ncclCommInitAll", &api.init_all) && resolve(handle, "ncclAllReduce", &api.all_reduce) &&
        resolve(handle, "ncclCommAbort", &api.abort) && resolve(handle, "ncclCommDestroy", &api.destroy) &&
        resolve(handle, "ncclGetErrorString", &api.error_string))) {
    const char* why = dlerror();
    return make_error("cuda: ", soname, " lacks an entry point kite needs (", why ? why : "?", ")");
  }
  return api;  // the library stays loaded for the life of the process
}

Result<const NcclApi*> nccl_api() { return load_once<NcclApi, load>(); }

// One communicator per GPU 0..world-1, made together in this process (ncclCommInitAll).
class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(int world, const NcclApi& api) : Communicator(world), api_(api) {}
  ~NcclCommunicator() override { release(false); }

  Status init() {
    comms_.assign(static_cast<size_t>(world()), nullptr);
    if (const ncclResult_t r = api_.init_all(comms_.data(), world(), nullptr); r != ncclSuccess) {
      comms_.clear();
      return make_error("cuda: NCCL could not connect GPUs 0..", world() - 1, " (ncclCommInitAll: ",
                        api_.error_string(r), ")");
    }
    return ok_status();
  }

  std::string_view backend() const override { return "cuda"; }

  bool capturable() const override { return true; }  // (ncclAllReduce only enqueues)
  Status all_reduce_sum(int rank, float* data, size_t n, void* stream) override {
    std::string why;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (aborted_) why = why_;
    }
    if (!why.empty()) return make_error("all_reduce: ", why);
    if (rank < 0 || rank >= static_cast<int>(comms_.size()))
      return make_error("all_reduce: rank ", rank, " outside a group of ", world());
    const ncclResult_t r = api_.all_reduce(data, data, n, ncclFloat32, ncclSum, comms_[static_cast<size_t>(rank)],
                                           static_cast<cudaStream_t>(stream));
    if (r != ncclSuccess) return make_error("all_reduce: ncclAllReduce on rank ", rank, ": ", api_.error_string(r));
    return ok_status();
  }

  // A rank that failed leaves the others' queued sums waiting for it: aborting the
  // communicators releases them (with an error); reset() connects the GPUs again.
  void abort(const std::string& why) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_) return;
    aborted_ = true;
    why_ = why;
    release(true);
  }

  void reset() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!aborted_) return;
    if (init().ok()) {
      aborted_ = false;
      why_.clear();
    } else {
      why_ = "the NCCL group could not be rebuilt after '" + why_ + "'";
    }
  }

 private:
  void release(bool abort) {
    for (ncclComm_t c : comms_)
      if (c != nullptr) (abort ? api_.abort : api_.destroy)(c);
    comms_.clear();
  }

  const NcclApi& api_;
  std::vector<ncclComm_t> comms_;
  std::mutex mu_;
  bool aborted_ = false;
  std::string why_;
};

}  // namespace

Result<std::unique_ptr<Communicator>> make_nccl_communicator(int world) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) {
    cudaGetLastError();
    devices = 0;
  }
  if (devices < world)
    return make_error("cuda: tensor parallelism over ", world, " ranks needs ", world, " GPUs; this machine has ",
                      devices);
  KITE_ASSIGN_OR_RETURN(const NcclApi* api, nccl_api());
  auto c = std::make_unique<NcclCommunicator>(world, *api);
  KITE_TRY(c->init());
  return std::unique_ptr<Communicator>(std::move(c));
}

}  // namespace kite::cuda

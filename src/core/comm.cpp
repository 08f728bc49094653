#include "src/core/comm.h"

#include <cstring>
#include <utility>

namespace kite {

HostCommunicator::HostCommunicator(int world)
    : Communicator(world), data_(static_cast<size_t>(world), nullptr), sizes_(static_cast<size_t>(world), 0) {}

Status HostCommunicator::arrive(std::unique_lock<std::mutex>& lock) {
  const uint64_t gen = generation_;
  if (++arrived_ == world()) {
    arrived_ = 0;
    ++generation_;
    cv_.notify_all();
    return ok_status();
  }
  cv_.wait(lock, [&] { return generation_ != gen || aborted_; });
  if (generation_ == gen) return make_error("all_reduce: ", why_);
  return ok_status();
}

Status HostCommunicator::all_reduce_sum(int rank, float* data, size_t n, void* /*stream*/) {
  std::unique_lock<std::mutex> lock(mu_);
  if (aborted_) return make_error("all_reduce: ", why_);
  if (rank < 0 || rank >= world()) return make_error("all_reduce: rank ", rank, " outside a group of ", world());
  // 1. Every rank posts its buffer; the last to arrive sums them in rank order (or, if the
  //    ranks disagree on the size, fails the collective for all).
  data_[static_cast<size_t>(rank)] = data;
  sizes_[static_cast<size_t>(rank)] = n;
  if (arrived_ + 1 == world()) {
    for (int r = 1; r < world(); ++r)
      if (sizes_[static_cast<size_t>(r)] != sizes_[0]) {
        why_ = "rank " + std::to_string(r) + " sums " + std::to_string(sizes_[static_cast<size_t>(r)]) +
               " floats, rank 0 " + std::to_string(sizes_[0]);
        aborted_ = true;
        cv_.notify_all();
        return make_error("all_reduce: ", why_);
      }
    sum_.assign(data_[0], data_[0] + n);
    for (int r = 1; r < world(); ++r) {
      const float* d = data_[static_cast<size_t>(r)];
      for (size_t i = 0; i < n; ++i) sum_[i] += d[i];
    }
  }
  KITE_TRY(arrive(lock));
  // 2. Every rank copies the sum out; the second barrier keeps sum_ until all have.
  std::memcpy(data, sum_.data(), n * sizeof(float));
  return arrive(lock);
}

void HostCommunicator::abort(const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!aborted_) why_ = why;
  aborted_ = true;
  cv_.notify_all();
}

void HostCommunicator::reset() {
  std::lock_guard<std::mutex> lock(mu_);
  aborted_ = false;
  arrived_ = 0;
  why_.clear();
}

namespace {

struct CommRegistry {
  std::mutex mu;
  std::vector<std::pair<std::string, CommunicatorFactory>> entries;
};

CommRegistry& comm_registry() {
  static CommRegistry r;
  return r;
}

}  // namespace

void register_communicator(std::string backend, CommunicatorFactory factory) {
  CommRegistry& r = comm_registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.entries.emplace_back(std::move(backend), std::move(factory));
}

Result<std::unique_ptr<Communicator>> create_communicator(std::string_view backend, int world) {
  if (world < 1) return make_error("tensor parallelism: ", world, " ranks (expected 1 or more)");
  if (backend == "cpu") return std::unique_ptr<Communicator>(std::make_unique<HostCommunicator>(world));
  CommunicatorFactory factory;
  {
    CommRegistry& r = comm_registry();
    std::lock_guard<std::mutex> lock(r.mu);
    for (const auto& e : r.entries)
      if (e.first == backend) factory = e.second;
  }
  if (!factory)
    return make_error("tensor parallelism is not available on '", backend,
                      "' (cpu ranks always; cuda with NCCL, built with KITE_NCCL)");
  return factory(world);
}

}  // namespace kite

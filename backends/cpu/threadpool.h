// kite/backends/cpu/threadpool.h — a fixed team of threads that run one job at a time.
//
// run(fn) calls fn(ith, nth) on every thread of the team (the caller is thread 0) and returns
// when all are done. Workers spin briefly between jobs (a decode step is hundreds of short
// jobs), then sleep on a condition variable.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kite::cpu {

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }
  void run(const std::function<void(int ith, int nth)>& fn);

  // Physical cores of this machine (logical CPUs / SMT siblings), at least 1.
  static int physical_cores();

 private:
  void worker(int ith);

  int n_threads_;
  std::vector<std::thread> threads_;
  const std::function<void(int, int)>* job_ = nullptr;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::condition_variable cv_;
};

}  // namespace kite::cpu

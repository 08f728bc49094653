// kite/backends/cpu/threadpool.h — a fixed team of threads that run one job at a time.
//
// run(fn) calls fn(ith, nth) on every thread of the team (the caller is thread 0) and returns
// when all are done. A decode step is hundreds of short jobs, so the hand-off must cost well
// under a microsecond: workers poll the job counter with `pause` (no system call) for a while,
// then yield the CPU (the machine may be shared), and only after a long idle stretch sleep on a
// condition variable, which run() signals only when someone sleeps.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kite::cpu {

// Busy-wait helper: the first kPauseSpins calls execute a CPU pause hint, later ones yield the
// thread (so a preempted team member gets the core back on an oversubscribed machine).
class SpinWait {
 public:
  void once();
  void reset() { n_ = 0; }
  int count() const { return n_; }

  static constexpr int kPauseSpins = 256;

 private:
  int n_ = 0;
};

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
  // Separate cache lines: the counter the workers poll, the one they decrement, the sleepers.
  alignas(64) std::atomic<uint64_t> generation_{0};
  alignas(64) std::atomic<int> pending_{0};
  alignas(64) std::atomic<int> sleepers_{0};
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::condition_variable cv_;
};

}  // namespace kite::cpu

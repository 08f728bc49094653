// kite/backends/cpu/threadpool.h — a fixed team of threads that run one job at a time.
//
// run(fn) calls fn(ith, nth) on every thread of the team (the caller is thread 0) and returns
// when all are done. A decode step is hundreds of short jobs, so the hand-off must cost well
// under a microsecond: workers poll the job counter with `pause` (no system call) for a while,
// then yield the CPU (the machine may be shared), and only after a long idle stretch sleep on a
// condition variable, which run() signals only when someone sleeps.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kite::cpu {

// Busy-wait helper: polls execute a CPU pause hint for the first kPauseMicros, later ones
// yield the thread (so a preempted team member gets the core back on an oversubscribed
// machine). Why 50 us and not a few: a yield hands the core to whatever else is runnable for
// up to a time slice, and a team member that yields while its partner is a few microseconds
// from the barrier falls out of step. With one busy process beside 2 threads on 2 cores, decode
// of the 16M test model ran 490-760 t/s against 200-370 with a ~5 us spin, and the 1B Q4_K_M
// synthetic model (kite bench -p 0 -n 64 -r 3) 16.4-21.3 against 10.7-13.1 t/s in five
// alternations; on a quiet machine the two are level.
class SpinWait {
 public:
  void once();
  int64_t micros() const { return micros_; }  // since the first poll, updated every 64 polls

  static constexpr int64_t kPauseMicros = 50;

 private:
  int n_ = 0;
  int64_t micros_ = 0;
  std::chrono::steady_clock::time_point start_;
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

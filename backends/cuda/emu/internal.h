// What the emulator's two halves share: runtime.cpp (memory, streams, events, graphs, the
// runtime API) and scheduler.cpp (the kernel language and the scheduler that runs a launch's
// blocks and threads). Internal to backends/cuda/emu.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>

#include "backends/cuda/emu/runtime.h"

namespace kite::cuda::emu::detail {

inline constexpr size_t kMaxDynamicShared = 48 << 10;  // without cudaFuncSetAttribute, as on every GPU

// Records `e` as the calling thread's last error (cudaGetLastError) and returns it.
cudaError_t fail(cudaError_t e);
// Runs every stream's queued work (a device-wide synchronization point).
void flush_all();
// One kernel (one block) runs at a time in the process: held while a stream's work runs.
extern std::mutex g_exec_mu;
// Kernels launched from the host so far (counters()).
extern std::atomic<uint64_t> g_launches;

}  // namespace kite::cuda::emu::detail

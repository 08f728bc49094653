// The CUDA kernel language on the CPU (kernel.h) and the scheduler that runs a launch: each
// block's threads are fibers (Boost.Context), switched only at barriers and warp exchanges, in
// the order KITE_CUDA_EMU_SCHEDULE asks for; shared memory is the running block's.
#include "backends/cuda/emu/kernel.h"

#include <boost/context/fiber.hpp>
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backends/cuda/emu/internal.h"

namespace kite::cuda::emu {

using detail::fail;
using detail::flush_all;
using detail::g_exec_mu;
using detail::kMaxDynamicShared;

namespace {

namespace ctx = boost::context;

// ---- the kernel scheduler -----------------------------------------------------------------
// Built with AddressSanitizer (KITE_CUDA_EMU_SANITIZE), every switch between the scheduler's
// stack and a thread's is announced to it, or it takes a thread's stack for a corrupted one.
// The scheduler's stack, learned when a thread first starts.
thread_local const void* t_sched_bottom = nullptr;
thread_local size_t t_sched_size = 0;
#if defined(__SANITIZE_ADDRESS__)
void switch_start(void** fake, const void* bottom, size_t size) { __sanitizer_start_switch_fiber(fake, bottom, size); }
void switch_done(void* fake, const void** bottom, size_t* size) { __sanitizer_finish_switch_fiber(fake, bottom, size); }
constexpr size_t kStackBytes = 512 << 10;  // (instrumented frames are larger)
#else
void switch_start(void**, const void*, size_t) {}
void switch_done(void*, const void**, size_t*) {}
constexpr size_t kStackBytes = 128 << 10;
#endif

// Fiber stacks are reused: a block's threads are created for every block.
struct FreeStacks : std::vector<void*> {
  ~FreeStacks() {
    for (void* p : *this) std::free(p);
  }
};
FreeStacks g_free_stacks;  // (guarded by g_exec_mu, like all kernel execution)
void* g_last_stack = nullptr;      // the stack PooledStack handed out last

struct PooledStack {
  ctx::stack_context allocate() {
    void* p = nullptr;
    if (!g_free_stacks.empty()) {
      p = g_free_stacks.back();
      g_free_stacks.pop_back();
    } else {
      p = std::malloc(kStackBytes);
      if (p == nullptr) std::abort();
    }
#if defined(__SANITIZE_ADDRESS__)
    __asan_unpoison_memory_region(p, kStackBytes);  // (frames a thread left when it was unwound)
#endif
    g_last_stack = p;
    ctx::stack_context sc;
    sc.size = kStackBytes;
    sc.sp = static_cast<char*>(p) + kStackBytes;
    return sc;
  }
  void deallocate(ctx::stack_context& sc) noexcept { g_free_stacks.push_back(static_cast<char*>(sc.sp) - sc.size); }
};

enum class State : uint8_t { kReady, kWarp, kBlock, kDone };

struct Lane : ThreadState {
  ctx::fiber fiber;  // the thread (while it is suspended)
  ctx::fiber back;   // the scheduler (while the thread runs)
  void* stack = nullptr;       // its fiber's stack (kStackBytes)
  void* fake_stack = nullptr;  // (AddressSanitizer's, while it is suspended)
  State state = State::kReady;
  unsigned mask = 0;
  Site site;  // where it waits
  uint64_t offer[2] = {0, 0};  // double-buffered: a lane can be one exchange ahead of a reader
  unsigned exchanges = 0;
};

// A KITE_SHARED variable of the running kernel: its own allocation of exactly its size, so that
// a sanitized build (KITE_CUDA_EMU_SANITIZE) sees an index past its end.
struct StaticShared {
  struct Free {
    size_t align;
    void operator()(uint8_t* p) const { ::operator delete[](p, std::align_val_t(align)); }
  };
  const void* tag;
  size_t bytes;
  std::unique_ptr<uint8_t[], Free> mem;
};

struct Block {
  std::vector<Lane> lanes;
  std::vector<uint8_t> shared;        // dynamic shared memory (exactly its size, likewise)
  std::vector<StaticShared> statics;  // KITE_SHARED variables
  size_t static_bytes = 0;
  const char* kernel = "";
  uint64_t barriers = 0;  // reached by any thread of any block so far
  bool direct = false;    // threads run one after another on this stack, without fibers
};

// Shared memory as a block starts: never written, so it reads as NaN (a GPU's holds whatever the
// previous block on that SM left).
void fresh_shared(Block& b) {
  std::fill(b.shared.begin(), b.shared.end(), uint8_t{0xff});
  for (StaticShared& v : b.statics) std::memset(v.mem.get(), 0xff, v.bytes);
}

// ---- the order things run in (KITE_CUDA_EMU_SCHEDULE) ---------------------------------------
// A GPU runs a grid's blocks in no promised order and a block's threads concurrently, so a kernel
// whose result depends on the order (a missing __syncthreads or __syncwarp, a block reading what
// another block of the same launch writes) is wrong even when it works here in the default
// order: block 0 first, each thread from one barrier to the next before the next thread starts.
// "reverse" runs blocks and threads last first, "shuffle[:SEED]" in a random order, drawn anew
// for every launch and every stretch between barriers. A reader placed before its writer in one
// of the orders reads unwritten (0xff) memory or a stale value: the results change.
struct Schedule {
  enum Kind { kForward, kReverse, kShuffle } kind = kForward;
  std::mt19937_64 rng;  // (guarded by g_exec_mu)
};

bool parse_schedule(const std::string& how, Schedule& r) {
  if (how.empty() || how == "forward") {
    r.kind = Schedule::kForward;
  } else if (how == "reverse") {
    r.kind = Schedule::kReverse;
  } else if (how.rfind("shuffle", 0) == 0 && (how.size() == 7 || how[7] == ':')) {
    r.kind = Schedule::kShuffle;
    r.rng.seed(how.size() > 8 ? std::strtoull(how.c_str() + 8, nullptr, 10) : 1);
  } else {
    return false;
  }
  return true;
}

Schedule& schedule() {
  static Schedule s = [] {
    Schedule r;
    const char* v = std::getenv("KITE_CUDA_EMU_SCHEDULE");
    if (!parse_schedule(v != nullptr ? v : "", r)) {
      std::fprintf(stderr, "cuda-emu: KITE_CUDA_EMU_SCHEDULE=%s: expected forward, reverse, shuffle or shuffle:SEED\n",
                   v);
      std::exit(2);
    }
    return r;
  }();
  return s;
}

// 0..n-1 in the schedule's order.
void schedule_order(std::vector<uint32_t>& order, size_t n) {
  order.resize(n);
  std::iota(order.begin(), order.end(), uint32_t{0});
  Schedule& s = schedule();
  if (s.kind == Schedule::kReverse) std::reverse(order.begin(), order.end());
  else if (s.kind == Schedule::kShuffle) std::shuffle(order.begin(), order.end(), s.rng);
}

// A barrier reached by a thread run without a fiber (see run_direct).
struct DirectBarrier {};

thread_local Lane* t_lane = nullptr;
thread_local Block* t_block = nullptr;

void set_lane(Lane* l) {
  t_lane = l;
  t_thread = l;
}

void suspend(State s, Site site) {
  if (!t_lane->waited && t_lane->fault == nullptr)
    t_lane->fault = "a barrier or warp operation before KITE_GRID_DEPENDENCY() (launch.cuh)";
  if (t_block->direct) throw DirectBarrier{};
  ++t_block->barriers;
  Lane* me = t_lane;
  me->state = s;
  me->site = site;
  switch_start(&me->fake_stack, t_sched_bottom, t_sched_size);
  try {
    me->back = std::move(me->back).resume();
  } catch (...) {  // (the scheduler unwinds a thread of a failed kernel)
    switch_done(me->fake_stack, &t_sched_bottom, &t_sched_size);
    throw;
  }
  switch_done(me->fake_stack, &t_sched_bottom, &t_sched_size);
  set_lane(me);  // (resumed by the scheduler)
}

std::string states_of(const Block& b) {
  int ready = 0, warp = 0, block = 0, done = 0;
  for (const Lane& l : b.lanes) {
    ready += l.state == State::kReady, warp += l.state == State::kWarp;
    block += l.state == State::kBlock, done += l.state == State::kDone;
  }
  return std::to_string(warp) + " threads at a warp exchange or __syncwarp, " + std::to_string(block) +
         " at __syncthreads, " + std::to_string(done) + " exited";
}

bool same_site(const Site& a, const Site& b) {
  return a.line() == b.line() && a.column() == b.column() && std::strcmp(a.file_name(), b.file_name()) == 0;
}

std::string where(const Site& s) {
  const char* file = s.file_name();
  const char* slash = std::strrchr(file, '/');
  return std::string(slash != nullptr ? slash + 1 : file) + ":" + std::to_string(s.line());
}

// Releases what can go on: the whole block at __syncthreads once every live thread is there;
// a warp at an exchange once every live lane of it is. Returns false with `why` on a deadlock,
// threads waiting at different barriers or warp operations (or with different masks), or an
// exchange that names an exited lane.
bool release(Block& b, std::string& why) {
  bool any = false, all_block = true;
  const Lane* first_live = nullptr;
  for (const Lane& l : b.lanes) {
    if (l.state == State::kDone) continue;
    if (first_live == nullptr) first_live = &l;
    if (l.state != State::kBlock) all_block = false;
  }
  if (first_live == nullptr) return true;
  if (all_block) {
    for (const Lane& l : b.lanes)
      if (l.state == State::kBlock && !same_site(l.site, first_live->site)) {
        why = "threads wait at different __syncthreads (" + where(first_live->site) + " and " + where(l.site) + ")";
        return false;
      }
    for (Lane& l : b.lanes)
      if (l.state == State::kBlock) l.state = State::kReady;
    return true;
  }
  const int n = static_cast<int>(b.lanes.size());
  for (int w0 = 0; w0 < n; w0 += 32) {
    const int w1 = std::min(n, w0 + 32);
    bool all_warp = true;
    const Lane* lead = nullptr;  // the warp's first live lane
    for (int i = w0; i < w1; ++i) {
      const Lane& l = b.lanes[static_cast<size_t>(i)];
      if (l.state == State::kDone) continue;
      if (lead == nullptr) lead = &l;
      if (l.state != State::kWarp) all_warp = false;
    }
    if (lead == nullptr || !all_warp) continue;
    const unsigned mask = lead->mask;
    for (int i = w0; i < w1; ++i) {
      const Lane& l = b.lanes[static_cast<size_t>(i)];
      if (l.state == State::kDone) continue;
      if (!same_site(l.site, lead->site)) {
        why = "the lanes of warp " + std::to_string(w0 / 32) + " wait at different warp operations (" +
              where(lead->site) + " and " + where(l.site) + ")";
        return false;
      }
      if (l.mask != mask) {
        char masks[64];
        std::snprintf(masks, sizeof masks, "0x%08x and 0x%08x", mask, l.mask);
        why = "the lanes of warp " + std::to_string(w0 / 32) + " pass different masks (" + masks + ") at " +
              where(l.site);
        return false;
      }
      if (!(mask >> (i - w0) & 1u)) {
        why = "lane " + std::to_string(i - w0) + " of warp " + std::to_string(w0 / 32) +
              " is not in the mask it passes at " + where(l.site);
        return false;
      }
    }
    for (int bit = 0; bit < 32; ++bit) {
      if (!(mask >> bit & 1u)) continue;
      const int i = w0 + bit;
      if (i >= w1 || b.lanes[static_cast<size_t>(i)].state == State::kDone) {
        why = "warp " + std::to_string(w0 / 32) + " exchanges with lane " + std::to_string(bit) +
              (i >= w1 ? ", which does not exist (block size not a multiple of 32)" : ", which has exited");
        return false;
      }
    }
    for (int i = w0; i < w1; ++i)
      if (b.lanes[static_cast<size_t>(i)].state == State::kWarp) b.lanes[static_cast<size_t>(i)].state = State::kReady;
    any = true;
  }
  if (!any) why = "deadlock: " + states_of(b);
  return any;
}

// Runs one block; false (reported) when it cannot finish.
bool run_block(Block& b, const std::function<void()>& body) {
  for (Lane& l : b.lanes) {
    l.state = State::kReady;
    l.waited = false;
    l.fault = nullptr;
    l.exchanges = 0;
    l.mask = 0;
    Lane* lp = &l;
    l.fiber = ctx::fiber(std::allocator_arg, PooledStack(), [lp, &body](ctx::fiber&& back) {
      switch_done(nullptr, &t_sched_bottom, &t_sched_size);
      lp->back = std::move(back);
      set_lane(lp);
      try {
        body();
      } catch (...) {  // (unwound: a failed kernel)
        switch_start(nullptr, t_sched_bottom, t_sched_size);
        throw;
      }
      lp->state = State::kDone;
      switch_start(nullptr, t_sched_bottom, t_sched_size);  // (this stack is done)
      return std::move(lp->back);
    });
    l.stack = g_last_stack;
  }
  t_block = &b;
  const bool forward = schedule().kind == Schedule::kForward;
  std::vector<uint32_t> order;
  for (;;) {
    bool live = false;
    if (!forward) schedule_order(order, b.lanes.size());
    for (size_t i = 0; i < b.lanes.size(); ++i) {
      Lane& l = b.lanes[forward ? i : order[i]];
      if (l.state != State::kReady) {
        live |= l.state != State::kDone;
        continue;
      }
      set_lane(&l);
      void* fake = nullptr;
      switch_start(&fake, l.stack, kStackBytes);
      l.fiber = std::move(l.fiber).resume();
      switch_done(fake, nullptr, nullptr);
      live |= l.state != State::kDone;
    }
    if (!live) break;
    std::string why;
    if (!release(b, why)) {
      kernel_failed(b.kernel, why.c_str());
      for (Lane& l : b.lanes) {  // unwinds the suspended threads
        if (!l.fiber) continue;
        void* fake = nullptr;
        switch_start(&fake, l.stack, kStackBytes);
        l.fiber = ctx::fiber();
        switch_done(fake, nullptr, nullptr);
      }
      set_lane(nullptr);
      return false;
    }
  }
  set_lane(nullptr);
  return true;
}

// How a block run without fibers ended.
enum class Direct { kDone, kRestart, kFailed };

// A block of a kernel whose first block reached no barrier: its threads run one after another
// as plain calls (no fiber to create and switch to: several times faster). If the block's first
// thread reaches a barrier (blocks that differ: the first one returned early), the block is run
// again with fibers: no other thread of it has run, and the first one redoes what it did before
// its first barrier (kernels write shared memory there, not global memory). A barrier reached by
// a later thread, after earlier ones finished without one, fails the kernel, loudly.
Direct run_direct(Block& b, const std::function<void()>& body) {
  t_block = &b;
  b.direct = true;
  Direct how = Direct::kDone;
  const bool forward = schedule().kind == Schedule::kForward;
  std::vector<uint32_t> order;
  if (!forward) schedule_order(order, b.lanes.size());
  for (size_t i = 0; i < b.lanes.size(); ++i) {
    Lane& l = b.lanes[forward ? i : order[i]];
    set_lane(&l);
    try {
      body();
    } catch (const DirectBarrier&) {
      if (i == 0) {
        how = Direct::kRestart;
        break;
      }
      kernel_failed(b.kernel, "a thread reached a barrier after the block's earlier threads exited without one");
      how = Direct::kFailed;
      break;
    }
  }
  b.direct = false;
  set_lane(nullptr);
  return how;
}

// Every thread must pass KITE_GRID_DEPENDENCY() (launch.cuh) before it touches global memory:
// with programmatic dependent launch, a GPU runs a kernel while the one before it still writes.
bool block_kept_rules(const Block& b) {
  for (const Lane& l : b.lanes) {
    const char* why = l.fault != nullptr ? l.fault
                      : !l.waited        ? "a thread returned without KITE_GRID_DEPENDENCY() (launch.cuh): launched "
                                           "programmatically it could run before the previous kernel's writes"
                                         : nullptr;
    if (why != nullptr) {
      kernel_failed(b.kernel, why);
      return false;
    }
  }
  return true;
}

std::string dims(dim3 d) { return std::to_string(d.x) + "x" + std::to_string(d.y) + "x" + std::to_string(d.z); }

}  // namespace

// ---- kernel language ----------------------------------------------------------------------
thread_local constinit ThreadState* t_thread = nullptr;
void sync_threads(Site site) { suspend(State::kBlock, site); }

void sync_warp(unsigned mask, Site site) {
  t_lane->mask = mask;
  suspend(State::kWarp, site);
}

uint64_t exchange(unsigned mask, uint64_t v, int src, Site site) {
  Lane* me = t_lane;
  const unsigned slot = me->exchanges++ & 1u;
  me->offer[slot] = v;
  me->mask = mask;
  suspend(State::kWarp, site);
  const size_t from = static_cast<size_t>(me->warp * 32 + src);
  if (src < 0 || src > 31 || from >= t_block->lanes.size()) return v;
  return t_block->lanes[from].offer[slot];
}

void* dynamic_shared() { return t_block->shared.data(); }

bool set_schedule(const std::string& how) {
  flush_all();  // work queued so far runs in the order it was queued under
  std::lock_guard lock(g_exec_mu);
  return parse_schedule(how, schedule());
}

void* static_shared(const void* tag, size_t bytes, size_t align) {
  Block& b = *t_block;
  for (const StaticShared& v : b.statics)
    if (v.tag == tag) return v.mem.get();
  // The first thread of the launch to reach this declaration allocates it.
  if (b.static_bytes + bytes + b.shared.size() > kMaxDynamicShared) {
    // nvcc refuses more than 48 KiB of static shared memory; with dynamic memory beside it the
    // launch fails.
    std::fprintf(stderr, "cuda-emu: %s uses %zu bytes of shared memory (%zu dynamic): more than %zu\n", b.kernel,
                 b.static_bytes + bytes + b.shared.size(), b.shared.size(), kMaxDynamicShared);
    std::abort();
  }
  align = std::max(align, alignof(std::max_align_t));
  StaticShared v{tag, bytes, {static_cast<uint8_t*>(::operator new[](bytes, std::align_val_t(align))), {align}}};
  std::memset(v.mem.get(), 0xff, bytes);
  b.static_bytes += bytes;
  b.statics.push_back(std::move(v));
  return b.statics.back().mem.get();
}

cudaError_t launch(dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t s, const char* name,
                   std::function<void()> body) {
  ++detail::g_launches;
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
  if (threads == 0 || threads > 1024 || block.x > 1024 || block.y > 1024 || block.z > 64 || grid.x == 0 ||
      grid.y == 0 || grid.z == 0 || grid.y > 65535 || grid.z > 65535 || grid.x > 0x7fffffffu) {
    std::fprintf(stderr, "cuda-emu: %s launched with grid %s, block %s: invalid configuration\n", name,
                 dims(grid).c_str(), dims(block).c_str());
    return fail(cudaErrorInvalidConfiguration);
  }
  if (shared_bytes > kMaxDynamicShared) {
    std::fprintf(stderr, "cuda-emu: %s asks for %zu bytes of dynamic shared memory (at most %zu)\n", name,
                 shared_bytes, kMaxDynamicShared);
    return fail(cudaErrorInvalidValue);
  }
  return enqueue(s, [grid, block, shared_bytes, name, body = std::move(body)] {
    Block b;
    b.kernel = name;
    b.lanes.resize(static_cast<size_t>(block.x) * block.y * block.z);
    b.shared.resize(shared_bytes);
    const bool forward = schedule().kind == Schedule::kForward;
    const size_t blocks = size_t{grid.x} * grid.y * grid.z;
    std::vector<uint32_t> order;
    if (!forward) schedule_order(order, blocks);
    for (size_t k = 0; k < blocks; ++k) {
      const size_t i = forward ? k : order[k];
      const auto bx = static_cast<unsigned>(i % grid.x), by = static_cast<unsigned>(i / grid.x % grid.y),
                 bz = static_cast<unsigned>(i / (size_t{grid.x} * grid.y));
      size_t t = 0;
      for (unsigned z = 0; z < block.z; ++z)
        for (unsigned y = 0; y < block.y; ++y)
          for (unsigned x = 0; x < block.x; ++x, ++t) {
            Lane& l = b.lanes[t];
            l.ids = ThreadIds{uint3{x, y, z}, uint3{bx, by, bz}, block, grid};
            l.lane = static_cast<int>(t % 32);
            l.warp = static_cast<int>(t / 32);
            l.waited = false;
            l.fault = nullptr;
          }
      fresh_shared(b);
      // The first block to run decides whether its threads need fibers (any barrier so far).
      Direct how = k == 0 || b.barriers > 0 ? Direct::kRestart : run_direct(b, body);
      if (how == Direct::kRestart) fresh_shared(b);  // (the first thread wrote some before its barrier)
      if (how == Direct::kFailed || (how == Direct::kRestart && !run_block(b, body))) return;
      if (!block_kept_rules(b)) return;
    }
  });
}

}  // namespace kite::cuda::emu

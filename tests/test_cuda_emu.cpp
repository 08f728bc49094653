// The CPU CUDA emulator itself (backends/cuda/emu, built with -DKITE_CUDA_EMU=ON): the CUDA
// backend's tests are only as good as its emulation, so its block/warp cooperation, its failure
// detection, its stream ordering, its graph capture, its warp matrix functions (wmma) and its
// mma.sync (backends/cuda/mma.cuh) are checked here with kernels written for the purpose.
#include <doctest/doctest.h>

#if defined(__SANITIZE_ADDRESS__)
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#endif

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backends/cuda/emu/include/mma.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/launch.cuh"
#include "backends/cuda/mma.cuh"
#include "backends/cuda/warp.cuh"

namespace {

using kite::cuda::emu::clear_failure;

__global__ void block_sum(const float* x, float* out, int n) {
  KITE_GRID_DEPENDENCY();
  KITE_SHARED(part, float[32]);
  const int t = threadIdx.x;
  const float* xb = x + static_cast<size_t>(blockIdx.x) * n;
  float v = 0.f;
  for (int i = t; i < n; i += blockDim.x) v += xb[i];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (t % 32 == 0) part[t / 32] = v;
  __syncthreads();
  if (t == 0) {
    float s = 0.f;
    for (unsigned w = 0; w < blockDim.x / 32; ++w) s += part[w];
    out[blockIdx.x] = s;
  }
}

constexpr int kLaneOps = 7;
__global__ void lane_ops(int* out) {
  KITE_GRID_DEPENDENCY();
  const int lane = threadIdx.x % 32;
  int* o = out + threadIdx.x * kLaneOps;
  o[0] = __shfl_down_sync(0xffffffffu, lane * 10, 3);
  o[1] = __shfl_sync(0xffffffffu, lane + 100, 5);
  o[2] = __shfl_xor_sync(0xffffffffu, lane, 17, 16);  // (lane mask beyond the 16-lane segment)
  // redux.sync (warp.cuh's integer reductions), and the |v| maximum through float bits.
  o[3] = __reduce_add_sync(0xffffffffu, lane - 20);
  o[4] = static_cast<int>(__reduce_max_sync(0xffffffffu, static_cast<unsigned>(lane * 7 % 32)));
  o[5] = __reduce_min_sync(0xffffffffu, lane == 9 ? -5 : lane);
  o[6] = __float_as_int(kite::cuda::warp_max_abs(lane == 13 ? -40.5f : lane * 0.5f));
}

__global__ void exited_lane(float* out) {
  KITE_GRID_DEPENDENCY();
  if (threadIdx.x == 7) return;
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.f, 1);
}

__global__ void split_barriers(float* out) {
  KITE_GRID_DEPENDENCY();
  if (threadIdx.x < 16) __syncthreads();
  else __syncwarp();
  out[threadIdx.x] = 1.f;
}

// Divergent warp operations and barriers: the lanes (threads) wait at different ones.
__global__ void divergent_shuffles(float* out) {
  KITE_GRID_DEPENDENCY();
  if (threadIdx.x % 2 == 0) out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.f, 1);
  else out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 2.f, 1);
}

__global__ void divergent_syncthreads(float* out) {
  KITE_GRID_DEPENDENCY();
  if (threadIdx.x < 32) {
    out[threadIdx.x] = 1.f;
    __syncthreads();
  } else {
    out[threadIdx.x] = 2.f;
    __syncthreads();
  }
}

// Half the warp passes a mask without the other half; then a mask without the lane itself.
__global__ void mismatched_masks(float* out) {
  KITE_GRID_DEPENDENCY();
  out[threadIdx.x] = __shfl_sync(threadIdx.x < 16 ? 0x0000ffffu : 0xffffffffu, 1.f, 0);
}
__global__ void mask_without_self(float* out) {
  KITE_GRID_DEPENDENCY();
  out[threadIdx.x] = __shfl_sync(0x0000ffffu, 1.f, 0);
}

// Programmatic dependent launch's rule (launch.cuh): KITE_GRID_DEPENDENCY() before anything else.
__global__ void no_grid_dependency(float* out) { out[threadIdx.x] = 1.f; }
__global__ void returns_before_dependency(float* out) {
  if (threadIdx.x >= 16) return;
  KITE_GRID_DEPENDENCY();
  out[threadIdx.x] = 1.f;
}
__global__ void shuffles_before_dependency(float* out) {
  const float v = __shfl_sync(0xffffffffu, 1.f, 0);
  KITE_GRID_DEPENDENCY();
  out[threadIdx.x] = v;
}
__global__ void prefetches_then_waits(const float* w, float* out, const float* bad) {
  KITE_PREFETCH_L2(bad != nullptr ? bad : w + threadIdx.x);
  KITE_GRID_DEPENDENCY();
  out[threadIdx.x] = w[threadIdx.x] + 1.f;
}

__global__ void add_one(float* x, int n) {
  KITE_GRID_DEPENDENCY();
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) x[i] += 1.f;
}

// Block 0 returns before any barrier; the others sum through shared memory.
__global__ void first_block_differs(const float* x, float* out) {
  KITE_GRID_DEPENDENCY();
  KITE_SHARED(part, float[64]);
  if (blockIdx.x == 0) {
    if (threadIdx.x == 0) out[0] = -1.f;
    return;
  }
  part[threadIdx.x] = x[blockIdx.x * 64 + threadIdx.x];
  __syncthreads();
  if (threadIdx.x == 0) {
    float s = 0.f;
    for (int i = 0; i < 64; ++i) s += part[i];
    out[blockIdx.x] = s;
  }
}

template <class T>
T* device_alloc(size_t n) {
  void* p = nullptr;
  REQUIRE(cudaMalloc(&p, n * sizeof(T)) == cudaSuccess);
  return static_cast<T*>(p);
}

template <class T>
T* to_device(const std::vector<T>& v) {
  T* p = device_alloc<T>(v.size());
  REQUIRE(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess);
  return p;
}

template <class T>
std::vector<T> read_back(const T* d, size_t n) {
  std::vector<T> h(n);
  REQUIRE(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
  return h;
}

}  // namespace

TEST_CASE("cuda-emu: warp shuffles, shared memory and __syncthreads cooperate as on a GPU") {
  const int n = 1000, blocks = 3;
  std::vector<float> x(static_cast<size_t>(n * blocks));
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(static_cast<float>(i)) + 0.25f;
  float* dx = device_alloc<float>(x.size());
  float* dout = device_alloc<float>(blocks);
  REQUIRE(cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess);
  KITE_KERNEL(blocks, 128, 0, nullptr, block_sum)(dx, dout, n);
  REQUIRE(cudaGetLastError() == cudaSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  const std::vector<float> got = read_back(dout, blocks);
  for (int b = 0; b < blocks; ++b) {
    double want = 0;
    for (int i = 0; i < n; ++i) want += x[static_cast<size_t>(b * n + i)];
    CHECK(got[static_cast<size_t>(b)] == doctest::Approx(want).epsilon(1e-5));
  }

  int* dl = device_alloc<int>(64 * kLaneOps);
  KITE_KERNEL(1, 64, 0, nullptr, lane_ops)(dl);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  const std::vector<int> l = read_back(dl, 64 * kLaneOps);
  for (int t = 0; t < 64; ++t) {
    const int lane = t % 32;
    const int* o = &l[static_cast<size_t>(t * kLaneOps)];
    CHECK(o[0] == (lane + 3 < 32 ? (lane + 3) * 10 : lane * 10));
    CHECK(o[1] == 105);
    CHECK(o[2] == lane);  // 17 leaves the 16-lane segment: own value
    CHECK(o[3] == 496 - 20 * 32);
    CHECK(o[4] == 31);
    CHECK(o[5] == -5);
    float m;
    std::memcpy(&m, &o[6], 4);
    CHECK(m == 40.5f);
  }
  cudaFree(dx), cudaFree(dout), cudaFree(dl);
}

TEST_CASE("cuda-emu: an exited lane in a shuffle, divergent or unmatched barriers and masks, a host pointer, a kernel without its grid dependency fail the kernel, stickily") {
  float* d = device_alloc<float>(64);
  KITE_KERNEL(1, 32, 0, nullptr, exited_lane)(d);
  CHECK(cudaGetLastError() == cudaSuccess);  // (a launch error would show here; this one runs later)
  CHECK(cudaDeviceSynchronize() == cudaErrorLaunchFailure);
  CHECK(cudaDeviceSynchronize() == cudaErrorLaunchFailure);  // sticky, as on a GPU
  clear_failure();
  const struct {
    void (*kernel)(float*);
    int threads;
  } failing[] = {{split_barriers, 32},   {divergent_shuffles, 32}, {divergent_syncthreads, 64},
                 {mismatched_masks, 32}, {mask_without_self, 32}, {no_grid_dependency, 32},
                 {returns_before_dependency, 32}, {shuffles_before_dependency, 32}};
  for (const auto& f : failing) {
    KITE_KERNEL(1, f.threads, 0, nullptr, f.kernel)(d);
    CHECK(cudaDeviceSynchronize() == cudaErrorLaunchFailure);
    clear_failure();
  }
  // A prefetch (of weights, before the grid dependency) is fine in device memory, a fault outside.
  float* w = to_device(std::vector<float>(32, 0.f));
  KITE_KERNEL(1, 32, 0, nullptr, prefetches_then_waits)(w, d, nullptr);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(read_back(d, 32)[31] == 1.f);
  KITE_KERNEL(1, 32, 0, nullptr, prefetches_then_waits)(w, d, w + 32);  // one past the allocation
  CHECK(cudaDeviceSynchronize() == cudaErrorLaunchFailure);
  clear_failure();
  cudaFree(w);
  std::vector<float> host(32, 0.f);  // a host address passed to a kernel would fault on a GPU
  KITE_KERNEL(1, 32, 0, nullptr, add_one)(host.data(), 32);
  CHECK(cudaDeviceSynchronize() == cudaErrorLaunchFailure);
  CHECK(host[0] == 0.f);
  clear_failure();
  // A block of 2048 threads is a launch error, and the kernel does not run.
  KITE_KERNEL(1, 2048, 0, nullptr, add_one)(d, 32);
  CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
  KITE_KERNEL(1, 32, 64 << 10, nullptr, add_one)(d, 32);  // 64 KiB of dynamic shared memory
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  CHECK(cudaDeviceSynchronize() == cudaSuccess);
  cudaFree(d);
}

TEST_CASE("cuda-emu: a block reaching barriers after a first block that reached none runs with fibers") {
  std::vector<float> x(64 * 5);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 7);
  const float* dx = to_device(x);
  float* d = device_alloc<float>(5);
  KITE_KERNEL(5, 64, 0, nullptr, first_block_differs)(dx, d);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  const std::vector<float> got = read_back(d, 5);
  CHECK(got[0] == -1.f);
  for (int b = 1; b < 5; ++b) {
    float s = 0.f;
    for (int i = 0; i < 64; ++i) s += x[static_cast<size_t>(b * 64 + i)];
    CHECK(got[static_cast<size_t>(b)] == s);
  }
  CHECK(cudaFree(const_cast<float*>(dx)) == cudaSuccess);
  CHECK(cudaFree(d) == cudaSuccess);
}

namespace {

// Each thread writes its own slot, then reads slot t + step: with the barrier, the neighbour's
// value; without it, a race whose outcome depends on which thread runs first.
__global__ void read_neighbour(float* out, int step, int barrier) {
  KITE_GRID_DEPENDENCY();
  KITE_SHARED(slot, float[64]);
  const int t = static_cast<int>(threadIdx.x);
  slot[t] = static_cast<float>(t);
  if (barrier) __syncthreads();
  out[blockIdx.x * 64 + t] = slot[(t + step + 64) % 64];
}

// Block b reads what block b - 1 of the same launch wrote: an order no GPU promises.
__global__ void read_previous_block(float* x) { KITE_GRID_DEPENDENCY(); x[blockIdx.x + 1] = x[blockIdx.x] + 1.f; }

// Reads shared memory before writing it (static, then dynamic): on a GPU whatever an earlier
// block left there.
__global__ void read_before_write(float* out) {
  KITE_GRID_DEPENDENCY();
  KITE_SHARED(v, float);
  KITE_DYNAMIC_SHARED(float, dyn);
  out[2 * blockIdx.x] = v;
  out[2 * blockIdx.x + 1] = dyn[0];
  v = 1.f;
  dyn[0] = 2.f;
}

int nans(const std::vector<float>& v) {
  return static_cast<int>(std::count_if(v.begin(), v.end(), [](float f) { return std::isnan(f); }));
}

}  // namespace

TEST_CASE("cuda-emu: every block starts with unwritten shared memory, and KITE_CUDA_EMU_SCHEDULE's orders expose races") {
  using kite::cuda::emu::set_schedule;
  float* d = device_alloc<float>(4 * 64);
  KITE_KERNEL(4, 1, sizeof(float), nullptr, read_before_write)(d);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(nans(read_back(d, 8)) == 8);  // not the 1 and 2 of the block before

  // Reading slot t + 1 without a barrier: every thread but the last reads before its neighbour
  // writes in the default order (NaN); reading t - 1 hides the race there and shows it in reverse.
  auto run = [&](const char* schedule, int step, int barrier) {
    REQUIRE(set_schedule(schedule));
    KITE_KERNEL(2, 64, 0, nullptr, read_neighbour)(d, step, barrier);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    return read_back(d, 2 * 64);
  };
  CHECK(nans(run("forward", 1, 0)) == 2 * 63);
  CHECK(nans(run("forward", -1, 0)) == 2);  // (thread 0 reads slot 63, not written yet)
  CHECK(nans(run("reverse", -1, 0)) == 2 * 63);
  CHECK(nans(run("shuffle:5", -1, 0)) > 2);
  CHECK(nans(run("shuffle:5", 1, 0)) > 2);
  for (const char* schedule : {"forward", "reverse", "shuffle:5"}) {
    const std::vector<float> got = run(schedule, 1, 1);
    CHECK(nans(got) == 0);
    CHECK(got[64 + 63] == 0.f);
  }

  std::vector<float> chain(9, -100.f);
  chain[0] = 0.f;
  float* dc = to_device(chain);
  for (const char* schedule : {"forward", "reverse"}) {
    REQUIRE(set_schedule(schedule));
    REQUIRE(cudaMemcpy(dc, chain.data(), chain.size() * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
    KITE_KERNEL(8, 1, 0, nullptr, read_previous_block)(dc);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    CHECK((read_back(dc, 9)[8] == 8.f) == (std::string(schedule) == "forward"));
  }
  CHECK_FALSE(set_schedule("backwards"));
  const char* env = std::getenv("KITE_CUDA_EMU_SCHEDULE");
  REQUIRE(set_schedule(env != nullptr ? env : "forward"));  // what the rest of the run asked for
  CHECK(cudaFree(d) == cudaSuccess);
  CHECK(cudaFree(dc) == cudaSuccess);
}

#if defined(__SANITIZE_ADDRESS__)
// Built with KITE_CUDA_EMU_SANITIZE: the two faults a GPU reports as "misaligned address" and
// "illegal memory access" end the process here with the sanitizer's report. Each probe runs in a
// forked child whose stderr goes to a file.
namespace {

__global__ void load_misaligned(const uint8_t* p, int* out) {
  KITE_GRID_DEPENDENCY();
  out[0] = *reinterpret_cast<const int*>(p + 2);
}
__global__ void read_past_end(const float* p, float* out, int n) { KITE_GRID_DEPENDENCY(); out[0] = p[n]; }
__global__ void read_past_shared(float* out, int n) {
  KITE_GRID_DEPENDENCY();
  KITE_SHARED(four, float[4]);
  for (int i = 0; i < 4; ++i) four[i] = 1.f;
  const float* p = four;  // (through a pointer: not UBSan's array-bounds check, ASan's)
  out[0] = p[n];
}

std::string child_fault(void (*probe)()) {
  const std::string log = std::string(KITE_BINARY_DIR) + "/test-scratch/sanitize-probe.err";
  std::filesystem::create_directories(std::filesystem::path(log).parent_path());
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 2);
    probe();
    _exit(0);  // (no fault: the parent's check fails)
  }
  int status = 0;
  waitpid(pid, &status, 0);
  std::ifstream in(log);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return (WIFEXITED(status) && WEXITSTATUS(status) == 0 ? "exited cleanly\n" : "") + text;
}

}  // namespace

TEST_CASE("cuda-emu: sanitized, a misaligned load and reads past an allocation or a shared array end the run with a report") {
  const std::string misaligned = child_fault([] {
    uint8_t* p = device_alloc<uint8_t>(16);
    int* out = device_alloc<int>(1);
    KITE_KERNEL(1, 1, 0, nullptr, load_misaligned)(p, out);
    cudaDeviceSynchronize();
  });
  CHECK(misaligned.find("misaligned address") != std::string::npos);
  CHECK(misaligned.find("test_cuda_emu.cpp") != std::string::npos);  // (UBSan names the line)
  const std::string past = child_fault([] {
    float* p = device_alloc<float>(10);
    float* out = device_alloc<float>(1);
    KITE_KERNEL(1, 1, 0, nullptr, read_past_end)(p, out, 10);
    cudaDeviceSynchronize();
  });
  CHECK(past.find("heap-buffer-overflow") != std::string::npos);
  CHECK(past.find("read_past_end") != std::string::npos);
  const std::string shared = child_fault([] {
    float* out = device_alloc<float>(1);
    KITE_KERNEL(1, 1, 0, nullptr, read_past_shared)(out, 4);
    cudaDeviceSynchronize();
  });
  CHECK(shared.find("heap-buffer-overflow") != std::string::npos);
  CHECK(shared.find("read_past_shared") != std::string::npos);
}
#endif

TEST_CASE("cuda-emu: stream work runs at synchronization, fresh memory is NaN, copies check their pointers") {
  cudaStream_t s = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  float* d = device_alloc<float>(4);
  const std::vector<float> fresh = read_back(d, 4);
  CHECK(std::isnan(fresh[0]));
  void* pinned = nullptr;
  REQUIRE(cudaMallocHost(&pinned, 16) == cudaSuccess);
  auto* h = static_cast<float*>(pinned);
  for (int i = 0; i < 4; ++i) h[i] = 1.f;
  REQUIRE(cudaMemcpyAsync(d, h, 16, cudaMemcpyHostToDevice, s) == cudaSuccess);
  h[0] = 5.f;  // before the copy ran: a GPU may read the buffer any time until the stream syncs
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK(read_back(d, 4)[0] == 5.f);
  // Kinds that do not match the pointers are errors.
  CHECK(cudaMemcpy(h, d, 16, cudaMemcpyHostToDevice) == cudaErrorInvalidValue);
  CHECK(cudaMemcpy(d, h, 16, cudaMemcpyDeviceToDevice) == cudaErrorInvalidValue);
  CHECK(cudaMemcpy(d, h, 32, cudaMemcpyHostToDevice) == cudaErrorInvalidValue);  // past the allocation
  cudaGetLastError();
  cudaFreeHost(pinned);
  cudaFree(d);
  cudaStreamDestroy(s);
}

TEST_CASE("cuda-emu: a captured graph replays its work, syncing or pageable copies invalidate a capture") {
  cudaStream_t s = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  const int n = 100;
  float* d = device_alloc<float>(n);
  REQUIRE(cudaMemsetAsync(d, 0, n * 4, s) == cudaSuccess);
  REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed) == cudaSuccess);
  KITE_KERNEL(1, 128, 0, s, add_one)(d, n);
  cudaGraph_t g = nullptr;
  REQUIRE(cudaStreamEndCapture(s, &g) == cudaSuccess);
  cudaGraphExec_t e = nullptr;
  REQUIRE(cudaGraphInstantiate(&e, g, 0) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK(read_back(d, n)[0] == 0.f);  // captured, not run
  REQUIRE(cudaGraphLaunch(e, s) == cudaSuccess);
  REQUIRE(cudaGraphLaunch(e, s) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK(read_back(d, n)[n - 1] == 2.f);
  cudaGraphExecDestroy(e);
  cudaGraphDestroy(g);

  std::vector<float> pageable(n, 3.f);
  REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed) == cudaSuccess);
  CHECK(cudaMemcpyAsync(d, pageable.data(), n * 4, cudaMemcpyHostToDevice, s) == cudaErrorStreamCaptureUnsupported);
  CHECK(cudaStreamEndCapture(s, &g) == cudaErrorStreamCaptureInvalidated);
  REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed) == cudaSuccess);
  CHECK(cudaStreamSynchronize(s) == cudaErrorStreamCaptureUnsupported);
  CHECK(cudaStreamEndCapture(s, &g) == cudaErrorStreamCaptureInvalidated);
  cudaGetLastError();
  cudaFree(d);
  cudaStreamDestroy(s);
}

// ---- the warp matrix functions (emu/include/mma.h) ------------------------------------------
namespace {

// One warp: d = a * b + c for 16x16x16 (A row major, B column major, C row major in, D column
// major out) and 32x8x16 (A column major, B row major, C column major in, D row major out), with
// strides wider than the tiles.
constexpr unsigned kLdA = 32, kLdB = 48, kLdC = 36, kLdD = 24;

__global__ void wmma_probe(const signed char* a, const signed char* b, const int* c, int* d, int* d2) {
  KITE_GRID_DEPENDENCY();
  using namespace nvcuda;
  wmma::fragment<wmma::matrix_a, 16, 16, 16, signed char, wmma::row_major> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, signed char, wmma::col_major> fb;
  wmma::fragment<wmma::accumulator, 16, 16, 16, int> fc;
  wmma::load_matrix_sync(fa, a, kLdA);
  wmma::load_matrix_sync(fb, b, kLdB);
  wmma::load_matrix_sync(fc, c, kLdC, wmma::mem_row_major);
  wmma::mma_sync(fc, fa, fb, fc);
  wmma::store_matrix_sync(d, fc, kLdD, wmma::mem_col_major);

  wmma::fragment<wmma::matrix_a, 32, 8, 16, signed char, wmma::col_major> ga;
  wmma::fragment<wmma::matrix_b, 32, 8, 16, signed char, wmma::row_major> gb;
  wmma::fragment<wmma::accumulator, 32, 8, 16, int> gc;
  wmma::load_matrix_sync(ga, a, kLdA);  // A: 32 x 16, element (i, e) at a[e * kLdA + i]
  wmma::load_matrix_sync(gb, b, kLdB);  // B: 16 x 8, element (e, j) at b[e * kLdB + j]
  wmma::load_matrix_sync(gc, c, kLdC, wmma::mem_col_major);
  wmma::mma_sync(gc, ga, gb, gc);
  wmma::store_matrix_sync(d2, gc, kLdD, wmma::mem_row_major);
}

// Each breaks one rule of the warp matrix functions.
__global__ void wmma_misaligned(const signed char* a) {
  KITE_GRID_DEPENDENCY();
  nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 16, signed char, nvcuda::wmma::row_major> fa;
  nvcuda::wmma::load_matrix_sync(fa, a + 16, kLdA);  // 128-bit aligned only
}

__global__ void wmma_odd_stride(int* d) {
  KITE_GRID_DEPENDENCY();
  nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, int> fc;
  nvcuda::wmma::fill_fragment(fc, 0);
  nvcuda::wmma::store_matrix_sync(d, fc, 18, nvcuda::wmma::mem_row_major);  // 72 bytes a row
}

__global__ void wmma_lanes_disagree(const signed char* a) {
  KITE_GRID_DEPENDENCY();
  nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 16, signed char, nvcuda::wmma::row_major> fa;
  nvcuda::wmma::load_matrix_sync(fa, a + 32 * (threadIdx.x / 16), kLdA);
}

__global__ void wmma_half_warp(const signed char* a) {
  KITE_GRID_DEPENDENCY();
  nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 16, signed char, nvcuda::wmma::row_major> fa;
  if (threadIdx.x < 16) nvcuda::wmma::load_matrix_sync(fa, a, kLdA);
}

}  // namespace

TEST_CASE("cuda-emu: wmma follows the programming guide's layouts (emu/include/mma.h)") {
  std::mt19937 g(9400);
  std::uniform_int_distribution<int> i8(-128, 127), i32(-100000, 100000);
  std::vector<signed char> a(kLdA * 32), b(kLdB * 16);
  std::vector<int> c(kLdC * 32), d(kLdD * 32, -1), d2(kLdD * 32, -1);
  for (auto& v : a) v = static_cast<signed char>(i8(g));
  for (auto& v : b) v = static_cast<signed char>(i8(g));
  for (auto& v : c) v = i32(g);
  signed char* da = to_device(a);
  signed char* db = to_device(b);
  int* dc = to_device(c);
  int* dd = to_device(d);
  int* dd2 = to_device(d2);
  KITE_KERNEL(1, 32, 0, nullptr, wmma_probe)(da, db, dc, dd, dd2);
  REQUIRE(cudaGetLastError() == cudaSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  REQUIRE(cudaMemcpy(d.data(), dd, d.size() * sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess);
  REQUIRE(cudaMemcpy(d2.data(), dd2, d2.size() * sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess);
  for (void* p : {static_cast<void*>(da), static_cast<void*>(db), static_cast<void*>(dc), static_cast<void*>(dd),
                  static_cast<void*>(dd2)})
    CHECK(cudaFree(p) == cudaSuccess);

  int bad = 0;
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j) {
      int64_t s = c[i * kLdC + j];
      for (int e = 0; e < 16; ++e) s += a[i * kLdA + e] * b[j * kLdB + e];
      bad += d[j * kLdD + i] != static_cast<int>(s);
    }
  CHECK(bad == 0);
  bad = 0;
  for (int i = 0; i < 32; ++i)
    for (int j = 0; j < 8; ++j) {
      int64_t s = c[j * kLdC + i];
      for (int e = 0; e < 16; ++e) s += a[e * kLdA + i] * b[e * kLdB + j];
      bad += d2[i * kLdD + j] != static_cast<int>(s);
    }
  CHECK(bad == 0);
  // Outside the tiles' stride gaps nothing was written.
  CHECK(d[16] == -1);
  CHECK(d2[8] == -1);
}

// d = a * b + c for half a (row major), b (column major) and float c; then each element of d
// scaled by f[its row], the row learned from a fragment loaded from a matrix of row numbers.
__global__ void wmma_half_probe(const __half* a, const __half* b, const float* c, const float* rows, const float* f,
                                float* d, float* ds) {
  KITE_GRID_DEPENDENCY();
  namespace wmma = nvcuda::wmma;
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> fb;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc, fr;
  wmma::load_matrix_sync(fa, a, 16);
  wmma::load_matrix_sync(fb, b, 16);
  wmma::load_matrix_sync(fc, c, 16, wmma::mem_row_major);
  wmma::mma_sync(fc, fa, fb, fc);
  wmma::store_matrix_sync(d, fc, 16, wmma::mem_row_major);
  wmma::load_matrix_sync(fr, rows, 16, wmma::mem_row_major);
  for (int k = 0; k < fc.num_elements; ++k) fc.x[k] *= f[static_cast<int>(fr.x[k])];
  wmma::store_matrix_sync(ds, fc, 16, wmma::mem_col_major);
}

TEST_CASE("cuda-emu: wmma with half inputs accumulates in float, and scales per row through a row-number fragment") {
  std::mt19937 g(9500);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<__half> a(256), b(256);
  std::vector<float> c(256), rows(256), f(16);
  for (auto& v : a) v = __float2half(nd(g));
  for (auto& v : b) v = __float2half(nd(g));
  for (auto& v : c) v = nd(g);
  for (int i = 0; i < 256; ++i) rows[static_cast<size_t>(i)] = static_cast<float>(i / 16);
  for (int i = 0; i < 16; ++i) f[static_cast<size_t>(i)] = 0.5f + static_cast<float>(i);
  const __half* da = to_device(a);
  const __half* db = to_device(b);
  const float* dc = to_device(c);
  const float* dr = to_device(rows);
  const float* df = to_device(f);
  float* dd = device_alloc<float>(256);
  float* dds = device_alloc<float>(256);
  KITE_KERNEL(1, 32, 0, nullptr, wmma_half_probe)(da, db, dc, dr, df, dd, dds);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  const std::vector<float> d = read_back(dd, 256), ds = read_back(dds, 256);
  double worst = 0, worst_scaled = 0;
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j) {
      double s = c[static_cast<size_t>(i * 16 + j)];
      for (int e = 0; e < 16; ++e)
        s += static_cast<double>(__half2float(a[static_cast<size_t>(i * 16 + e)])) *
             __half2float(b[static_cast<size_t>(j * 16 + e)]);
      worst = std::max(worst, std::abs(d[static_cast<size_t>(i * 16 + j)] - s));
      worst_scaled = std::max(worst_scaled, std::abs(ds[static_cast<size_t>(j * 16 + i)] - s * f[static_cast<size_t>(i)]));
    }
  CHECK(worst < 1e-4);
  CHECK(worst_scaled < 2e-3);
  for (const void* p : {static_cast<const void*>(da), static_cast<const void*>(db), static_cast<const void*>(dc),
                        static_cast<const void*>(dr), static_cast<const void*>(df), static_cast<const void*>(dd),
                        static_cast<const void*>(dds)})
    CHECK(cudaFree(const_cast<void*>(p)) == cudaSuccess);
}

TEST_CASE("cuda-emu: wmma fails the kernel on a misaligned pointer, a bad stride, a partial or split warp") {
  signed char* a = to_device(std::vector<signed char>(kLdA * 32, 1));
  int* d = to_device(std::vector<int>(18 * 16, 0));
  KITE_KERNEL(1, 32, 0, nullptr, wmma_misaligned)(a);
  CHECK(cudaDeviceSynchronize() == cudaErrorLaunchFailure);
  kite::cuda::emu::clear_failure();
  KITE_KERNEL(1, 32, 0, nullptr, wmma_odd_stride)(d);
  CHECK(cudaDeviceSynchronize() == cudaErrorLaunchFailure);
  kite::cuda::emu::clear_failure();
  KITE_KERNEL(1, 32, 0, nullptr, wmma_lanes_disagree)(a);
  CHECK(cudaDeviceSynchronize() == cudaErrorLaunchFailure);
  kite::cuda::emu::clear_failure();
  KITE_KERNEL(1, 32, 0, nullptr, wmma_half_warp)(a);
  CHECK(cudaDeviceSynchronize() == cudaErrorLaunchFailure);
  kite::cuda::emu::clear_failure();
  CHECK(cudaDeviceSynchronize() == cudaSuccess);  // (cleared; the probe above is the passing case)
  CHECK(cudaFree(a) == cudaSuccess);
  CHECK(cudaFree(d) == cudaSuccess);
}

// ---- mma.sync with 8-bit inputs (backends/cuda/mma.cuh, emu/ptx_mma.h) ------------------------
namespace {

// One warp per block: each lane gathers its registers of A (16 x 32, row major, a[i * 32 + e]),
// B (32 x 8, column major, b[j * 32 + e]) and C (16 x 8, row major) by mma.cuh's layout table,
// multiplies (block 0: one m16n8k32; block 1: two m16n8k16, one per half of k) and scatters D.
__global__ void mma_probe(const signed char* a, const signed char* b, const int* c, int* d) {
  KITE_GRID_DEPENDENCY();
  const int lane = threadIdx.x, g = lane / 4, t = lane % 4;
  auto word = [](const signed char* p) {
    int v;
    std::memcpy(&v, p, 4);
    return v;
  };
  const int ra[4] = {word(a + g * 32 + 4 * t), word(a + (g + 8) * 32 + 4 * t), word(a + g * 32 + 16 + 4 * t),
                     word(a + (g + 8) * 32 + 16 + 4 * t)};
  const int rb[2] = {word(b + g * 32 + 4 * t), word(b + g * 32 + 16 + 4 * t)};
  const int at[4] = {g * 8 + 2 * t, g * 8 + 2 * t + 1, (g + 8) * 8 + 2 * t, (g + 8) * 8 + 2 * t + 1};
  int acc[4];
  for (int i = 0; i < 4; ++i) acc[i] = c[at[i]];
  if (blockIdx.x == 0) {
    kite::cuda::mma_s8_k32(acc, ra, rb);
  } else {
    kite::cuda::mma_s8_k16(acc, ra[0], ra[1], rb[0]);
    kite::cuda::mma_s8_k16(acc, ra[2], ra[3], rb[1]);
  }
  for (int i = 0; i < 4; ++i) d[blockIdx.x * 128 + at[i]] = acc[i];
}

__global__ void mma_half_warp(int* d) {
  KITE_GRID_DEPENDENCY();
  int acc[4] = {0, 0, 0, 0};
  const int a[4] = {1, 1, 1, 1}, b[2] = {1, 1};
  if (threadIdx.x < 16) kite::cuda::mma_s8_k32(acc, a, b);
  d[threadIdx.x] = acc[0];
}

}  // namespace

TEST_CASE("cuda-emu: mma.sync s8 follows the PTX fragment layouts, wraps like int32, needs the whole warp") {
  std::mt19937 gen(9500);
  std::uniform_int_distribution<int> i8(-128, 127), i32(-100000, 100000);
  std::vector<signed char> a(16 * 32), b(8 * 32);
  std::vector<int> c(16 * 8), d(2 * 128, -1);
  for (auto& v : a) v = static_cast<signed char>(i8(gen));
  for (auto& v : b) v = static_cast<signed char>(i8(gen));
  for (auto& v : c) v = i32(gen);
  c[5] = 0x7fffffff;  // (A row 0 and B column 5 all 127: the sum overflows and wraps)
  for (int e = 0; e < 32; ++e) a[e] = b[5 * 32 + e] = 127;
  signed char* da = to_device(a);
  signed char* db = to_device(b);
  int* dc = to_device(c);
  int* dd = to_device(d);
  KITE_KERNEL(2, 32, 0, nullptr, mma_probe)(da, db, dc, dd);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  REQUIRE(cudaMemcpy(d.data(), dd, d.size() * sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess);
  int bad = 0;
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 8; ++j) {
      int64_t s = c[i * 8 + j];
      for (int e = 0; e < 32; ++e) s += a[i * 32 + e] * b[j * 32 + e];
      const int want = static_cast<int>(static_cast<uint32_t>(static_cast<uint64_t>(s)));
      bad += (d[i * 8 + j] != want) + (d[128 + i * 8 + j] != want);
    }
  CHECK(bad == 0);
  CHECK(d[5] < 0);  // wrapped

  KITE_KERNEL(1, 32, 0, nullptr, mma_half_warp)(dd);
  CHECK(cudaDeviceSynchronize() == cudaErrorLaunchFailure);
  kite::cuda::emu::clear_failure();
  for (void* p : {static_cast<void*>(da), static_cast<void*>(db), static_cast<void*>(dc), static_cast<void*>(dd)})
    CHECK(cudaFree(p) == cudaSuccess);
}

// The split-k plan mmq takes (k_mmq.cu): the emulator shapes test_cuda_matmul.cpp relies on to run
// its split path, and the plan on an H200's 132 SMs for Llama-3-8B's shapes.
TEST_CASE("cuda-emu: mmq splits over k only when its blocks would leave SMs idle") {
  using kite::cuda::mmq_splits;
  CHECK(mmq_splits(512, 37, 16, 4) == 2);    // one block; 4 steps allow 2 ranges
  CHECK(mmq_splits(1024, 37, 20, 4) == 4);   // one block; 8 steps allow 4
  CHECK(mmq_splits(864, 70, 40, 4) == 3);    // 2 blocks want 4; 7 steps allow 3
  CHECK(mmq_splits(1280, 70, 40, 4) == 4);   // 2 blocks want 4
  CHECK(mmq_splits(256, 70, 17, 4) == 1);    // 2 steps: never split
  CHECK(mmq_splits(4096, 4096, 64, 132) == 4);    // 64 blocks: 4 ranges fill 2 per SM
  CHECK(mmq_splits(4096, 1024, 16, 132) == 16);   // 16 blocks: capped at 16 ranges
  CHECK(mmq_splits(4096, 4096, 256, 132) == 1);   // 256 blocks already fill the SMs
  CHECK(mmq_splits(4096, 14336, 64, 132) == 1);   // 224 blocks
}

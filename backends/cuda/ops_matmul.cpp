// kite/backends/cuda/ops_matmul.cpp — mul_mat's matrix path (ops_matmul.h): more than
// kMaxMmvCols activation columns of quantized weights on the int8 tensor-core kernel (launch_mmq,
// split over k when its blocks alone would leave SMs idle) or dequantized chunk by chunk into
// scratch for cuBLAS (F16 x F16 -> F32 on tensor cores), whichever ran faster when the shape was
// first timed; float weights on cuBLAS's f32 SGEMM (their results must match the CPU's f32 math
// closely).
#include "backends/cuda/ops_matmul.h"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/kernels.h"
#include "formats/quant/types.h"

namespace kite::cuda {
namespace {

constexpr size_t kWeightChunkElems = size_t{64} << 20;  // dequantized weight scratch (elements)

// Quantized weights with more than kMaxMmvCols activation columns run one of two ways: the int8
// tensor-core kernel (launch_mmq, never below sm_80, which lacks its mma.sync shapes), which
// reads the weights in place, or the weights dequantized to F16 chunk by chunk for cuBLAS. Which
// is faster depends on the card, the weight type and the shape, so the first time a shape (the
// device, the type, k, m, and the columns rounded up to a power of two) runs outside a graph
// capture, it runs both ways, once each to warm up (cuBLAS opens, scratch grows) and then twice
// each in the order cuBLAS, mmq, mmq, cuBLAS, with the activations' conversion counted in (mmq's
// int8 quantization, cuBLAS's F16 one) and the weights read from device memory (L2 flushed
// before each). The faster run of each decides, and the shape takes that way in this process
// from then on (its last run leaves that way's bits in the output). An undecided shape during a
// capture takes mmq up to kMmqMaxCols columns. KITE_CUDA_MMQ=0 never takes mmq, =1 always (read
// per call, so tests can switch it), and neither times anything.
constexpr int64_t kMmqMaxCols = 256;

struct MmqShape {
  int device;
  DType type;
  int64_t k, m, cols;
  auto operator<=>(const MmqShape&) const = default;
};
std::mutex g_mmq_mu;
std::map<MmqShape, MatmulChoice> g_mmq_choices;  // guarded by g_mmq_mu

MmqShape mmq_shape(const Device& dev, const Tensor* n) {
  const Tensor* w = n->src[0];
  return {dev.index(), w->type, w->ne[0], w->ne[1], static_cast<int64_t>(std::bit_ceil(
                                                        static_cast<uint64_t>(n->src[1]->n_rows())))};
}

// KITE_CUDA_MMQ: 0 or 1 where it forces a way, else -1.
int mmq_forced() {
  const char* env = std::getenv("KITE_CUDA_MMQ");
  if (env != nullptr && (env[0] == '0' || env[0] == '1') && env[1] == '\0') return env[0] - '0';
  return -1;
}

// Whether n takes launch_mmq: never below sm_80, else as KITE_CUDA_MMQ forces or as its shape
// timed; nullopt where that is still to be timed.
std::optional<bool> mmq_known(const Device& dev, const Tensor* n) {
  if (dev.compute_capability() < 80) return false;
  if (const int f = mmq_forced(); f >= 0) return f == 1;
  std::lock_guard<std::mutex> lock(g_mmq_mu);
  const auto it = g_mmq_choices.find(mmq_shape(dev, n));
  if (it == g_mmq_choices.end()) return std::nullopt;
  return it->second.mmq;
}

bool mmq_by_default(const Tensor* n) { return n->src[1]->n_rows() <= kMmqMaxCols; }

// A quantized matmul of more than kMaxMmvCols columns on launch_mmq, without its bias.
Status mul_mat_mmq(Device& dev, OpScratch& sc, Tensor* n, const Activations& act) {
  const Tensor* w = n->src[0];
  const int64_t k = w->ne[0], m = w->ne[1], cols = n->src[1]->n_rows();
  KITE_ASSIGN_OR_RETURN(uint8_t * wp, dev.address(w));
  KITE_ASSIGN_OR_RETURN(uint8_t * dp, dev.address(n));
  KITE_ASSIGN_OR_RETURN(const Int8Activations q, int8_activations(dev, sc, n->src[1], act));
  float* partial = nullptr;
  if (const int splits = mmq_splits(k, m, cols, dev.sm_count()); splits > 1) {
    KITE_ASSIGN_OR_RETURN(void* pp, dev.scratch(sc.split, static_cast<size_t>(splits * m * cols) * sizeof(float),
                                                "split-k partial sums"));
    partial = static_cast<float*>(pp);
  }
  KITE_LAUNCH(launch_mmq(tid(w->type), wp, w->nb[1], k, m, q.q, q.ds, cols, reinterpret_cast<float*>(dp),
                         static_cast<int64_t>(n->nb[1] / sizeof(float)), dev.sm_count(), partial, dev.stream()));
  return ok_status();
}

// A matmul of more than kMaxMmvCols columns on cuBLAS, without its bias: f32 SGEMM for float
// weights; quantized ones dequantized to F16 chunk by chunk into scratch, against F16 activations.
Status mul_mat_cublas(Device& dev, OpScratch& sc, Tensor* n, const Activations& act) {
  const Tensor* w = n->src[0];
  const int64_t k = w->ne[0], m = w->ne[1], cols = n->src[1]->n_rows();
  const cudaStream_t s = dev.stream();
  KITE_ASSIGN_OR_RETURN(uint8_t * wp, dev.address(w));
  KITE_ASSIGN_OR_RETURN(uint8_t * dp, dev.address(n));
  auto* dst = reinterpret_cast<float*>(dp);
  const int64_t ldd = static_cast<int64_t>(n->nb[1] / sizeof(float));
  const size_t w_row = w->nb[1];
  const float* xf = act.x;
  const size_t ldx = act.ldx;
  KITE_ASSIGN_OR_RETURN(cublasHandle_t h, dev.cublas());
  const float one = 1.f, zero = 0.f;
  const int ik = static_cast<int>(k), in = static_cast<int>(cols);
  if (w->type == DType::F32) {
    KITE_CUBLAS_CHECK(dev.blas().sgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(m), in, ik, &one,
                                  reinterpret_cast<const float*>(wp), static_cast<int>(w_row / 4), xf,
                                  static_cast<int>(ldx), &zero, dst, static_cast<int>(ldd)));
    return ok_status();
  }
  const bool f16 = !is_float(w->type);  // quantized: F16 GEMM; F16/BF16 weights: exact f32 SGEMM
  const int64_t chunk = std::max<int64_t>(1, std::min<int64_t>(m, static_cast<int64_t>(kWeightChunkElems) / k));
  KITE_ASSIGN_OR_RETURN(void* wd, dev.scratch(sc.w, static_cast<size_t>(chunk * k) * (f16 ? 2 : 4), "weight"));
  void* xh = nullptr;
  if (f16) {
    KITE_ASSIGN_OR_RETURN(xh, dev.scratch(sc.xh, static_cast<size_t>(k * cols) * 2, "f16 activation"));
    KITE_LAUNCH(launch_f32_to_f16(xf, ldx, k, cols, xh, s));
  }
  for (int64_t i0 = 0; i0 < m; i0 += chunk) {
    const int64_t mc = std::min(chunk, m - i0);
    KITE_LAUNCH(launch_dequant_matrix(tid(w->type), wp + static_cast<size_t>(i0) * w_row, w_row, k, mc, wd, f16, s));
    if (f16) {
      KITE_CUBLAS_CHECK(dev.blas().gemm_ex(h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(mc), in, ik, &one, wd, CUDA_R_16F,
                                     ik, xh, CUDA_R_16F, ik, &zero, dst + i0, CUDA_R_32F, static_cast<int>(ldd),
                                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    } else {
      KITE_CUBLAS_CHECK(dev.blas().sgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(mc), in, ik, &one,
                                    static_cast<const float*>(wd), ik, xf, static_cast<int>(ldx), &zero, dst + i0,
                                    static_cast<int>(ldd)));
    }
  }
  return ok_status();
}

// Times a quantized matmul shape both ways (see kMmqMaxCols) and keeps the faster; n's output
// then holds that way's product. Where cuBLAS cannot run (no library on this machine, or no
// device memory left for its weight scratch) the shape keeps mmq, untimed (cublas_ms 0).
Status choose_mmq(Device& dev, OpScratch& sc, Tensor* n, const Activations& act) {
  const MmqShape shape = mmq_shape(dev, n);
  // Records the choice unless another backend got there first; returns the one kept.
  auto keep = [&](bool mmq, double mmq_ms, double cublas_ms) {
    std::lock_guard<std::mutex> lock(g_mmq_mu);
    const MatmulChoice c{shape.device, shape.type, shape.k, shape.m, shape.cols, mmq, mmq_ms, cublas_ms};
    return g_mmq_choices.try_emplace(shape, c).first->second.mmq;
  };
  auto run = [&](bool mmq) -> Status {
    sc.int8 = {};  // (mmq quantizes its activations each run, as when nothing made them before)
    return mmq ? mul_mat_mmq(dev, sc, n, act) : mul_mat_cublas(dev, sc, n, act);
  };
  // cuBLAS's scratch (the F16 weight chunk: up to 160 MB, and F16 activations) that only this
  // timing allocated is freed when mmq is kept: a model whose shapes all take mmq holds none.
  const bool w_new = !sc.w.ptr, xh_new = !sc.xh.ptr;
  auto drop_cublas_scratch = [&]() -> Status {
    if (w_new) KITE_TRY(dev.release(sc.w));
    if (xh_new) KITE_TRY(dev.release(sc.xh));
    return ok_status();
  };
  if (!dev.cublas().ok() || !run(false)) {
    keep(true, 0, 0);
    KITE_TRY(drop_cublas_scratch());
    return run(true);
  }
  KITE_TRY(run(true));
  cudaEvent_t start = nullptr, stop = nullptr;
  KITE_CUDA_CHECK(cudaEventCreate(&start));
  const std::unique_ptr<CUevent_st, decltype(&cudaEventDestroy)> start_guard(start, &cudaEventDestroy);
  KITE_CUDA_CHECK(cudaEventCreate(&stop));
  const std::unique_ptr<CUevent_st, decltype(&cudaEventDestroy)> stop_guard(stop, &cudaEventDestroy);
  // Before each timed run, 2x the L2 cache's bytes written over, so that the weights come from
  // device memory as in a model's step, not from L2 where the last run left them (unless the
  // device has no room for it).
  const size_t flush_bytes = 2 * dev.l2_bytes();
  Result<DevicePtr> flush = flush_bytes > 0 ? dev.malloc(flush_bytes, "L2 flush") : make_error("no L2");
  double best[2] = {1e30, 1e30};
  for (const bool mmq : {false, true, true, false}) {
    if (flush.ok()) KITE_CUDA_CHECK(cudaMemsetAsync(flush->get(), 0, flush_bytes, dev.stream()));
    KITE_CUDA_CHECK(cudaEventRecord(start, dev.stream()));
    KITE_TRY(run(mmq));
    KITE_CUDA_CHECK(cudaEventRecord(stop, dev.stream()));
    KITE_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    KITE_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    best[mmq] = std::min(best[mmq], static_cast<double>(ms));
  }
  if (keep(best[1] <= best[0], best[1], best[0])) {
    KITE_TRY(drop_cublas_scratch());
    KITE_TRY(run(true));  // (the last timed run was cuBLAS's)
  }
  return ok_status();
}

}  // namespace

bool use_mmq(const Device& dev, const Tensor* n) { return mmq_known(dev, n).value_or(mmq_by_default(n)); }

Status mul_mat_matrix(Device& dev, OpScratch& sc, Tensor* n, const Activations& act) {
  if (is_float(n->src[0]->type)) return mul_mat_cublas(dev, sc, n, act);
  const std::optional<bool> known = mmq_known(dev, n);
  if (!known && !sc.capturing) return choose_mmq(dev, sc, n, act);
  return known.value_or(mmq_by_default(n)) ? mul_mat_mmq(dev, sc, n, act) : mul_mat_cublas(dev, sc, n, act);
}

std::vector<MatmulChoice> cuda_matmul_choices() {
  std::lock_guard<std::mutex> lock(g_mmq_mu);
  std::vector<MatmulChoice> v;
  for (const auto& [shape, c] : g_mmq_choices) v.push_back(c);
  return v;
}

std::vector<std::string> cuda_matmul_report() {
  std::vector<std::string> lines;
  for (const MatmulChoice& c : cuda_matmul_choices()) {
    const quant::TypeTraits* tr = quant::find_traits(static_cast<uint32_t>(c.type));
    const std::string type = tr != nullptr ? std::string(tr->name) : "?";
    char b[200];
    char times[64] = "cuBLAS could not run";
    if (c.cublas_ms > 0) std::snprintf(times, sizeof times, "mmq %.3f ms, cuBLAS %.3f ms", c.mmq_ms, c.cublas_ms);
    std::snprintf(b, sizeof b, "cuda:%d %s %lld x %lld, %lld-%lld columns: %s (%s)", c.device, type.c_str(),
                  static_cast<long long>(c.k), static_cast<long long>(c.m), static_cast<long long>(c.cols / 2 + 1),
                  static_cast<long long>(c.cols), c.mmq ? "mmq" : "cuBLAS", times);
    lines.emplace_back(b);
  }
  return lines;
}

void reset_cuda_matmul_choices() {
  std::lock_guard<std::mutex> lock(g_mmq_mu);
  g_mmq_choices.clear();
}

}  // namespace kite::cuda

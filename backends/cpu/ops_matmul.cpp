// mul_mat: dst[m, n] = W[k, m]ᵀ-rows · x[k, n] for weights of any type.
//
// op_mul_mat_reference is the scalar specification (dequantize a weight row, f32 dot).
// op_mul_mat runs the active SIMD level's kernels (matmul.h): activations are quantized once
// into shared scratch (each thread its share of rows, then a barrier), then threads take
// chunks of consecutive weight rows from a shared counter; within a chunk every weight row is
// dotted with activation rows four at a time, so a chunk's weights stay in L1/L2 while the
// activations stream past. Batched decode (wgemm, 16 weight rows; gemm8, 8 rows) and prefill
// (packed tiles) take whole tiles of weight rows instead; matmul_path() below picks the way by
// type and row count.
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "backends/cpu/cpu_features.h"
#include "backends/cpu/matmul.h"
#include "backends/cpu/ops.h"

namespace kite::cpu {
namespace {

float dot_f32(const float* a, const float* b, int64_t n) {
  // Eight independent partial sums: vectorizable without reassociation flags.
  float s[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) s[k] += a[i + k] * b[i + k];
  float r = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
  for (; i < n; ++i) r += a[i] * b[i];
  return r;
}

const float* x_row(const Tensor* x, int64_t j) {
  return reinterpret_cast<const float*>(x->row_ptr(j % x->ne[1], (j / x->ne[1]) % x->ne[2], j / (x->ne[1] * x->ne[2])));
}

// Rows of x equally spaced (one stride for all n rows).
bool uniform_rows(const Tensor* x) {
  return x->nb[0] == sizeof(float) && x->nb[2] == x->nb[1] * static_cast<size_t>(x->ne[1]) &&
         x->nb[3] == x->nb[2] * static_cast<size_t>(x->ne[2]);
}

const MatmulKernels* kernels_for(SimdLevel l) {
#if defined(KITE_CPU_X86_KERNELS)
  switch (l) {
    case SimdLevel::kAvx2: return &matmul_kernels_avx2();
    case SimdLevel::kAvxVnni: return &matmul_kernels_avxvnni();
    case SimdLevel::kAvx512: return &matmul_kernels_avx512();
    default: return nullptr;
  }
#endif
#if defined(KITE_CPU_ARM_KERNELS)
  switch (l) {
    case SimdLevel::kNeon: return &matmul_kernels_neon();
    case SimdLevel::kNeonDot: return &matmul_kernels_neon_dot();
    default: return nullptr;
  }
#endif
  (void)l;
  return nullptr;
}

VecDotFn fast_kernel(const MatmulKernels* mk, DType t) {
  const auto id = static_cast<size_t>(t);
  return mk != nullptr && id < kTypeSlots ? mk->dot[id][0] : nullptr;
}

// How a mul_mat of n activation rows multiplies its weights (the AVX-512 VNNI level has all four;
// the AVX-VNNI level all but wgemm; the AVX2 level all but wgemm, and tiles and gemm8 not for
// Q8_0/IQ4_NL/IQ4_XS, whose codes are past maddubs' exact range, matmul_x86_tiles.inc):
//   - per-row dots (matmul.h dot[]), up to kMaxNa rows per call: one row (decode), and where
//     nothing else pays;
//   - wgemm: 16 weight rows read in place, each block decoded once for up to 64 rows (batched
//     decode; wgemm_type_min_rows below);
//   - gemm8: 8 weight rows read in place against up to 8 rows at a time (small batches);
//   - tiles: 8 weight rows packed once, then every activation row streamed past (prefill);
//   - fgemm (bgemm): float weights at the x86 levels, any number of rows, register tiles whose
//     every dot has the same bits at any row count (matmul_x86_fgemm.inc).
// The row ranges are measured with kite-decode-kernels (one thread, weights from DRAM and from
// cache; and the whole op on 2 threads with kite-bench-kernels --gemm-max; bench/RESULTS.md):
// gemm8 beats the dots from 2 rows (Q4_K: even at 2, ahead from 4) and the packed tiles up to
// 8 rows for the 32-element types and up to 16 for Q4_K; at 16 rows the 32-element types are
// even with the tiles, and at about 24 all are. For the types with 16-element scales (Q6_K,
// Q3_K) the per-row dots beat both up to 24 rows and tie the tiles at 32. Q2_K (16-element
// scales and mins; tiles only, no gemm8 or wgemm): its tiles run 0.07 ms a row at 32 rows like
// its dots (kite-bench-kernels, 2048 x 2048, one thread), 0.05 at 512 (1.4x).
// One row (decode) takes the per-row dots, or with OneRowWay::kTiles wgemm (else gemm8) on that
// row: which streams weights from DRAM faster depends on the machine (one_row.h measures).
enum class MatmulPath { kDots, kGemm8, kWide, kTiles, kFloat };

constexpr int64_t kTileMinRows = 8;       // rows from which packed tiles beat the per-row dots
// The same for the 16-element-scale tiles (Q2_K's too) and the AVX2 level's signed-code ones
// (Q8_0, IQ4_NL, IQ4_XS: even with the dots at 32 rows, 1.3-1.6x at 64, 1.5-1.8x at 512;
// kite-bench-kernels --levels avx2).
constexpr int64_t kTile16MinRows = 32;

std::atomic<int64_t> g_gemm_max_rows{kGemmDefaultMaxRows};
std::atomic<int64_t> g_wgemm_min_rows{-1};
std::atomic<int64_t> g_wgemm_max_rows{-1};

bool bf16_activations_from_env() {
  const char* v = std::getenv("KITE_CPU_BF16_ACT");
  return v == nullptr || std::strcmp(v, "f32") != 0;
}
std::atomic<bool> g_bf16_act{bf16_activations_from_env()};

// wgemm (16 weight rows read in place, decoded once for all activation rows, 512-bit vpdpbusd)
// against the rest, single thread, kite-decode-kernels (bench/RESULTS.md): 1.5-2.5x gemm8 and
// the tiles for Q4_K/Q5_K/Q4_0 from 2 rows up; Q8_0 reads its 8-row tiles from DRAM faster in
// gemm8 below 8 rows; the types decoded row by row (WideDec) pay for the decode below about 8;
// Q6_K's per-row dots win up to 4-5 rows, Q3_K's up to about 8. Up to 64 rows wgemm also beats
// the wide tiles; at 128 they are even (prefill keeps the tiles). Q6_K and Q2_K decode 16 rows
// at once (WideQ6K, WideQ2K) so cheaply that wgemm, decoding again for every 64 activation rows,
// still beats their wide 16-row tiles at 128 and 512 rows (by 10-15% on Zen 5, kite-bench-kernels
// --types q6_K,q2_K --n 128,512 with and without --wgemm-max 64; 2.2-2.7x their 8-row tiles), so
// it takes their prefill too. Q3_K decodes row by row (WideDec16): its wide tiles, decoded once,
// beat wgemm by 10% at 128 rows and 15-20% at 512, so it follows the 32-element types.
int64_t wgemm_type_max_rows(DType t, int64_t n) {
  return t == DType::Q6_K || t == DType::Q2_K ? n : kWgemmDefaultMaxRows;
}

int64_t wgemm_type_min_rows(DType t) {
  switch (t) {
    case DType::Q4_0:
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q2_K: return 2;
    case DType::Q6_K: return 6;
    default: return 9;
  }
}

// Rows from which gemm8 beats the per-row dots. At the AVX2 level (no VNNI: gemm8 on maddubs
// chains, matmul_x86_tiles.inc) measured apart (kite-decode-kernels --level avx2, one thread;
// kite-bench-kernels --levels avx2 --gemm-max 0/16, the whole op): from 2 rows for the
// 32-element types (1.4x at 2 rows for Q4_0/Q5_0, 2x at 8) but from 4 for Q4_K/Q5_K, whose
// dots lead at 2-3 rows (1.2x at 2; even at 4, gemm8 1.25x at 6). The 16-element-scale types
// keep the rule below at both levels: at AVX2 too their dots beat gemm8 at 8-16 rows (by 15%)
// and the tiles up to 24 (by 8-12%), and tie the tiles at 32.
bool is_avx2_level(const MatmulKernels* mk) {
#if defined(KITE_CPU_X86_KERNELS)
  return mk == &matmul_kernels_avx2();
#else
  (void)mk;
  return false;
#endif
}

// The tile kinds whose types take gemm8 (the 16-element-scale types keep their dots: above).
bool gemm8_kind(TileKernels::Kind kind) {
  return kind == TileKernels::k32 || kind == TileKernels::k32Signed;
}

// The AVX2 level's signed-code gemm8 (Q8_0, IQ4_NL, IQ4_XS) from 5 rows: up to 4 the dots read
// the weights once too and tie it (IQ4_XS's dots win at 4: 0.21 against 0.24 ms), from 5 it wins
// (1.2-1.4x at 5-6 rows, 1.2-1.5x at 8 and 16; kite-bench-kernels --levels avx2 --gemm-max 0/16).
int64_t gemm8_min_rows(const MatmulKernels* mk, DType t) {
  if (mk->tile_s8_pack[static_cast<size_t>(t)] != nullptr) return 5;
  return is_avx2_level(mk) && (t == DType::Q4_K || t == DType::Q5_K) ? 4 : 2;
}

// One activation row read in place (OneRowWay::kTiles): wgemm's 16 weight rows where the level
// has it, else gemm8's 8; kDots where it has neither.
MatmulPath one_row_in_place(const MatmulKernels* mk, DType t, TileKernels::Kind kind) {
  if (mk->wgemm[static_cast<size_t>(t)] != nullptr) return MatmulPath::kWide;
  if (mk->gemm8[static_cast<size_t>(t)] != nullptr && gemm8_kind(kind)) return MatmulPath::kGemm8;
  return MatmulPath::kDots;
}

MatmulPath matmul_path(const MatmulKernels* mk, DType t, int64_t n, OneRowWay one_row) {
  if (mk != nullptr && static_cast<size_t>(t) < kTypeSlots && mk->fgemm[static_cast<size_t>(t)] != nullptr)
    return MatmulPath::kFloat;
  const TileKernels::Kind kind = tile_kernels(mk, t).kind;
  if (kind == TileKernels::kNone) return MatmulPath::kDots;
  if (n < 2) return one_row == OneRowWay::kTiles ? one_row_in_place(mk, t, kind) : MatmulPath::kDots;
  if (mk->wgemm[static_cast<size_t>(t)] != nullptr) {
    const int64_t lo = g_wgemm_min_rows.load(std::memory_order_relaxed);
    const int64_t hi = g_wgemm_max_rows.load(std::memory_order_relaxed);
    const int64_t max = hi >= 0 ? hi : wide_tiles(mk, t).pack != nullptr ? wgemm_type_max_rows(t, n) : n;
    if (n >= (lo < 0 ? wgemm_type_min_rows(t) : lo) && n <= max) return MatmulPath::kWide;
  }
  const bool gemm = mk->gemm8[static_cast<size_t>(t)] != nullptr && gemm8_kind(kind);
  if (gemm && n >= gemm8_min_rows(mk, t) && n <= g_gemm_max_rows.load(std::memory_order_relaxed))
    return MatmulPath::kGemm8;
  return n >= (kind == TileKernels::k32 ? kTileMinRows : kTile16MinRows) ? MatmulPath::kTiles : MatmulPath::kDots;
}

// The one-row kernel of the level for type t (gemv[], gemv_act_format(t) activations), or null.
VecDotFn gemv_kernel(const MatmulKernels* mk, DType t) {
  const auto id = static_cast<size_t>(t);
  if (mk == nullptr || id >= kTypeSlots) return nullptr;
  const QuantizeActFn q = gemv_act_format(t) == ActFormat::kQ8KG ? mk->quantize_q8kg : mk->quantize_q8g;
  return q != nullptr ? mk->gemv[id] : nullptr;
}

// gemm8 and the tiles take their activations in the tiles' format, one row its gemv's.
ActFormat act_format_for(const MatmulKernels* mk, DType t, int64_t n, OneRowWay one_row = OneRowWay::kRows) {
  const MatmulPath path = matmul_path(mk, t, n, one_row);
  if (path == MatmulPath::kFloat)
    return t == DType::BF16 && mk->bgemm != nullptr && g_bf16_act.load(std::memory_order_relaxed) ? ActFormat::kBF16
                                                                                                   : ActFormat::kF32;
  if (path == MatmulPath::kDots)
    return n == 1 && gemv_kernel(mk, t) != nullptr ? gemv_act_format(t) : act_format(t);
  return tile_kernels(mk, t).q8u() ? ActFormat::kQ8U : ActFormat::kQ8;
}

// Phase 2 with weights read in place (gemm8: 8-row tiles, kGemmMaxNa activation rows a call;
// wgemm: 16-row tiles, kWideGemmMaxNa a call): chunks of whole tiles, each tile's rows
// multiplied by all activation rows, one decode of the weights per call.
using InPlaceGemmFn = void (*)(const uint8_t* const* rows, int nrows, int64_t k, const uint8_t* act, size_t act_stride,
                               int na, float* out);
template <int kRows, int kNa>
void mul_mat_in_place(Tensor* dst, const KernelCtx& c, InPlaceGemmFn gemm, const uint8_t* act, size_t stride) {
  const Tensor* w = dst->src[0];
  const int64_t k = w->ne[0], m = w->ne[1], n = dst->ne[1];
  auto* out0 = static_cast<uint8_t*>(dst->data);
  const size_t out_stride = dst->nb[1];
  const int64_t n_tiles = (m + kRows - 1) / kRows;
  const int64_t per_chunk = std::max<int64_t>(1, n_tiles / (8 * static_cast<int64_t>(c.nth)));
  const int64_t n_chunks = (n_tiles + per_chunk - 1) / per_chunk;
  alignas(64) float r[kNa * kRows];
  for (int64_t ch = c.counter->fetch_add(1, std::memory_order_relaxed); ch < n_chunks;
       ch = c.counter->fetch_add(1, std::memory_order_relaxed)) {
    for (int64_t t = ch * per_chunk; t < std::min(n_tiles, (ch + 1) * per_chunk); ++t) {
      const int64_t i0 = t * kRows;
      const int nrows = static_cast<int>(std::min<int64_t>(kRows, m - i0));
      const uint8_t* rows[kRows];
      for (int rr = 0; rr < nrows; ++rr) rows[rr] = w->row_ptr(i0 + rr);
      for (int64_t j0 = 0; j0 < n; j0 += kNa) {
        const int na = static_cast<int>(std::min<int64_t>(kNa, n - j0));
        gemm(rows, nrows, k, act + static_cast<size_t>(j0) * stride, stride, na, r);
        for (int jj = 0; jj < na; ++jj) {
          float* o = reinterpret_cast<float*>(out0 + static_cast<size_t>(j0 + jj) * out_stride) + i0;
          std::memcpy(o, r + jj * kRows, sizeof(float) * static_cast<size_t>(nrows));
        }
      }
    }
  }
}

// Rows per work chunk of a decode mul_mat: about eight chunks per thread (so a thread that the
// OS preempts hands its share to the others), a multiple of 16 rows.
int64_t gemv_chunk_rows(int64_t m, int nth) {
  const int64_t per = m / (8 * static_cast<int64_t>(nth));
  return std::max<int64_t>(16, per / 16 * 16);
}

// Phase 2 for float weights (fgemm, or bgemm on bf16 activations): chunks of whole tiles of
// weight rows, small enough (<= 256 KiB) to stay in L2 while every activation row passes them,
// so each weight byte comes from DRAM once per matmul. Decode (up to kFgemmStreamCols rows)
// reads each weight once and keeps nothing, so its chunks are a gemv's (about eight a thread),
// and a thread claims its next chunk before it multiplies one, for the kernel to prefetch that
// chunk's first rows during its last tile instead of starting each chunk on a DRAM stall (the
// down projection's 16-row chunks used to start cold every other tile).
void mul_mat_float(Tensor* dst, const KernelCtx& c, const MatmulKernels& mk, ActFormat f, const uint8_t* act,
                   size_t stride) {
  const Tensor* w = dst->src[0];
  const int64_t k = w->ne[0], m = w->ne[1], n = dst->ne[1];
  const auto fn = f == ActFormat::kBF16 ? mk.bgemm : mk.fgemm[static_cast<size_t>(w->type)];
  const size_t row_bytes = w->nb[1];
  int64_t rows;
  if (n <= kFgemmStreamCols) {
    rows = gemv_chunk_rows(m, c.nth);
  } else {
    rows = std::clamp<int64_t>(static_cast<int64_t>((256u << 10) / std::max<size_t>(row_bytes, 1)), 8, 64) / 8 * 8;
    while (rows > 8 && (m + rows - 1) / rows < 4 * static_cast<int64_t>(c.nth)) rows /= 2;
  }
  const int64_t n_chunks = (m + rows - 1) / rows;
  auto* out = reinterpret_cast<float*>(dst->data);
  const size_t os = dst->nb[1] / sizeof(float);
  for (int64_t ch = c.counter->fetch_add(1, std::memory_order_relaxed); ch < n_chunks;) {
    const int64_t next = c.counter->fetch_add(1, std::memory_order_relaxed);
    const int64_t i0 = ch * rows;
    fn(w->row_ptr(i0), row_bytes, static_cast<int>(std::min(rows, m - i0)), k, act, stride, static_cast<int>(n),
       out + i0, os, next < n_chunks ? w->row_ptr(next * rows) : nullptr);
    ch = next;
  }
}

// Software prefetch of a tile's weight rows (rows i0..i0+nrows-1), spread over `steps` calls of
// step(): packing a tile otherwise waits on DRAM for its 8-16 row streams.
class RowPrefetch {
 public:
  RowPrefetch(const Tensor* w, int64_t i0, int64_t nrows, int64_t steps)
      : w_(w), row_(i0), end_(i0 + std::max<int64_t>(0, nrows)), row_bytes_(w->nb[1]) {
    const size_t lines = static_cast<size_t>(std::max<int64_t>(0, nrows)) * ((row_bytes_ + 63) / 64);
    const auto n_steps = static_cast<size_t>(std::max<int64_t>(1, steps));
    per_step_ = (lines + n_steps - 1) / n_steps;
  }
  void step() {
    for (size_t i = 0; i < per_step_ && row_ < end_; ++i) {
      __builtin_prefetch(w_->row_ptr(row_) + off_);
      off_ += 64;
      if (off_ >= row_bytes_) off_ = 0, ++row_;
    }
  }

 private:
  const Tensor* w_;
  int64_t row_, end_;
  size_t row_bytes_, per_step_ = 0, off_ = 0;
};

// Phase 2 with tiles: chunks of consecutive tiles of weight rows (16 in a wide tile where the
// level has them, else 8); each tile is packed into this thread's scratch and multiplied by the
// activations eight rows at a time, while the rows of the chunk's next tile are prefetched.
void mul_mat_tiled(Tensor* dst, const KernelCtx& c, const MatmulKernels& mk, const uint8_t* act, size_t stride) {
  const Tensor* w = dst->src[0];
  const int64_t k = w->ne[0], m = w->ne[1], n = dst->ne[1];
  const TileKernels tk = tile_kernels(&mk, w->type);
  const WideTiles wt = wide_tiles(&mk, w->type);
  const bool wide = wt.pack != nullptr;
  const int tile_rows = wide ? kWideTileRows : kTileRows;
  const auto pack = wide ? wt.pack : tk.pack;
  const size_t tile_bytes = static_cast<size_t>(k / 32) * (wide ? wt.block_bytes : tk.block_bytes);
  std::vector<float>& scratch = *c.scratch;
  if (scratch.size() * sizeof(float) < tile_bytes) scratch.resize(tile_bytes / sizeof(float) + 1);
  auto* tile = reinterpret_cast<uint8_t*>(scratch.data());
  auto* out0 = static_cast<uint8_t*>(dst->data);
  const size_t out_stride = dst->nb[1];
  const int64_t n_tiles = (m + tile_rows - 1) / tile_rows;
  const int64_t per_chunk = std::max<int64_t>(1, n_tiles / (4 * static_cast<int64_t>(c.nth)));
  const int64_t n_chunks = (n_tiles + per_chunk - 1) / per_chunk;
  const int64_t n_steps = (n + kGemmMaxNa - 1) / kGemmMaxNa;
  float r[kGemmMaxNa * kWideTileRows];
  auto one_tile = [&](int64_t t, int64_t chunk_end) {
    const int64_t i0 = t * tile_rows;
    const int nrows = static_cast<int>(std::min<int64_t>(tile_rows, m - i0));
    const uint8_t* rows[kWideTileRows];
    for (int rr = 0; rr < nrows; ++rr) rows[rr] = w->row_ptr(i0 + rr);
    pack(rows, nrows, k, tile);
    RowPrefetch next(w, i0 + tile_rows, t + 1 < chunk_end ? std::min<int64_t>(tile_rows, m - i0 - tile_rows) : 0,
                     n_steps);
    for (int64_t j0 = 0, na = 0; j0 < n; j0 += na) {
      next.step();
      const uint8_t* a = act + static_cast<size_t>(j0) * stride;
      if (wide) {
        na = std::min<int64_t>(kGemmMaxNa, n - j0);
        wt.dot[na - 1](k, tile, a, stride, r);
      } else {
        na = n - j0 >= 8 && tk.dot8 != nullptr ? 8 : std::min<int64_t>(kMaxNa, n - j0);
        (na == 8 ? tk.dot8 : tk.dot[na - 1])(k, tile, a, stride, r);
      }
      for (int jj = 0; jj < na; ++jj) {
        float* o = reinterpret_cast<float*>(out0 + static_cast<size_t>(j0 + jj) * out_stride) + i0;
        for (int rr = 0; rr < nrows; ++rr) o[rr] = r[jj * tile_rows + rr];
      }
    }
  };
  for (int64_t ch = c.counter->fetch_add(1, std::memory_order_relaxed); ch < n_chunks;
       ch = c.counter->fetch_add(1, std::memory_order_relaxed)) {
    const int64_t end = std::min(n_tiles, (ch + 1) * per_chunk);
    for (int64_t t = ch * per_chunk; t < end; ++t) one_tile(t, end);
  }
}

// Decoding streams each weight row from memory once: the bytes kPrefetchAhead further on are
// asked for before this row is multiplied. Past `end`, the chunk's end, they are the next chunk
// this thread claimed (`then`; null: none), so a chunk does not start on a DRAM stall. The
// hardware prefetcher alone leaves bandwidth unused: on a 2-core Zen 5, tg128 of a 1B Q4_K_M
// went from 53-60 to 60-67 t/s (six alternating runs each).
constexpr size_t kPrefetchAhead = 8192;
inline void prefetch_ahead(const uint8_t* row, size_t bytes, const uint8_t* end, const uint8_t* then) {
  const uint8_t* p = row + kPrefetchAhead;
  const uint8_t* stop = std::min(p + bytes, end);
  for (; p < stop; p += 64) __builtin_prefetch(p, 0, 3);
  if (then == nullptr || p < end) return;
  // The span's offsets past `end`, from `then` (integer arithmetic: the addresses may lie past
  // the weights, and a prefetch never faults).
  const auto t = reinterpret_cast<uintptr_t>(then);
  const auto from = static_cast<uintptr_t>(p - end), to = static_cast<uintptr_t>(row + kPrefetchAhead + bytes - end);
  for (uintptr_t q = t + from; q < t + to; q += 64) __builtin_prefetch(reinterpret_cast<const void*>(q), 0, 3);
}

}  // namespace

ActFormat mul_mat_act_format(const MatmulKernels* mk, DType t, int64_t n) { return act_format_for(mk, t, n); }

TileKernels tile_kernels(const MatmulKernels* mk, DType t) {
  const auto id = static_cast<size_t>(t);
  TileKernels tk;
  if (mk == nullptr || id >= kTypeSlots) return tk;
  if (mk->tile_pack[id] != nullptr && mk->tile_dot[0] != nullptr)
    tk = {TileKernels::k32, mk->tile_pack[id], mk->tile_dot, mk->tile_dot8, kTileBlockBytes};
  else if (mk->tile_s8_pack[id] != nullptr && mk->tile_s8_dot[0] != nullptr)
    tk = {TileKernels::k32Signed, mk->tile_s8_pack[id], mk->tile_s8_dot, nullptr, kTileBlockBytes};
  else if (mk->tile16_pack[id] != nullptr && mk->tile16_big[id])
    tk = {mk->tile16b_dot[0] != nullptr ? TileKernels::k16 : TileKernels::kNone, mk->tile16_pack[id], mk->tile16b_dot,
          nullptr, kTile16BlockBytes};
  else if (mk->tile16_pack[id] != nullptr && mk->tile16_dot[0] != nullptr)
    tk = {TileKernels::k16, mk->tile16_pack[id], mk->tile16_dot, mk->tile16_dot8, kTile16BlockBytes};
  else if (mk->tile16m_pack[id] != nullptr && mk->tile16m_dot[0] != nullptr)
    tk = {TileKernels::k16Min, mk->tile16m_pack[id], mk->tile16m_dot, mk->tile16m_dot8, kTile16MinBlockBytes};
  return tk;
}

WideTiles wide_tiles(const MatmulKernels* mk, DType t) {
  const auto id = static_cast<size_t>(t);
  WideTiles wt;
  if (mk == nullptr || id >= kTypeSlots) return wt;
  switch (tile_kernels(mk, t).kind) {
    case TileKernels::k32:
      if (mk->wtile_pack[id] != nullptr && mk->wtile_dot[kGemmMaxNa - 1] != nullptr)
        wt = {mk->wtile_pack[id], mk->wtile_dot, kWideTileBlockBytes};
      break;
    case TileKernels::k16:
      if (mk->wtile16_pack[id] != nullptr && mk->wtile16_dot[kGemmMaxNa - 1] != nullptr)
        wt = {mk->wtile16_pack[id], mk->wtile16_dot, kWideTile16BlockBytes};
      break;
    case TileKernels::k16Min:
      if (mk->wtile16_pack[id] != nullptr && mk->wtile16m_dot[kGemmMaxNa - 1] != nullptr)
        wt = {mk->wtile16_pack[id], mk->wtile16m_dot, kWideTile16MinBlockBytes};
      break;
    case TileKernels::k32Signed:
    case TileKernels::kNone: break;
  }
  return wt;
}

void set_gemm8_max_rows(int64_t n) { g_gemm_max_rows.store(n < 0 ? kGemmDefaultMaxRows : n, std::memory_order_relaxed); }
int64_t gemm8_max_rows() { return g_gemm_max_rows.load(std::memory_order_relaxed); }
void set_bf16_activations(bool on) { g_bf16_act.store(on, std::memory_order_relaxed); }
bool bf16_activations() { return g_bf16_act.load(std::memory_order_relaxed); }
void set_wgemm_rows(int64_t min_rows, int64_t max_rows) {
  g_wgemm_min_rows.store(min_rows < 0 ? -1 : min_rows, std::memory_order_relaxed);
  g_wgemm_max_rows.store(max_rows < 0 ? -1 : max_rows, std::memory_order_relaxed);
}
int64_t wgemm_min_rows() { return g_wgemm_min_rows.load(std::memory_order_relaxed); }
int64_t wgemm_max_rows() { return g_wgemm_max_rows.load(std::memory_order_relaxed); }

const MatmulKernels* active_kernels() { return kernels_for(active_simd_level()); }
const MatmulKernels* matmul_kernels_for(SimdLevel level) { return kernels_for(level); }

ActFormat act_format(DType t) {
  switch (t) {
    case DType::F32:
    case DType::F16:
    case DType::BF16: return ActFormat::kF32;
    case DType::Q2_K:
    case DType::Q3_K:
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K:
    case DType::IQ4_XS:
    case DType::IQ2_XXS:
    case DType::IQ2_XS:
    case DType::IQ2_S:
    case DType::IQ3_XXS:
    case DType::IQ3_S:
    case DType::IQ1_S:
    case DType::IQ1_M:
      return ActFormat::kQ8K;
    default: return ActFormat::kQ8;
  }
}

ActFormat gemv_act_format(DType t) {
  return t == DType::Q4_K || t == DType::Q5_K ? ActFormat::kQ8KG : ActFormat::kQ8G;
}

void act_q8_to_q8u(uint8_t* row, int64_t k) {
  for (int64_t b = 0; b < k / 32; ++b) {
    auto* blk = reinterpret_cast<ActQ8*>(row) + b;
    uint32_t half[2] = {0, 0};
#if defined(__SSE2__)
    // (A byte loop here took 2% of a Q4_K_M model's prefill: its Q6_K matmuls' activations.)
    for (int h = 0; h < 2; ++h) {
      auto* p = reinterpret_cast<__m128i*>(blk->qs + 16 * h);
      const __m128i u = _mm_xor_si128(_mm_loadu_si128(p), _mm_set1_epi8(static_cast<char>(0x80)));
      _mm_storeu_si128(p, u);
      const __m128i sad = _mm_sad_epu8(u, _mm_setzero_si128());  // the sums of each 8 bytes
      half[h] = static_cast<uint32_t>(_mm_cvtsi128_si32(sad) + _mm_extract_epi16(sad, 4));
    }
#else
    for (int i = 0; i < 32; ++i) {
      const uint8_t u = static_cast<uint8_t>(blk->qs[i]) ^ 0x80u;
      blk->qs[i] = static_cast<int8_t>(u);
      half[i / 16] += u;
    }
#endif
    const uint32_t packed = half[0] | half[1] << 16;
    std::memcpy(&blk->s, &packed, sizeof packed);
  }
}

size_t act_row_bytes(ActFormat f, int64_t k) {
  switch (f) {
    case ActFormat::kF32: return static_cast<size_t>(k) * sizeof(float);
    case ActFormat::kQ8:
    case ActFormat::kQ8U:
    case ActFormat::kQ8G: return static_cast<size_t>(k / 32) * sizeof(ActQ8);
    case ActFormat::kQ8K:
    case ActFormat::kQ8KG: return static_cast<size_t>(k / quant::kQK_K) * sizeof(quant::BlockQ8_K);
    case ActFormat::kBF16: return static_cast<size_t>(k) * sizeof(uint16_t);
  }
  return 0;
}

void quantize_act_q8_scalar(const float* x, void* dst, int64_t k) {
  auto* out = static_cast<ActQ8*>(dst);
  for (int64_t ib = 0; ib < k / 32; ++ib, x += 32) {
    float amax = 0.f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float d = amax / 127.f, id = amax > 0.f ? 127.f / amax : 0.f;
    int sum = 0;
    for (int i = 0; i < 32; ++i) {
      out[ib].qs[i] = static_cast<int8_t>(std::nearbyint(x[i] * id));
      sum += out[ib].qs[i];
    }
    out[ib].d = d;
    out[ib].s = d * static_cast<float>(sum);
  }
}

void quantize_act_q8k_scalar(const float* x, void* dst, int64_t k) {
  auto* out = static_cast<quant::BlockQ8_K*>(dst);
  for (int64_t ib = 0; ib < k / quant::kQK_K; ++ib, x += quant::kQK_K) {
    float amax = 0.f;
    for (int i = 0; i < quant::kQK_K; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float id = amax > 0.f ? 127.f / amax : 0.f;
    out[ib].d = amax / 127.f;
    for (int g = 0; g < quant::kQK_K / 16; ++g) {
      int sum = 0;
      for (int i = 16 * g; i < 16 * g + 16; ++i) {
        out[ib].qs[i] = static_cast<int8_t>(std::nearbyint(x[i] * id));
        sum += out[ib].qs[i];
      }
      out[ib].bsums[g] = static_cast<int16_t>(sum);
    }
  }
}

size_t op_shared_bytes(const Tensor* dst, OneRowWay one_row) {
  if (dst->op == Op::kMulMatId) return mul_mat_id_shared_bytes(dst);
  if (dst->op != Op::kMulMat) return 0;
  const Tensor* w = dst->src[0];
  const Tensor* x = dst->src[1];
  const MatmulKernels* mk = kernels_for(active_simd_level());
  const ActFormat f = act_format_for(mk, w->type, x->n_rows(), one_row);
  if (f == ActFormat::kF32 && uniform_rows(x)) return 0;
  if (fast_kernel(mk, w->type) == nullptr) return 0;
  return act_row_bytes(f, w->ne[0]) * static_cast<size_t>(x->n_rows()) + 64;
}

unsigned one_row_choices(const Tensor* dst) {
  if (dst->op != Op::kMulMat || dst->src[1]->n_rows() != 1) return 0;
  const MatmulKernels* mk = kernels_for(active_simd_level());
  const DType t = dst->src[0]->type;
  if (fast_kernel(mk, t) == nullptr || matmul_path(mk, t, 1, OneRowWay::kRows) != MatmulPath::kDots) return 0;
  unsigned ways = 0;
  if (matmul_path(mk, t, 1, OneRowWay::kTiles) != MatmulPath::kDots) ways |= one_row_bit(OneRowWay::kTiles);
  if (gemv_kernel(mk, t) != nullptr && mk->gemv4[static_cast<size_t>(t)] != nullptr)
    ways |= one_row_bit(OneRowWay::kRows4);
  return ways;
}

void op_mul_mat_reference(Tensor* dst, const KernelCtx& c) {
  const Tensor* w = dst->src[0];
  const Tensor* x = dst->src[1];
  const int64_t k = w->ne[0], m = w->ne[1], n = x->n_rows();
  std::vector<float>& row = *c.scratch;
  if (row.size() < static_cast<size_t>(k)) row.resize(static_cast<size_t>(k));
  int64_t begin, end;
  split(m, c, &begin, &end);
  for (int64_t i = begin; i < end; ++i) {
    const float* wr;
    if (w->type == DType::F32) {
      wr = reinterpret_cast<const float*>(w->row_ptr(i));
    } else {
      row_to_f32(w->type, w->row_ptr(i), row.data(), k);
      wr = row.data();
    }
    for (int64_t j = 0; j < n; ++j) reinterpret_cast<float*>(dst->row_ptr(j))[i] = dot_f32(wr, x_row(x, j), k);
  }
}

namespace {

// w · x into dst (op_mul_mat without the bias).
void mul_mat_product(Tensor* dst, const KernelCtx& c) {
  const Tensor* w = dst->src[0];
  const Tensor* x = dst->src[1];
  const MatmulKernels* mk = kernels_for(active_simd_level());
  const VecDotFn* dot = fast_kernel(mk, w->type) != nullptr ? mk->dot[static_cast<size_t>(w->type)] : nullptr;
  if (dot == nullptr || c.shared == nullptr || c.barrier == nullptr || c.counter == nullptr) {
    op_mul_mat_reference(dst, c);
    return;
  }
  const int64_t k = w->ne[0], m = w->ne[1], n = x->n_rows();
  const MatmulPath path = matmul_path(mk, w->type, n, c.one_row);
  const ActFormat f = act_format_for(mk, w->type, n, c.one_row);

  // Phase 1: activations in the kernel's format. One row (decode): every thread quantizes it
  // into its own scratch, which is cheaper than waiting at a barrier; more rows: once into the
  // shared scratch, each thread its share of rows, then a barrier.
  const uint8_t* act;
  size_t stride;
  auto quantize_row = [&](int64_t j, uint8_t* out) {
    switch (f) {
      case ActFormat::kF32: std::memcpy(out, x_row(x, j), stride); break;
      case ActFormat::kQ8: mk->quantize_q8(x_row(x, j), out, k); break;
      case ActFormat::kQ8U:
        mk->quantize_q8(x_row(x, j), out, k);
        act_q8_to_q8u(out, k);
        break;
      case ActFormat::kQ8K: mk->quantize_q8k(x_row(x, j), out, k); break;
      case ActFormat::kQ8G: mk->quantize_q8g(x_row(x, j), out, k); break;
      case ActFormat::kQ8KG: mk->quantize_q8kg(x_row(x, j), out, k); break;
      case ActFormat::kBF16: mk->quantize_bf16(x_row(x, j), out, k); break;
    }
  };
  if (f == ActFormat::kF32 && uniform_rows(x)) {
    act = static_cast<const uint8_t*>(x->data);
    stride = x->nb[1];
  } else if (n == 1 && (path == MatmulPath::kDots || path == MatmulPath::kFloat)) {
    stride = act_row_bytes(f, k);
    std::vector<float>& scratch = *c.scratch;
    if (scratch.size() * sizeof(float) < stride) scratch.resize(stride / sizeof(float) + 1);
    quantize_row(0, reinterpret_cast<uint8_t*>(scratch.data()));
    act = reinterpret_cast<const uint8_t*>(scratch.data());
  } else {
    stride = act_row_bytes(f, k);
    uint8_t* buf = c.shared->data() + c.shared_offset;
    int64_t begin, end;
    split(n, c, &begin, &end);
    for (int64_t j = begin; j < end; ++j) quantize_row(j, buf + static_cast<size_t>(j) * stride);
    c.barrier->wait();
    act = buf;
  }

  if (path == MatmulPath::kGemm8) {
    mul_mat_in_place<kTileRows, kGemmMaxNa>(dst, c, mk->gemm8[static_cast<size_t>(w->type)], act, stride);
    return;
  }
  if (path == MatmulPath::kWide) {
    mul_mat_in_place<kWideTileRows, kWideGemmMaxNa>(dst, c, mk->wgemm[static_cast<size_t>(w->type)], act, stride);
    return;
  }
  if (path == MatmulPath::kTiles) {
    mul_mat_tiled(dst, c, *mk, act, stride);
    return;
  }
  if (path == MatmulPath::kFloat) {
    mul_mat_float(dst, c, *mk, f, act, stride);
    return;
  }

  // Phase 2: chunks of weight rows from the shared counter.
  int64_t rows_per_chunk = 16;
  while (rows_per_chunk > 1 && m < rows_per_chunk * c.nth * 4) rows_per_chunk /= 2;
  if (n == 1 && rows_per_chunk == 16) rows_per_chunk = gemv_chunk_rows(m, c.nth);
  const int64_t n_chunks = (m + rows_per_chunk - 1) / rows_per_chunk;
  auto* out0 = static_cast<uint8_t*>(dst->data);
  const size_t out_stride = dst->nb[1];
  float r[kMaxNa];
  VecDotFn row_dot[kMaxNa] = {dot[0], dot[1], dot[2], dot[3]};
  const bool gemv_act = f == ActFormat::kQ8G || f == ActFormat::kQ8KG;  // (n == 1)
  if (gemv_act) row_dot[0] = gemv_kernel(mk, w->type);
  // Four rows a call (gemv4: the same bits, 1.5x the weight bytes a thread multiplies from
  // cache) where the backend chose OneRowWay::kRows4: whether four interleaved streams or one
  // pull the weights from DRAM faster depends on the host and the thread count (one_row.h). The
  // kernel asks for the four rows `gemv4_lead` on (at least kPrefetchAhead bytes) as it goes,
  // past the chunk's end those of the chunk claimed next.
  const Gemv4Fn gemv4 = gemv_act && c.one_row == OneRowWay::kRows4 ? mk->gemv4[static_cast<size_t>(w->type)] : nullptr;
  const auto group_bytes = static_cast<int64_t>(4 * w->nb[1]);
  const int64_t gemv4_lead = 4 * std::max<int64_t>(1, (int64_t{kPrefetchAhead} + group_bytes - 1) / group_bytes);
  // A thread claims its next chunk before it multiplies one (see prefetch_ahead).
  for (int64_t ch = c.counter->fetch_add(1, std::memory_order_relaxed); ch < n_chunks;) {
    const int64_t next = c.counter->fetch_add(1, std::memory_order_relaxed);
    const int64_t i0 = ch * rows_per_chunk, i1 = std::min(m, i0 + rows_per_chunk);
    const uint8_t* then = next < n_chunks ? w->row_ptr(next * rows_per_chunk) : nullptr;
    int64_t rest = i0;  // the rows left to the loop below
    if (gemv4 != nullptr) {
      for (; rest + 4 <= i1; rest += 4) {
        const int64_t j = rest + gemv4_lead;
        const uint8_t* ahead = j < i1 ? w->row_ptr(j) : then != nullptr ? then + (j - i1) * w->nb[1] : nullptr;
        gemv4(k, w->row_ptr(rest), w->nb[1], ahead, act, reinterpret_cast<float*>(out0) + rest);
      }
    }
    for (int64_t j0 = 0; j0 < n; j0 += kMaxNa) {
      const int na = static_cast<int>(std::min<int64_t>(kMaxNa, n - j0));
      const uint8_t* a = act + static_cast<size_t>(j0) * stride;
      for (int64_t i = rest; i < i1; ++i) {
        if (n == 1) prefetch_ahead(w->row_ptr(i), w->nb[1], w->row_ptr(i1), then);
        row_dot[na - 1](k, w->row_ptr(i), a, stride, r);
        for (int jj = 0; jj < na; ++jj)
          reinterpret_cast<float*>(out0 + static_cast<size_t>(j0 + jj) * out_stride)[i] = r[jj];
      }
    }
    ch = next;
  }
}

}  // namespace

void op_mul_mat(Tensor* dst, const KernelCtx& c) {
  mul_mat_product(dst, c);
  const Tensor* bias = dst->src[2];
  if (bias == nullptr) return;
  c.barrier->wait();  // (every thread's products, before their columns get the bias)
  const auto* b = static_cast<const float*>(bias->data);
  int64_t begin, end;
  split(dst->n_rows(), c, &begin, &end);
  for (int64_t j = begin; j < end; ++j) {
    auto* y = reinterpret_cast<float*>(dst->row_ptr(j));
    for (int64_t i = 0; i < dst->ne[0]; ++i) y[i] += b[i];
  }
}

}  // namespace kite::cpu

// kite/backends/cpu/matmul.h — the interface between the mul_mat driver (ops_matmul.cpp) and
// the per-instruction-set kernel files (matmul_avx2.cpp, matmul_avx512.cpp). Internal to the
// CPU backend.
//
// Quantized weights are multiplied against activations quantized on the fly to 8 bits:
//   - 32-element block types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL) pair with ActQ8 blocks
//     (float scale d, float s = d * sum(qs), 32 int8 codes — Q8_1's content with float fields);
//   - 256-element types (Q2_K..Q6_K, IQ4_XS) pair with quant::BlockQ8_K (float d, bsums).
// F32/F16/BF16 weights are multiplied against the f32 activation rows directly.
#pragma once

#include <cstddef>
#include <cstdint>

#include "backends/cpu/cpu_features.h"
#include "formats/quant/blocks.h"
#include "src/core/tensor.h"

namespace kite::cpu {

struct ActQ8 {
  float d;  // scale: x ≈ d * qs[j]
  float s;  // d * sum(qs); kQ8U: the half sums below
  int8_t qs[32];
};
static_assert(sizeof(ActQ8) == 40);

// kQ8U: ActQ8 with codes stored as y + 128 (u8) and, in place of s, the sums of those u8 codes
// over each 16-element half as two u16 (low half in the low bits), which the kernels for weights
// with mins per 16 elements (Q2_K) need once per block. kQ8G: ActQ8's content regrouped for the
// one-row kernels (MatmulKernels::gemv), same size: per chunk of 16 blocks (the last chunk may
// hold r < 16), the codes of each 4 blocks as their four low halves (codes 0-15) side by side,
// then their four high halves (64 + 64 bytes); the codes of a last group of fewer than 4 blocks in
// ActQ8 order (32 bytes a block); then the chunk's r scales d and r sums s as floats. kQ8KG:
// BlockQ8_K regrouped for the Q4_K/Q5_K one-row kernels, same size: each 128 codes stored as
// elements 0-31, 64-95, 32-63, 96-127, and bsums[s] (s < 8) the sum of the codes of 32-element
// sub-block s (bsums[8..15] zero). kBF16: k bf16 values, rounded to nearest even
// (MatmulKernels::quantize_bf16, for bgemm).
enum class ActFormat { kF32, kQ8, kQ8U, kQ8K, kQ8G, kQ8KG, kBF16 };

// The activation format a weight type's fast kernel consumes.
ActFormat act_format(DType weight_type);
// The format a weight type's one-row kernel (MatmulKernels::gemv) consumes: kQ8KG for Q4_K and
// Q5_K, kQ8G for the others.
ActFormat gemv_act_format(DType weight_type);
// Bytes of one activation row of k elements in `f`.
size_t act_row_bytes(ActFormat f, int64_t k);
// Turns a kQ8 row of k elements into kQ8U in place.
void act_q8_to_q8u(uint8_t* row, int64_t k);
struct MatmulKernels;
// The format mul_mat hands a level's kernels (mk) n activation rows in, for weights of type t.
ActFormat mul_mat_act_format(const MatmulKernels* mk, DType t, int64_t n);

// out[j] = dot(weight row w of k elements, activation row j) for j < na (1..kMaxNa); activation
// row j starts at act + j * act_stride bytes.
// gelu's tanh approximation, 0.5 x (1 + tanh(kGeluC (x + kGeluC3 x^3))), as every kite backend
// computes it: x / (1 + exp(-2 kGeluC x (1 + kGeluC3 x^2))).
inline constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2 / pi)
inline constexpr float kGeluC3 = 0.044715f;

inline constexpr int kMaxNa = 4;
using VecDotFn = void (*)(int64_t k, const void* w, const uint8_t* act, size_t act_stride, float* out);
using Gemv4Fn = void (*)(int64_t k, const void* w, size_t row_stride, const void* ahead, const uint8_t* act,
                        float* out);
// Quantizes k floats (a multiple of the block size) into activation blocks.
using QuantizeActFn = void (*)(const float* x, void* dst, int64_t k);

inline constexpr int kTypeSlots = 40;  // ggml type ids are < 40
inline constexpr int kFgemmStreamCols = 2;  // fgemm streams its weights (decode) up to this many activation rows

struct MatmulKernels {
  QuantizeActFn quantize_q8 = nullptr;
  QuantizeActFn quantize_q8k = nullptr;
  QuantizeActFn quantize_q8g = nullptr;  // into ActFormat::kQ8G
  QuantizeActFn quantize_q8kg = nullptr;  // into ActFormat::kQ8KG
  QuantizeActFn quantize_bf16 = nullptr;  // into ActFormat::kBF16, for bgemm
  // dot[type id][na - 1]; null where the level has no kernel for the type. (Plain arrays: the
  // kernel files must not instantiate header inline functions, which the linker could then
  // share with code for other levels.)
  VecDotFn dot[kTypeSlots][kMaxNa] = {};
  // Decode: one weight row against one activation row in gemv_act_format(type) (act_stride
  // unused); null where the level has none for the type (mul_mat then takes dot[type][0]).
  VecDotFn gemv[kTypeSlots] = {};
  // Decode, four weight rows at once (row_stride bytes apart) against one activation row in
  // gemv_act_format(type): out[r] for row r, the bits gemv[type] gives it; null where the level
  // has none for the type. `ahead`: four rows of a later call (same stride; null: none), which
  // the kernel prefetches block by block as it reads its own.
  Gemv4Fn gemv4[kTypeSlots] = {};

  // Prefill tiles (levels with VNNI): tile_pack[type] decodes 8 weight rows (rows[r], r < nrows;
  // the rest zero) into the interleaved tile layout below; tile_dot[na - 1] multiplies a tile by
  // na ActQ8 activation rows: out[j * 8 + r] for row r of the tile and activation j.
  // Tile layout per 32-element block: u8 codes u[8 groups of 4][8 rows][4], float d[8], c[8];
  // weight value = d * u + c (u = code + offset, c = -offset * d or the block minimum).
  void (*tile_pack[kTypeSlots])(const uint8_t* const* rows, int nrows, int64_t k, uint8_t* tile) = {};
  void (*tile_dot[kMaxNa])(int64_t k, const uint8_t* tile, const uint8_t* act, size_t act_stride, float* out) = {};
  // The AVX2 level's tiles for the types whose codes fill a signed byte (Q8_0, IQ4_NL, IQ4_XS):
  // the tile layout with signed codes w in place of u and c = 0, multiplied with maddubs on |w|
  // and the activations times sign(w) (exact without VNNI); ActQ8 activations.
  void (*tile_s8_pack[kTypeSlots])(const uint8_t* const* rows, int nrows, int64_t k, uint8_t* tile) = {};
  void (*tile_s8_dot[kMaxNa])(int64_t k, const uint8_t* tile, const uint8_t* act, size_t act_stride, float* out) = {};
  // The same for types with 16-element scales (Q3_K, Q6_K): tiles of signed codes w with a scale
  // d and a correction cw = -128 * d * sum(w) per 16 elements, against ActQ8U activations (ActQ8
  // with codes stored as y + 128). Layout per 32 elements: i8 w[8 groups][8 rows][4], float
  // d_lo[8], d_hi[8], cw_lo[8], cw_hi[8].
  void (*tile16_pack[kTypeSlots])(const uint8_t* const* rows, int nrows, int64_t k, uint8_t* tile) = {};
  void (*tile16_dot[kMaxNa])(int64_t k, const uint8_t* tile, const uint8_t* act, size_t act_stride, float* out) = {};
  // tile16_dot for the types marked in tile16_big (AVX2 level: the IQ2/IQ3 codebook types, codes
  // up to +-62, past tile16_dot's bound without VNNI): each maddubs widened at once.
  void (*tile16b_dot[kMaxNa])(int64_t k, const uint8_t* tile, const uint8_t* act, size_t act_stride, float* out) = {};
  bool tile16_big[kTypeSlots] = {};
  // The same with a min per 16 elements (Q2_K: weight = d * w - m): tile16 layout plus float
  // mm_lo[8], mm_hi[8] (-m), cw then also holding -(128 * 16) * mm, as the min meets the
  // activations' sum: out += mm * sum(y + 128) per 16 elements.
  void (*tile16m_pack[kTypeSlots])(const uint8_t* const* rows, int nrows, int64_t k, uint8_t* tile) = {};
  void (*tile16m_dot[kMaxNa])(int64_t k, const uint8_t* tile, const uint8_t* act, size_t act_stride,
                              float* out) = {};
  void (*tile16m_dot8)(int64_t k, const uint8_t* tile, const uint8_t* act, size_t act_stride, float* out) = nullptr;
  // Wide tiles (32-element types, AVX-512 level): 16 weight rows in 512-bit vectors, so one
  // vpdpbusd covers 4 elements of 16 rows. Layout per 32 elements: u8 u[8 groups][16 rows][4],
  // float d[16], c[16]; weight value = d * u + c, as in the 8-row tiles (same decoders).
  // wtile_dot[na - 1] multiplies one by na (1..kGemmMaxNa) ActQ8 rows: out[j * 16 + r].
  void (*wtile_pack[kTypeSlots])(const uint8_t* const* rows, int nrows, int64_t k, uint8_t* tile) = {};
  void (*wtile_dot[8])(int64_t k, const uint8_t* tile, const uint8_t* act, size_t act_stride, float* out) = {};
  // Wide 16-element-scale tiles (Q6_K, Q3_K; Q2_K with its mins; AVX-512 level): 16 rows decoded
  // as wgemm decodes them. Layout per 32 elements: i8 w[8 groups][16 rows][4], float d_lo[16],
  // d_hi[16], cw[16] (the codes' offset against kQ8U activations, and the mins' part of it:
  // wgemm's wide16_cw); with the mins also i32 mpair[16] (m_lo | m_hi << 16), float mdmin[16]
  // (-dmin). wtile16_dot / wtile16m_dot[na - 1]: one tile by na (1..kGemmMaxNa) kQ8U rows,
  // out[j * 16 + r], with wgemm's bits.
  void (*wtile16_pack[kTypeSlots])(const uint8_t* const* rows, int nrows, int64_t k, uint8_t* tile) = {};
  void (*wtile16_dot[8])(int64_t k, const uint8_t* tile, const uint8_t* act, size_t act_stride, float* out) = {};
  void (*wtile16m_dot[8])(int64_t k, const uint8_t* tile, const uint8_t* act, size_t act_stride, float* out) = {};
  // The same two tile products for 8 activation rows at once (fewer reloads of the tile).
  void (*tile_dot8)(int64_t k, const uint8_t* tile, const uint8_t* act, size_t act_stride, float* out) = nullptr;
  void (*tile16_dot8)(int64_t k, const uint8_t* tile, const uint8_t* act, size_t act_stride, float* out) = nullptr;
  // Small batches (VNNI levels): 8 weight rows (rows[r], r < nrows) read in place against na
  // (1..kGemmMaxNa) activation rows, each weight block decoded once for all of them; out[j * 8 + r].
  // Activations as the tiles take them: ActQ8, or ActQ8U for the types with tile16_pack.
  void (*gemm8[kTypeSlots])(const uint8_t* const* rows, int nrows, int64_t k, const uint8_t* act, size_t act_stride,
                            int na, float* out) = {};
  // Batched decode (AVX-512 VNNI level): 16 weight rows (rows[r], r < nrows) read in place
  // against na (1..kWideGemmMaxNa) activation rows; each 32-element block of the 16 rows is
  // decoded and transposed once into 512-bit vectors and dotted with every activation row, so
  // 2-64 rows decode the weights once and pack nothing. out[j * 16 + r] (also the accumulator:
  // na * 16 floats, overwritten). Activations as gemm8 takes them.
  void (*wgemm[kTypeSlots])(const uint8_t* const* rows, int nrows, int64_t k, const uint8_t* act, size_t act_stride,
                            int na, float* out) = {};
  // Float weights (F32/F16/BF16, x86 levels): nrows weight rows (row r at w + r * w_stride)
  // against na f32 activation rows (stride act_stride bytes), in register tiles that give every
  // dot the same bits at any na (matmul_x86_fgemm.inc). out[j * out_stride + r] (floats). bgemm:
  // the same for BF16 weights against bf16 activations (ActFormat::kBF16, quantize_bf16), where
  // the CPU multiplies bf16 pairs (AVX512-BF16; null elsewhere). Up to kFgemmStreamCols
  // activation rows, each weight row is read once, from DRAM: the kernel prefetches its next
  // tile while it multiplies one, and during the last tile the rows at `after` (the caller's
  // next ones; null: nothing).
  using FloatGemmFn = void (*)(const uint8_t* w, size_t w_stride, int nrows, int64_t k, const uint8_t* act,
                               size_t act_stride, int na, float* out, size_t out_stride, const uint8_t* after);
  FloatGemmFn fgemm[kTypeSlots] = {};
  FloatGemmFn bgemm = nullptr;

  // Row helpers for the other hot ops (attention, rms_norm, swiglu).
  float (*dot_f16_f32)(const uint16_t* a, const float* b, int64_t n) = nullptr;
  float (*dot_f32_f32)(const float* a, const float* b, int64_t n) = nullptr;
  void (*axpy_f16)(float* y, float a, const uint16_t* x, int64_t n) = nullptr;  // y += a * x
  void (*axpy_f32)(float* y, float a, const float* x, int64_t n) = nullptr;
  // s[i] = exp(s[i] - m) for i < n; returns the sum.
  float (*exp_sub_sum)(float* s, int64_t n, float m) = nullptr;
  float (*sum_sq)(const float* x, int64_t n) = nullptr;
  // Attention for ng (<= 8) query heads sharing K/V rows: scores[h * nk + j] = scale * q[h] · k_j
  // and smax[h] = max_j scores[h * nk + j] (nk >= 1); acc[h * hd + i] = sum_j p[h * nk + j] * v_j[i].
  // Rows are F32 or F16, or Q8_0 on x86 (hd a multiple of 32). Each score and output is computed
  // the same way however keys and heads are grouped into calls.
  void (*attn_scores)(const float* const* q, int ng, const uint8_t* const* krows, DType kt, int64_t nk, int64_t hd,
                      float scale, float* scores, float* smax) = nullptr;
  void (*attn_accum)(const float* p, int ng, const uint8_t* const* vrows, DType vt, int64_t nk, int64_t hd,
                     float* acc) = nullptr;
  // Prefill runs (x86 levels, hd a multiple of 8; null elsewhere): attn_pack_kt converts n key
  // rows into transposed panels of the level's own layout (kt: 64-byte aligned, room for
  // roundup(n, 16) * hd floats); attn_scores_kt scores query rows against a packed chunk with
  // attn_scores' exact arithmetic (the same bits), without its per-key reductions.
  void (*attn_pack_kt)(const uint8_t* const* krows, DType kt, int64_t n, int64_t hd, float* kt_out) = nullptr;
  void (*attn_scores_kt)(const float* const* q, int ng, const float* kt, int64_t nk, int64_t hd, float scale,
                         float* scores, float* smax) = nullptr;
  void (*swiglu)(float* y, const float* g, const float* u, int64_t n) = nullptr;  // silu(g) * u
  void (*geglu)(float* y, const float* g, const float* u, int64_t n) = nullptr;   // gelu(g) * u (tanh form)
};

inline constexpr int kTileRows = 8;
inline constexpr int kGemmMaxNa = 8;  // activation rows per gemm8 call
inline constexpr size_t kTileBlockBytes = 32 * kTileRows + 2 * kTileRows * sizeof(float);  // per 32 elements
inline constexpr size_t kTile16BlockBytes = 32 * kTileRows + 4 * kTileRows * sizeof(float);
inline constexpr size_t kTile16MinBlockBytes = kTile16BlockBytes + 2 * kTileRows * sizeof(float);

// The 8-row prefill tiles a level has for a type: 32-element tiles (tile_pack, or tile_s8_pack
// for signed codes; ActQ8 activations), 16-element-scale ones (tile16_pack) or those with mins
// (tile16m_pack), both against ActQ8U activations; kind kNone (pack null) where it has none.
struct TileKernels {
  enum Kind { kNone, k32, k32Signed, k16, k16Min } kind = kNone;
  void (*pack)(const uint8_t* const* rows, int nrows, int64_t k, uint8_t* tile) = nullptr;
  using DotFn = void (*)(int64_t k, const uint8_t* tile, const uint8_t* act, size_t act_stride, float* out);
  const DotFn* dot = nullptr;  // dot[na - 1], na up to kMaxNa
  DotFn dot8 = nullptr;        // 8 activation rows (may be null)
  size_t block_bytes = 0;      // tile bytes per 32 elements
  bool q8u() const { return kind == k16 || kind == k16Min; }
};
TileKernels tile_kernels(const MatmulKernels* mk, DType t);
// The 16-row prefill tiles a level has for a type (wtile_* for the 32-element types, wtile16_*
// for the others; the same activations as its 8-row tiles): pack null where it has none.
struct WideTiles {
  void (*pack)(const uint8_t* const* rows, int nrows, int64_t k, uint8_t* tile) = nullptr;
  const TileKernels::DotFn* dot = nullptr;  // dot[na - 1], na up to kGemmMaxNa
  size_t block_bytes = 0;                   // tile bytes per 32 elements
};
WideTiles wide_tiles(const MatmulKernels* mk, DType t);
inline constexpr int kWideTileRows = 16;
inline constexpr size_t kWideTileBlockBytes = 32 * kWideTileRows + 2 * kWideTileRows * sizeof(float);
inline constexpr size_t kWideTile16BlockBytes = 32 * kWideTileRows + 3 * kWideTileRows * sizeof(float);
inline constexpr size_t kWideTile16MinBlockBytes = kWideTile16BlockBytes + 2 * kWideTileRows * sizeof(float);
static_assert(kGemmMaxNa == 8, "wtile_dot and wtile16_dot have one entry per activation row count up to 8");

// Activation rows up to which mul_mat uses gemm8 (where the level has it) rather than the
// per-row dots (below 8) or the packed tiles; n < 0 restores the default. For benchmarks and
// tests; not thread-safe against a running compute.
inline constexpr int64_t kGemmDefaultMaxRows = 16;
void set_gemm8_max_rows(int64_t n);
int64_t gemm8_max_rows();

// Activation rows per wgemm call, and the row range in which mul_mat takes wgemm (where the
// level has it) over gemm8, the per-row dots and the tiles: [min, max]. A min of -1 (the
// default) means each type's measured minimum (2 rows where its 16-row decoder is vectorized
// across rows, 6 for Q6_K, else 9; ops_matmul.cpp); (0, 0) turns wgemm off; a max of -1 (the
// default) means kWgemmDefaultMaxRows where the wide tiles take prefill beyond it (the
// 32-element-scale types and Q3_K) and no limit for Q6_K and Q2_K (wgemm beats even their wide
// tiles at any row count) or where the level has no wide tiles. For benchmarks and tests, as
// above.
inline constexpr int kWideGemmMaxNa = 64;
inline constexpr int64_t kWgemmDefaultMaxRows = 64;
void set_wgemm_rows(int64_t min_rows, int64_t max_rows);
int64_t wgemm_min_rows();  // -1: per type
int64_t wgemm_max_rows();  // -1: per type

// Whether mul_mat rounds the activations of BF16 weights to bf16 where the level has bgemm
// (default: yes, unless the environment sets KITE_CPU_BF16_ACT=f32); off, they stay f32 (fgemm:
// exact products, half bgemm's prefill speed). For tests, as above.
void set_bf16_activations(bool on);
bool bf16_activations();

// The active level's table, or nullptr at kScalar (ops then use their scalar loops).
const MatmulKernels* active_kernels();
// A level's table (nullptr for kScalar and for levels not compiled into this build).
const MatmulKernels* matmul_kernels_for(SimdLevel level);

// Kernel tables of the compiled x86 levels (their files are compiled only on x86-64).
const MatmulKernels& matmul_kernels_avx2();
const MatmulKernels& matmul_kernels_avxvnni();
const MatmulKernels& matmul_kernels_avx512();
// Adds the AVX512-BF16 kernels (bgemm, quantize_bf16) to a table: the AVX-512 level does where
// the CPU has the extension (matmul_avx512bf16.cpp, compiled with it).
void add_avx512bf16_kernels(MatmulKernels* m);
// Kernel tables of the aarch64 levels (matmul_neon*.cpp, compiled only on aarch64).
const MatmulKernels& matmul_kernels_neon();
const MatmulKernels& matmul_kernels_neon_dot();

// Scalar activation quantizers (reference-level; also used by tests).
void quantize_act_q8_scalar(const float* x, void* dst, int64_t k);
void quantize_act_q8k_scalar(const float* x, void* dst, int64_t k);

}  // namespace kite::cpu

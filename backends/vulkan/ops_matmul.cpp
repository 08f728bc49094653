// mul_mat and get_rows on the Vulkan device, for weights of every type kite computes with (F32,
// F16, BF16, the legacy and K quants, IQ4_NL, IQ4_XS and the codebook types IQ1_S..IQ3_S). The
// shaders decode weight blocks to f32 (shaders/dequant.glsl, the scalar reference's values bit
// for bit) and multiply in f32: no int8 activation quantization, so results are as close to the
// CPU reference as f32 sums allow.
//
// mul_mat has two shapes, one for each kind of device (KITE_VULKAN_MATMUL=gpu or =cpu forces
// one; otherwise Stream::is_gpu() decides):
// - CPU lanes (lavapipe): shaders/mul_mat_<type>.comp, one workgroup per tile of kMulMatRows
//   weight rows x kMulMatCols activation columns, each invocation owning whole rows (each weight
//   chunk is decoded once per tile and used for every column of it; more columns take more
//   tiles); mul_mat1_<type>.comp for one column (decode).
// - GPUs: shaders/mmv_gpu_<type>.comp, one workgroup per kGpuRows weight rows x kGpuCols
//   columns, its invocations splitting k (coalesced weight reads) and adding their partial sums
//   in shared memory; mmv_gpu1_<type>.comp for one column. Decode has m / kGpuRows workgroups.
//   From kTiledMinCols columns on (prefill, large batches): shaders/mm_tiled_<type>.comp, one
//   workgroup per kTiledRows x kTiledCols tile of the output multiplied out of shared memory,
//   each weight decoded once per kTiledCols columns.
// Activations are read as 16-byte vectors; rows that are not aligned for it are first copied
// to scratch by mul_mat_pack_x.comp. get_rows: shaders/get_rows_<type>.comp, one invocation per
// 8 elements.
#include <array>
#include <cstddef>
#include <cstdlib>
#include <limits>
#include <string_view>

#include "backends/vulkan/stream.h"
#include "formats/quant/iq_grids.h"
#include "formats/quant/types.h"

namespace kite::vk {
namespace {

constexpr uint32_t kMulMatRows = 256;    // ROWS in shaders/mul_mat.glsl
constexpr uint32_t kMulMatCols = 8;      // NC in shaders/mul_mat.glsl
constexpr uint32_t kGpuRows = 2;         // NR in shaders/mmv_gpu.glsl
constexpr uint32_t kGpuCols = 8;         // NC in shaders/mmv_gpu.glsl
constexpr uint32_t kTiledRows = 64;       // BM in shaders/mm_tiled.glsl
constexpr uint32_t kTiledCols = 64;       // BN in shaders/mm_tiled.glsl
// Columns from which the GPU shape multiplies tiles: below it mmv_gpu reads each weight row
// ceil(n / 8) times and does a shared-memory reduction per 8 columns; at 32 and more a 64-column
// tile wastes at most half its multiply-adds and reads the weights once. (A guess, to be
// replaced by a measurement on a real GPU; KITE_VULKAN_TILED=0|1 forces either way.)
constexpr uint64_t kTiledMinCols = 32;
constexpr uint32_t kGetRowsGroup = 128;  // WG in shaders/get_rows.glsl
constexpr uint32_t kChunk = 8;           // elements per decoded chunk (shaders/dequant.glsl)
constexpr uint32_t kPackGroup = 256;     // local size of shaders/mul_mat_pack_x.comp

// The shaders of one weight type. mul_mat[0] takes kMulMatCols columns a tile, mul_mat[1] one
// (n = 1, decode: no work on absent columns); gpu is the same pair in the GPU shape, tiled its
// many-column kernel. Float types add all three for rows that start 16-byte aligned with
// k % 8 == 0 (16-byte weight loads).
struct TypeShaders {
  DType type;
  std::string_view get_rows;
  std::array<std::string_view, 2> mul_mat;
  std::array<std::string_view, 2> gpu;
  std::string_view tiled;
  std::array<std::string_view, 2> mul_mat_a16 = {};
  std::array<std::string_view, 2> gpu_a16 = {};
  std::string_view tiled_a16 = {};
};

constexpr std::array<TypeShaders, 22> kShaders = {{
    {DType::F32,
     "get_rows_f32",
     {"mul_mat_f32", "mul_mat1_f32"},
     {"mmv_gpu_f32", "mmv_gpu1_f32"},
     "mm_tiled_f32",
     {"mul_mat_f32_a16", "mul_mat1_f32_a16"},
     {"mmv_gpu_f32_a16", "mmv_gpu1_f32_a16"},
     "mm_tiled_f32_a16"},
    {DType::F16,
     "get_rows_f16",
     {"mul_mat_f16", "mul_mat1_f16"},
     {"mmv_gpu_f16", "mmv_gpu1_f16"},
     "mm_tiled_f16",
     {"mul_mat_f16_a16", "mul_mat1_f16_a16"},
     {"mmv_gpu_f16_a16", "mmv_gpu1_f16_a16"},
     "mm_tiled_f16_a16"},
    {DType::BF16,
     "get_rows_bf16",
     {"mul_mat_bf16", "mul_mat1_bf16"},
     {"mmv_gpu_bf16", "mmv_gpu1_bf16"},
     "mm_tiled_bf16",
     {"mul_mat_bf16_a16", "mul_mat1_bf16_a16"},
     {"mmv_gpu_bf16_a16", "mmv_gpu1_bf16_a16"},
     "mm_tiled_bf16_a16"},
    {DType::Q4_0, "get_rows_q4_0", {"mul_mat_q4_0", "mul_mat1_q4_0"}, {"mmv_gpu_q4_0", "mmv_gpu1_q4_0"}, "mm_tiled_q4_0"},
    {DType::Q4_1, "get_rows_q4_1", {"mul_mat_q4_1", "mul_mat1_q4_1"}, {"mmv_gpu_q4_1", "mmv_gpu1_q4_1"}, "mm_tiled_q4_1"},
    {DType::Q5_0, "get_rows_q5_0", {"mul_mat_q5_0", "mul_mat1_q5_0"}, {"mmv_gpu_q5_0", "mmv_gpu1_q5_0"}, "mm_tiled_q5_0"},
    {DType::Q5_1, "get_rows_q5_1", {"mul_mat_q5_1", "mul_mat1_q5_1"}, {"mmv_gpu_q5_1", "mmv_gpu1_q5_1"}, "mm_tiled_q5_1"},
    {DType::Q8_0, "get_rows_q8_0", {"mul_mat_q8_0", "mul_mat1_q8_0"}, {"mmv_gpu_q8_0", "mmv_gpu1_q8_0"}, "mm_tiled_q8_0"},
    {DType::Q2_K, "get_rows_q2_k", {"mul_mat_q2_k", "mul_mat1_q2_k"}, {"mmv_gpu_q2_k", "mmv_gpu1_q2_k"}, "mm_tiled_q2_k"},
    {DType::Q3_K, "get_rows_q3_k", {"mul_mat_q3_k", "mul_mat1_q3_k"}, {"mmv_gpu_q3_k", "mmv_gpu1_q3_k"}, "mm_tiled_q3_k"},
    {DType::Q4_K, "get_rows_q4_k", {"mul_mat_q4_k", "mul_mat1_q4_k"}, {"mmv_gpu_q4_k", "mmv_gpu1_q4_k"}, "mm_tiled_q4_k"},
    {DType::Q5_K, "get_rows_q5_k", {"mul_mat_q5_k", "mul_mat1_q5_k"}, {"mmv_gpu_q5_k", "mmv_gpu1_q5_k"}, "mm_tiled_q5_k"},
    {DType::Q6_K, "get_rows_q6_k", {"mul_mat_q6_k", "mul_mat1_q6_k"}, {"mmv_gpu_q6_k", "mmv_gpu1_q6_k"}, "mm_tiled_q6_k"},
    {DType::IQ4_NL, "get_rows_iq4_nl", {"mul_mat_iq4_nl", "mul_mat1_iq4_nl"}, {"mmv_gpu_iq4_nl", "mmv_gpu1_iq4_nl"}, "mm_tiled_iq4_nl"},
    {DType::IQ4_XS, "get_rows_iq4_xs", {"mul_mat_iq4_xs", "mul_mat1_iq4_xs"}, {"mmv_gpu_iq4_xs", "mmv_gpu1_iq4_xs"}, "mm_tiled_iq4_xs"},
    {DType::IQ2_XXS, "get_rows_iq2_xxs", {"mul_mat_iq2_xxs", "mul_mat1_iq2_xxs"}, {"mmv_gpu_iq2_xxs", "mmv_gpu1_iq2_xxs"}, "mm_tiled_iq2_xxs"},
    {DType::IQ2_XS, "get_rows_iq2_xs", {"mul_mat_iq2_xs", "mul_mat1_iq2_xs"}, {"mmv_gpu_iq2_xs", "mmv_gpu1_iq2_xs"}, "mm_tiled_iq2_xs"},
    {DType::IQ2_S, "get_rows_iq2_s", {"mul_mat_iq2_s", "mul_mat1_iq2_s"}, {"mmv_gpu_iq2_s", "mmv_gpu1_iq2_s"}, "mm_tiled_iq2_s"},
    {DType::IQ3_XXS, "get_rows_iq3_xxs", {"mul_mat_iq3_xxs", "mul_mat1_iq3_xxs"}, {"mmv_gpu_iq3_xxs", "mmv_gpu1_iq3_xxs"}, "mm_tiled_iq3_xxs"},
    {DType::IQ3_S, "get_rows_iq3_s", {"mul_mat_iq3_s", "mul_mat1_iq3_s"}, {"mmv_gpu_iq3_s", "mmv_gpu1_iq3_s"}, "mm_tiled_iq3_s"},
    {DType::IQ1_S, "get_rows_iq1_s", {"mul_mat_iq1_s", "mul_mat1_iq1_s"}, {"mmv_gpu_iq1_s", "mmv_gpu1_iq1_s"}, "mm_tiled_iq1_s"},
    {DType::IQ1_M, "get_rows_iq1_m", {"mul_mat_iq1_m", "mul_mat1_iq1_m"}, {"mmv_gpu_iq1_m", "mmv_gpu1_iq1_m"}, "mm_tiled_iq1_m"},
}};

const TypeShaders* shaders_for(DType t) {
  for (const TypeShaders& s : kShaders)
    if (s.type == t) return &s;
  return nullptr;
}

// The layout of P in shaders/mul_mat_push.glsl (scalar block layout).
struct MulMatPush {
  uint64_t w;
  uint64_t dst;
  Rows x;
  uint32_t w_nb1;
  uint32_t dst_nb1;
  uint32_t k;
  uint32_t m;
  uint32_t n;
  uint32_t row_tiles;  // ceil(m / rows per workgroup): kMulMatRows, kGpuRows or kTiledRows
  uint64_t codebooks;  // the IQ codebooks (codebook types only)
};
static_assert(offsetof(MulMatPush, x) == 16 && offsetof(MulMatPush, w_nb1) == 48 &&
              offsetof(MulMatPush, row_tiles) == 68 && offsetof(MulMatPush, codebooks) == 72 &&
              sizeof(MulMatPush) == 80);

// The layout of P in shaders/mul_mat_pack_x.comp (its 52 bytes, padded to 56).
struct PackXPush {
  Rows src;
  uint64_t dst;
  uint32_t k;
  uint32_t kp;
  uint32_t n;
  uint32_t unused = 0;
};
static_assert(offsetof(PackXPush, dst) == 32 && offsetof(PackXPush, n) == 48 && sizeof(PackXPush) == 56);

// The layout of P in shaders/get_rows.glsl (its 44 bytes, padded to 48).
struct GetRowsPush {
  uint64_t table;
  uint64_t ids;
  uint64_t dst;
  uint32_t table_nb1;
  uint32_t dst_nb1;
  uint32_t ne0;
  uint32_t table_rows;
  uint32_t n;
  uint32_t unused = 0;
  uint64_t codebooks;  // the IQ codebooks (codebook types only)
};
static_assert(offsetof(GetRowsPush, table_nb1) == 24 && offsetof(GetRowsPush, n) == 40 &&
              offsetof(GetRowsPush, codebooks) == 48 && sizeof(GetRowsPush) == 56);

// The codebooks' layout as shaders/dequant.glsl reads it (kIq*Offset there).
static_assert(offsetof(quant::IqGrids, iq2xxs) == 0 && offsetof(quant::IqGrids, iq2xs) == 2048 &&
              offsetof(quant::IqGrids, iq2s) == 6144 && offsetof(quant::IqGrids, iq3xxs) == 14336 &&
              offsetof(quant::IqGrids, iq3s) == 15360 && offsetof(quant::IqGrids, iq1s) == 17408);

// The codebooks' device address for a table of type t (0 for the types without a codebook).
Result<uint64_t> codebooks_for(Stream& s, DType t) {
  if (!quant::is_codebook_type(t)) return uint64_t{0};
  return s.codebooks();
}

constexpr uint64_t kMax32 = std::numeric_limits<uint32_t>::max();
constexpr uint64_t kMaxI32 = std::numeric_limits<int32_t>::max();

uint64_t ceil_div(uint64_t a, uint64_t b) {
  return (a + b - 1) / b;
}

// A 2-D table of `t`'s blocks whose rows the shaders can address: whole blocks along ne[0],
// blocks packed in a row, rows aligned for the shaders' 16-bit (32-bit for F32) reads and at
// most 4 GiB apart.
bool weight_layout_ok(const Tensor* t) {
  const quant::TypeTraits* tr = quant::find_traits(t->type);
  if (tr == nullptr || shaders_for(t->type) == nullptr) return false;
  if (t->ne[2] != 1 || t->ne[3] != 1 || t->ne[0] <= 0 || t->ne[0] % tr->block_size != 0) return false;
  if (static_cast<uint64_t>(t->ne[0]) > kMaxI32 || static_cast<uint64_t>(t->ne[1]) > kMaxI32) return false;
  const size_t align = t->type == DType::F32 ? 4 : 2;
  return t->nb[0] == tr->type_size && t->nb[1] % align == 0 && t->nb[1] <= kMax32;
}

// An f32 output written as dense rows at most 4 GiB apart.
bool f32_rows_ok(const Tensor& n) {
  return n.type == DType::F32 && n.nb[0] == sizeof(float) && n.nb[1] % sizeof(float) == 0 && n.nb[1] <= kMax32;
}

bool mul_mat_supported(const Tensor& n) {
  const Tensor* w = n.src[0];
  const Tensor* x = n.src[1];
  if (w == nullptr || x == nullptr || !weight_layout_ok(w) || !f32_rows_ok(n)) return false;
  if (x->type != DType::F32 || x->ne[0] != w->ne[0] || x->nb[0] != sizeof(float)) return false;
  const Tensor* b = n.src[2];  // the bias
  if (b != nullptr && (b->type != DType::F32 || !b->is_contiguous() || b->ne[0] != w->ne[1])) return false;
  for (int d = 1; d < kMaxDims; ++d)
    if (x->nb[d] % sizeof(float) != 0 || x->nb[d] > kMax32 || static_cast<uint64_t>(x->ne[d]) > kMaxI32) return false;
  // The shaders' flat tile and element indices are 32-bit.
  const uint64_t padded = ceil_div(static_cast<uint64_t>(x->ne[0]), kChunk) * kChunk;
  if (padded * static_cast<uint64_t>(x->n_rows()) > kMax32) return false;
  const uint64_t tiles = ceil_div(static_cast<uint64_t>(w->ne[1]), kMulMatRows) *
                         ceil_div(static_cast<uint64_t>(x->n_rows()), kMulMatCols);
  return tiles <= kMax32;
}

// Whether mul_mat runs in the GPU shape on stream s: KITE_VULKAN_MATMUL=gpu or =cpu forces
// one shape (so both run, and are tested, on any device); any other value is ignored.
bool gpu_shape(const Stream& s) {
  const char* env = std::getenv("KITE_VULKAN_MATMUL");
  const std::string_view v = env == nullptr ? std::string_view() : std::string_view(env);
  if (v == "gpu") return true;
  if (v == "cpu") return false;
  return s.is_gpu();
}

// Whether the GPU shape multiplies `cols` columns in tiles: from kTiledMinCols on, unless
// KITE_VULKAN_TILED=0 (never) or =1 (from 2 columns on) says otherwise; read per call.
bool use_tiled(uint64_t cols) {
  const char* env = std::getenv("KITE_VULKAN_TILED");
  const std::string_view v = env == nullptr ? std::string_view() : std::string_view(env);
  if (v == "0") return false;
  if (v == "1") return cols > 1;
  return cols >= kTiledMinCols;
}

bool get_rows_supported(const Tensor& n) {
  const Tensor* t = n.src[0];
  const Tensor* ids = n.src[1];
  if (t == nullptr || ids == nullptr || !weight_layout_ok(t) || !f32_rows_ok(n)) return false;
  if (ids->type != DType::I32 || !ids->is_contiguous() || n.ne[0] != t->ne[0]) return false;
  // The shader's flat chunk index is 32-bit.
  return static_cast<uint64_t>(ids->n_elements()) * ceil_div(static_cast<uint64_t>(t->ne[0]), kChunk) <= kMax32;
}

// w · x into n (mul_mat without the bias).
Status mul_mat_product(Stream& s, Tensor* n) {
  const Tensor* w = n->src[0];
  const Tensor* x = n->src[1];
  const uint64_t m = static_cast<uint64_t>(w->ne[1]), cols = static_cast<uint64_t>(x->n_rows());
  if (m == 0 || cols == 0) return ok_status();
  MulMatPush p{};
  KITE_ASSIGN_OR_RETURN(p.w, s.address(w));
  KITE_ASSIGN_OR_RETURN(p.dst, s.address(n));
  KITE_ASSIGN_OR_RETURN(const uint64_t xp, s.address(x));
  p.x = rows_of(x, xp);
  p.w_nb1 = static_cast<uint32_t>(w->nb[1]);
  p.dst_nb1 = static_cast<uint32_t>(n->nb[1]);
  p.k = static_cast<uint32_t>(w->ne[0]);
  p.m = static_cast<uint32_t>(m);
  p.n = static_cast<uint32_t>(cols);
  p.row_tiles = static_cast<uint32_t>(ceil_div(m, kMulMatRows));
  KITE_ASSIGN_OR_RETURN(p.codebooks, codebooks_for(s, w->type));
  // The shader reads activations as 16-byte vectors, whole chunks of 8: rows that do not allow
  // it are copied to aligned, zero-padded scratch first.
  const bool in_place =
      xp % 16 == 0 && x->nb[1] % 16 == 0 && x->nb[2] % 16 == 0 && x->nb[3] % 16 == 0 && p.k % kChunk == 0;
  if (!in_place) {
    PackXPush q{};
    q.src = p.x;
    q.k = p.k;
    q.kp = static_cast<uint32_t>(ceil_div(p.k, kChunk) * kChunk);
    q.n = p.n;
    const uint64_t elems = uint64_t{q.kp} * q.n;
    KITE_ASSIGN_OR_RETURN(q.dst, s.scratch("mul_mat.x", elems * sizeof(float)));
    KITE_TRY(s.dispatch("mul_mat_pack_x", q, ceil_div(elems, kPackGroup)));
    p.x = dense_rows(q.dst, q.kp, q.n);
  }
  const TypeShaders& sh = *shaders_for(w->type);
  const bool w_a16 = !sh.mul_mat_a16[0].empty() && p.w % 16 == 0 && p.w_nb1 % 16 == 0 && p.k % kChunk == 0;
  const size_t variant = cols == 1 ? 1 : 0;
  // The GPU shape's group count must fit the shader's 32-bit index (supports() checked only the
  // CPU shape's, which is smaller); past that, the CPU shape runs.
  const uint64_t gpu_groups = ceil_div(m, kGpuRows) * ceil_div(cols, kGpuCols);
  const uint64_t tiled_groups = ceil_div(m, kTiledRows) * ceil_div(cols, kTiledCols);
  if (gpu_shape(s) && tiled_groups <= kMax32 && use_tiled(cols)) {
    p.row_tiles = static_cast<uint32_t>(ceil_div(m, kTiledRows));
    return s.dispatch(w_a16 ? sh.tiled_a16 : sh.tiled, p, tiled_groups);
  }
  if (gpu_shape(s) && gpu_groups <= kMax32) {
    p.row_tiles = static_cast<uint32_t>(ceil_div(m, kGpuRows));
    return s.dispatch((w_a16 ? sh.gpu_a16 : sh.gpu)[variant], p, gpu_groups);
  }
  return s.dispatch((w_a16 ? sh.mul_mat_a16 : sh.mul_mat)[variant], p,
                    uint64_t{p.row_tiles} * ceil_div(cols, kMulMatCols));
}

Status mul_mat(Stream& s, Tensor* n) {
  KITE_TRY(mul_mat_product(s, n));
  if (const Tensor* bias = n->src[2]; bias != nullptr) KITE_TRY(binary(s, 0, n, n, bias));
  return ok_status();
}

Status get_rows(Stream& s, Tensor* n) {
  const Tensor* t = n->src[0];
  const Tensor* ids = n->src[1];
  const uint64_t rows = static_cast<uint64_t>(ids->n_elements());
  if (rows == 0 || n->ne[0] == 0) return ok_status();
  GetRowsPush p{};
  KITE_ASSIGN_OR_RETURN(p.table, s.address(t));
  KITE_ASSIGN_OR_RETURN(p.ids, s.address(ids));
  KITE_ASSIGN_OR_RETURN(p.dst, s.address(n));
  p.table_nb1 = static_cast<uint32_t>(t->nb[1]);
  p.dst_nb1 = static_cast<uint32_t>(n->nb[1]);
  p.ne0 = static_cast<uint32_t>(t->ne[0]);
  p.table_rows = static_cast<uint32_t>(t->ne[1]);
  p.n = static_cast<uint32_t>(rows);
  KITE_ASSIGN_OR_RETURN(p.codebooks, codebooks_for(s, t->type));
  const uint64_t chunks = rows * ceil_div(p.ne0, kChunk);
  return s.dispatch(shaders_for(t->type)->get_rows, p, ceil_div(chunks, kGetRowsGroup));
}

}  // namespace

bool matmul_supported(const Tensor& n) {
  if (n.op == Op::kMulMat) return mul_mat_supported(n);
  if (n.op == Op::kGetRows) return get_rows_supported(n);
  return false;
}

Status run_matmul(Stream& s, Tensor* n) {
  if (n->op == Op::kMulMat) return mul_mat(s, n);
  if (n->op == Op::kGetRows) return get_rows(s, n);
  return make_error("vulkan: ", op_name(n->op), " is not a mul_mat or get_rows node");
}

}  // namespace kite::vk

// kite/backends/cuda/kernels.h — host-callable launchers of the CUDA kernels (one .cu file per op
// family). Plain C++ (only the CUDA runtime API types): the backend (cuda_backend.cpp) unpacks
// tensors into these argument structs and launches on its stream. Every launcher returns the
// launch's cudaError_t (cudaGetLastError); none allocates or synchronizes.
//
// Type ids are quant::Type values (formats/quant/types.h) as int.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace kite::cuda {

// Whether kernels launch with programmatic dependent launch (launch.cuh): every device opened so
// far is sm_90 or newer and KITE_CUDA_PDL is not 0. Device::open reports each device's
// compute capability (10 * major + minor).
bool programmatic_launch();
void note_compute_capability(int cc);

// Type ids used by the kernels (quant::Type values).
enum TypeId : int {
  kF32 = 0, kF16 = 1, kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8,
  kQ2_K = 10, kQ3_K = 11, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14, kIQ2_XXS = 16, kIQ2_XS = 17, kIQ3_XXS = 18,
  kIQ1_S = 19, kIQ4_NL = 20, kIQ3_S = 21, kIQ2_S = 22, kIQ4_XS = 23, kI32 = 26, kIQ1_M = 29, kBF16 = 30,
};

// True for the block-quantized weight types the kernels read (not the float types).
bool quant_type_supported(int type);
// Elements per block / bytes per block of a supported type (float types: 1 / element size).
int type_block_elems(int type);
int type_block_bytes(int type);

// A 4-D row walk: row r of a tensor = (i1, i2, i3) with r = i1 + ne1 * (i2 + ne2 * i3).
struct Rows {
  void* p = nullptr;
  int64_t ne1 = 1, ne2 = 1, ne3 = 1;
  size_t nb1 = 0, nb2 = 0, nb3 = 0;
};

// ---- elementwise (k_elementwise.cu) -------------------------------------------------------
// op: 0 add, 1 mul, 2 swiglu (silu(a) * b), 3 geglu (gelu(a) * b, tanh form); b is broadcast
// over rows (b row = i % b.ne).
cudaError_t launch_binary(int op, Rows dst, Rows a, Rows b, int64_t ne0, int64_t n_rows, cudaStream_t s);
// a * scale; soft-capped when cap > 0: cap * tanh(a * scale / cap).
cudaError_t launch_scale(Rows dst, Rows a, float scale, float cap, int64_t ne0, int64_t n_rows, cudaStream_t s);
// w may be null.
cudaError_t launch_rms_norm(Rows dst, Rows a, const float* w, float eps, int64_t ne0, int64_t n_rows,
                            cudaStream_t s);
// launch_rms_norm's arguments, for two norms of rows of one length (a layer's per-head q_norm and
// k_norm) in one launch, each result as launch_rms_norm writes it.
struct NormArgs {
  Rows dst, src;
  const float* w = nullptr;
  float eps = 0.f;
  int64_t ne0 = 0, n_rows = 0;
};
cudaError_t launch_rms_norm_pair(const NormArgs& a, const NormArgs& b, cudaStream_t s);

struct RopeArgs {
  Rows dst, src;            // [hd, n_head, n_tok] (ne1 = n_head, ne2 = n_tok)
  const int32_t* pos = nullptr;
  int64_t hd = 0, n_head = 0, n_tok = 0;
  int mode = 0;             // RopeMode
  int n_rot = 0;
  int scaling = 0;          // RopeScaling
  int orig_ctx = 0;
  float base = 10000.f, factor = 1.f, low_freq = 1.f, high_freq = 4.f, beta_fast = 32.f, beta_slow = 1.f,
        attn_factor = 1.f;
  const float* freq_factors = nullptr;  // F32 [n_rot / 2] divisors (replace the llama3 formula), or null
};
// `b` (optional): a second tensor roped in the same launch (a layer's keys beside its queries).
cudaError_t launch_rope(const RopeArgs& a, cudaStream_t s, const RopeArgs* b = nullptr);

// Rows of `src` (float type src_type, 4-D walk) converted to dst_type (F32/F16/BF16/Q8_0) at
// dst rows; `dst_rows` (optional, I32) redirects row r to dst row dst_rows[r] (kv_write).
cudaError_t launch_convert_rows(int src_type, Rows src, int dst_type, Rows dst, const int32_t* dst_rows,
                                int64_t ne0, int64_t n_rows, cudaStream_t s);
// The same as a struct, and optionally a second conversion in the same launch (a layer's keys
// and values written to the cache), both to Q8_0 or both to float types.
struct RowConversion {
  int src_type = kF32;
  Rows src;
  int dst_type = kF32;
  Rows dst;
  const int32_t* dst_rows = nullptr;
  int64_t ne0 = 0, n_rows = 0;
};
cudaError_t launch_convert_rows(const RowConversion& a, cudaStream_t s, const RowConversion* b = nullptr);
// A layer's ropes of q and k and its kv_writes of roped k (kc: [hd * n_head, n_tok] F32 rows of
// k's rope output) and of v, both caches float-typed or both Q8_0, in one launch: each result as
// launch_rope and launch_convert_rows write it.
cudaError_t launch_rope_kv(const RopeArgs& q, const RopeArgs& k, const RowConversion& kc, const RowConversion& vc,
                           cudaStream_t s);

// ---- top_k (k_top_k.cu) ----------------------------------------------------------------
// Row r of `src` (F32, ne0 contiguous floats) -> row r of `dst` (F32 [2k + 1 (+ 2)]):
// Graph::top_k (k in 1..128); draw.p null, or row r of I32 [4, rows] draw words.
cudaError_t launch_top_k(Rows dst, Rows src, Rows draw, int64_t ne0, int64_t n_rows, int k, bool log_sum_exp,
                         cudaStream_t s);

// ---- dequantization (k_dequant.cu) --------------------------------------------------------
// get_rows: dst F32 contiguous [ne0, n]; table row ids[r] (table rows `table_nb1` bytes apart).
cudaError_t launch_get_rows(int type, const void* table, size_t table_nb1, const int32_t* ids, float* dst,
                            int64_t ne0, int64_t n, cudaStream_t s);
// Rows of a quantized or float `src` (4-D walk) to dst_type F32/F16/BF16 at dst rows.
cudaError_t launch_dequant_rows(int type, Rows src, int dst_type, Rows dst, int64_t ne0, int64_t n_rows,
                                cudaStream_t s);
// `rows` consecutive weight rows (row_bytes apart) to a dense [k, rows] matrix of F16 (dst_f16)
// or F32 (!dst_f16), for cuBLAS.
cudaError_t launch_dequant_matrix(int type, const void* w, size_t row_bytes, int64_t k, int64_t rows, void* dst,
                                  bool dst_f16, cudaStream_t s);

// ---- matrix-vector products for 1..8 activation columns (k_mmv*.cu) -----------------------
inline constexpr int kMaxMmvCols = 8;
// Activations quantized for the int8 kernels: per column k int8 codes (col stride k bytes) and
// per 32-element block a float4 {d, d * sum(q[0..15]), d * sum(q[16..31]), 0}.
cudaError_t launch_quantize_act(const float* x, size_t ldx, int64_t k, int64_t n, int8_t* q, float* ds,
                                cudaStream_t s);
// rms_norm (launch_rms_norm's result, written to dst: dense [ne0, n_rows]) and its int8
// activations (launch_quantize_act's q and ds of it, bit for bit) in one launch; ne0 % 32 == 0.
cudaError_t launch_rms_norm_quantize(float* dst, Rows a, const float* w, float eps, int64_t ne0, int64_t n_rows,
                                     int8_t* q, float* ds, cudaStream_t s);

// One mat-vec launch multiplies the same activation columns by up to kMaxMatVecOuts weights of
// one type and k (a layer's q, k and v; its gate and up): weight j's row i times column c goes to
// out[j].dst[c * ldd + i]. With `glu` set (two weights of equal m: gate, then up) one warp
// computes row i of both, and also writes glu[c * glu_ldd + i] = silu(gate) * up (gelu(gate) * up
// with `gelu`), the swiglu (geglu) op's formula, so the fused result has the unfused one's bits.
// With `sum` set (one weight) it also writes sum[c * sum_ld + i] = add[c * add_ld + i] + dst (a
// layer's residual add).
// With `glu` and `glu_q` set (m a multiple of 32; int8 weights only) the launch also writes the
// swiglu output's int8 activations for the down projection after it, as launch_quantize_act
// would (glu_q: m * n codes, glu_ds: m / 32 * n float4 scales): the last of the blocks that
// write a 32-row stretch quantizes it. glu_count: m / 32 zeroed counters (left zeroed).
// With `sum` and `norm` set (m a multiple of 32, kMaxNormTailCols column) the last block
// to finish also writes rms_norm of the sum's columns (launch_rms_norm's bits; norm: dense
// [m, n]), and with norm_q its int8 activations (launch_rms_norm_quantize's): a layer's residual
// add, then the next block's norm. norm_count: one zeroed counter (left zeroed).
// With out[j].bias set (no glu), what output j stores (and its epilogue reads) is its product
// plus bias[i], with the add op's formula (qwen2's q, k and v biases).
// With `with_rope` set (a layer's q, k and v from rope.first on as the outputs: all three, q and
// k, or v alone; kMaxRopeTailCols column, every m a multiple of 4, float caches) each block also
// ropes its own rows of q and k and writes k's and v's rows to the caches, as
// launch_rope_kv(rope.q, rope.k, rope.kc, rope.vc) would after the launch (its bits). llama's
// adjacent rotary pairs fall in one block's rows; with rotated halves (mode 2, n_rot a multiple
// of 4) a block's four rows of q or k are two pairs, rows e, e + 1, e + n_rot / 2 and
// e + 1 + n_rot / 2 of a head (matvec_rope_row).
inline constexpr int kMaxMatVecOuts = 3;
struct MatVecOut {
  const void* w = nullptr;
  size_t row_bytes = 0;
  int64_t m = 0;
  float* dst = nullptr;
  int64_t ldd = 0;
  const float* bias = nullptr;  // F32 [m], or null
};
struct MatVecRope {
  enum Role { kQ = 0, kK = 1, kV = 2 };
  int first = kQ;        // the role of out[0]; out[j] is role first + j
  RopeArgs q, k;         // src: q's and k's outputs as [hd, n_head, n_tok] (or their head norms)
  RowConversion kc, vc;  // kc: k's rope output to its cache; vc: v's output to its cache
  // qwen3: q and k normalized per head before their ropes (launch_rms_norm_pair(qn, kn)'s bits;
  // src: the outputs as rows of hd, dst: the ropes' sources; hd a multiple of 4, below 1024). A
  // head's last block to finish normalizes, ropes and writes it. head_count: q's n_head, then
  // k's, zeroed counters (left zeroed).
  bool head_norm = false;
  NormArgs qn, kn;
  unsigned* head_count = nullptr;
};
inline constexpr int kMaxRopeTailCols = 1;
struct MatVecJob {
  MatVecOut out[kMaxMatVecOuts];
  int n_out = 1;
  float* glu = nullptr;
  int64_t glu_ldd = 0;
  bool gelu = false;  // the glu's activation: gelu's tanh form (geglu), else silu (swiglu)
  int8_t* glu_q = nullptr;
  float* glu_ds = nullptr;
  unsigned* glu_count = nullptr;
  const float* add = nullptr;
  int64_t add_ld = 0;
  float* sum = nullptr;
  int64_t sum_ld = 0;
  float* norm = nullptr;
  const float* norm_w = nullptr;  // (may be null)
  float norm_eps = 0.f;
  int8_t* norm_q = nullptr;
  float* norm_ds = nullptr;
  unsigned* norm_count = nullptr;
  bool with_rope = false;
  MatVecRope rope;
};
// One block normalizes the sum after the others finished, as the norm's own launch would with
// one block a column: it saves that launch for a single sequence's decode step, but would
// serialize the columns of a batch.
inline constexpr int kMaxNormTailCols = 1;
// Quantized W of `type`, from launch_quantize_act's q and ds; n (1..8) columns.
cudaError_t launch_mmvq(int type, const MatVecJob& job, int64_t k, const int8_t* q, const float* ds, int n,
                        cudaStream_t s);
// Float weights (F32/F16/BF16): x F32 columns ldx floats apart.
cudaError_t launch_mmv_float(int type, const MatVecJob& job, int64_t k, const float* x, size_t ldx, int n,
                             cudaStream_t s);
// F32 [k, n] (ldx floats apart) -> F16 contiguous [k, n].
cudaError_t launch_f32_to_f16(const float* x, size_t ldx, int64_t k, int64_t n, void* dst, cudaStream_t s);

// Per-type mat-vec launchers (one .cu file per family, so the build parallelizes).
cudaError_t launch_mmvq_legacy(int type, const MatVecJob& job, int64_t k, const int8_t* q, const float* ds, int n,
                               cudaStream_t s);
cudaError_t launch_mmvq_kquant(int type, const MatVecJob& job, int64_t k, const int8_t* q, const float* ds, int n,
                               cudaStream_t s);
cudaError_t launch_mmvq_iq(int type, const MatVecJob& job, int64_t k, const int8_t* q, const float* ds, int n,
                           cudaStream_t s);

// ---- mixture of experts (mmvq.cuh's k_mmvq_*.cu instances, k_elementwise.cu) --------------
// Op::kMulMatId with quantized experts (the types launch_mmvq takes): w [k, m, n_expert] (rows
// row_bytes apart, experts expert_bytes apart); route: Graph::top_k's rows, route_ld floats apart
// (n_used values, then their indices as floats); q/ds: launch_quantize_act of the activations,
// nx columns a token (1: every slot reads its token's column; n_used: slot j column j). dst
// [m, n_used, n_tok] contiguous; a slot whose index is no expert (a route's padding) gets zeros.
// One warp a row and (token, slot) pair, as the mat-vec kernels: a decode step's shape (a batch
// re-reads an expert's rows for each of its pairs).
struct MatVecIdArgs {
  const void* w = nullptr;
  size_t row_bytes = 0, expert_bytes = 0;
  int64_t k = 0, m = 0, n_expert = 0;
  const float* route = nullptr;
  int64_t route_ld = 0;
  int n_used = 1, nx = 1;
  int64_t n_tok = 0;
  const int8_t* q = nullptr;
  const float* ds = nullptr;
  float* dst = nullptr;
};
cudaError_t launch_mmvq_id(int type, const MatVecIdArgs& a, cudaStream_t s);
cudaError_t launch_mmvq_id_legacy(int type, const MatVecIdArgs& a, cudaStream_t s);
cudaError_t launch_mmvq_id_kquant(int type, const MatVecIdArgs& a, cudaStream_t s);
cudaError_t launch_mmvq_id_iq(int type, const MatVecIdArgs& a, cudaStream_t s);
// Op::kMoeSum: dst [m, n_tok] (contiguous), column t = sum over slots j of y[:, j, t] (contiguous
// [m, n_used, n_tok]) times the route's weight of slot j: exp(value - log_sum_exp), with `norm`
// over their sum (at least 2^-14), times `scale` unless 0 or 1; 0 for padding (index -1).
cudaError_t launch_moe_sum(float* dst, const float* y, int64_t m, int n_used, int64_t n_tok, const float* route,
                           int64_t route_ld, bool norm, float scale, cudaStream_t s);

// ---- int8 tensor-core matrix-matrix product (k_mmq.cu) ------------------------------------
// dst[c * ldd + i] = W row i · column c for any number of columns n, quantized W of `type` (the
// types launch_mmvq takes), from launch_quantize_act's q/ds; mma.sync int8 (sm_80+). On a device
// of `sm_count` SMs the product may be split over k (mmq_splits ranges) to fill the SMs: then
// `partial` holds splits * m * n floats of scratch (unused, may be null, for one range).
cudaError_t launch_mmq(int type, const void* w, size_t row_bytes, int64_t k, int64_t m, const int8_t* q,
                       const float* ds, int64_t n, float* dst, int64_t ldd, int sm_count, float* partial,
                       cudaStream_t s);
// How many k ranges launch_mmq splits an [k, m] x [k, n] product into on `sm_count` SMs.
int mmq_splits(int64_t k, int64_t m, int64_t n, int sm_count);

// ---- attention over the paged cache (k_attention.cu) --------------------------------------
struct AttentionArgs {
  const float* q = nullptr;  // [hd, n_head, n_tok]: head h of token t at q + h*q_nb1 + t*q_nb2 (bytes)
  size_t q_nb1 = 0, q_nb2 = 0;
  const uint8_t* k = nullptr;  // cache rows [hd * n_kv, n_slots], k_nb1 bytes apart
  const uint8_t* v = nullptr;
  size_t k_nb1 = 0, v_nb1 = 0;
  int k_type = 0, v_type = 0;
  const int32_t* pos = nullptr;
  const int32_t* seq = nullptr;
  const int32_t* table = nullptr;  // [max_blocks, n_seqs]
  int max_blocks = 0, block_size = 16;
  int n_kv = 1, group = 1, hd = 0, n_tok = 0;
  int window = 0;  // sliding window (Graph::attention): keys pos - window + 1 .. pos; 0: all
  float scale = 1.f;
  float softcap = 0.f;  // scaled scores soft-capped: softcap * tanh(score / softcap); 0: not
  float* out = nullptr;      // [hd * n_head, n_tok] contiguous
  float* part = nullptr;     // partials: [n_tok][n_head][max_chunks][hd + 2]
  int max_chunks = 1;        // grid width; see attention_max_chunks()
  // Rows whose sequence has at least this many consecutive rows in the batch (prefill chunks)
  // take the tensor-core kernel, the others (decode) the CUDA-core one; 0: all the CUDA-core
  // one. A row's path thus depends on its own sequence's rows only.
  int tc_min_run = 0;
  // Optional, with every row on the CUDA-core kernel (tc_min_run 0) and hd % 32 == 0: out's int8
  // activations too (launch_quantize_act's q and ds of out, k = hd * n_head), for the output
  // projection after it.
  int8_t* q8 = nullptr;
  float* q8_ds = nullptr;
  // Optional, with every row on the CUDA-core kernel (tc_min_run 0): n_tok * n_kv zeroed counters
  // (left zeroed). The last chunk block of a split (token, KV head) to finish then merges its
  // heads' partials, with the merge kernel's arithmetic, and the merge kernel is not launched.
  unsigned* count = nullptr;
};
// Chunks a token's keys may be split into, for a context of at most `max_ctx` positions.
int attention_max_chunks(int64_t max_ctx);
size_t attention_partial_floats(int n_tok, int n_head, int hd, int max_chunks);
bool attention_shape_ok(int hd, int group);
// Whether the tensor-core kernel (k_attention_tc.cu) takes these arguments (tc_min_run > 0 is
// allowed): head size 64 or 128, F16 or Q8_0 caches.
bool attention_tc_ok(const AttentionArgs& a);
// The CUDA-core kernel (every shape attention_shape_ok takes) and, with tc_min_run > 0, the
// tensor-core one, each for its rows; then the merge of split tokens (unless `count` has the
// CUDA-core kernel merge them). (An invalid q8 or count request: cudaErrorInvalidValue.)
cudaError_t launch_attention(const AttentionArgs& a, cudaStream_t s);

// ---- bandwidth (k_bandwidth.cu) -----------------------------------------------------------
cudaError_t launch_copy_kernel(const void* src, void* dst, size_t bytes, cudaStream_t s);

}  // namespace kite::cuda

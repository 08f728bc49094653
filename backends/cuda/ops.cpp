// Per-op launch on the device: unpacks a graph node into the kernels' argument structs
// (kernels.h) and launches on the device's stream. No allocation after a shape's first step
// (scratch only grows) and no synchronization, except in the step that times a new matmul
// shape's two ways.
//
// mul_mat: up to kMaxMmvCols activation columns take the matrix-vector kernels (int8 __dp4a for
// quantized weights, f32 for float weights); more columns the matrix path (ops_matmul.cpp: the
// int8 tensor-core kernel or cuBLAS, whichever ran faster when the shape was first timed).
//
// attention: rows of prefill chunks (a sequence's run of kAttentionTcMinRun+ rows) on tensor
// cores where the shape allows (k_attention_tc.cu), decode rows on the CUDA-core kernel.
//
// run_fused: neighbouring nodes that one launch can compute together (device.h), so that a
// decode step of a llama layer is 5 launches instead of 24 (8 for a batch); every node's result
// still lands where the planner put it, with the bits of its own kernel.
#include <algorithm>
#include <cstdlib>
#include <initializer_list>
#include <iterator>
#include <string_view>

#include "backends/cuda/device.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/ops_matmul.h"
#include "src/core/graph.h"

namespace kite::cuda {
namespace {

bool weight_type_ok(DType t) { return is_float(t) || quant_type_supported(tid(t)); }

bool kv_type_ok(DType t, int64_t n) { return is_float(t) || (t == DType::Q8_0 && n % 32 == 0); }

Rows rows_of(const Tensor* t, void* p) {
  Rows r;
  r.p = p;
  r.ne1 = t->ne[1], r.ne2 = t->ne[2], r.ne3 = t->ne[3];
  r.nb1 = t->nb[1], r.nb2 = t->nb[2], r.nb3 = t->nb[3];
  return r;
}

// A contiguous [ne0, rows] F32 matrix.
Rows dense_rows(void* p, int64_t ne0, int64_t rows, size_t elem = 4) {
  Rows r;
  r.p = p;
  r.ne1 = rows;
  r.nb1 = static_cast<size_t>(ne0) * elem;
  r.nb2 = r.nb3 = r.nb1 * static_cast<size_t>(rows);
  return r;
}

// Rows of x equally spaced (one stride for all rows), f32 elements contiguous.
bool uniform_rows(const Tensor* x) {
  return x->nb[0] == sizeof(float) && x->nb[1] % sizeof(float) == 0 &&
         x->nb[2] == x->nb[1] * static_cast<size_t>(x->ne[1]) && x->nb[3] == x->nb[2] * static_cast<size_t>(x->ne[2]);
}

// Rows of a sequence with at least this many consecutive rows in the batch (a prefill chunk)
// take the tensor-core attention kernel where it applies (attention_tc_ok); the others (decode,
// short drafts) the CUDA-core kernel, whose blocks spread one token's keys over four warps. 16 is
// a guess until measured on a GPU.
constexpr int kAttentionTcMinRun = 16;

// AttentionArgs::tc_min_run. KITE_CUDA_ATTN_TC=0: never the tensor-core kernel; =1: every row
// (where it applies; read per call, so tests can switch it).
int attention_tc_min_run(const AttentionArgs& a) {
  if (!attention_tc_ok(a)) return 0;
  const char* env = std::getenv("KITE_CUDA_ATTN_TC");
  if (env != nullptr && env[0] == '0' && env[1] == '\0') return 0;
  if (env != nullptr && env[0] == '1' && env[1] == '\0') return 1;
  return a.n_tok >= kAttentionTcMinRun ? kAttentionTcMinRun : 0;
}

Result<Activations> activations(Device& dev, OpScratch& sc, const Tensor* x) {
  const int64_t k = x->ne[0], cols = x->n_rows();
  KITE_ASSIGN_OR_RETURN(uint8_t * xp, dev.address(x));
  if (uniform_rows(x)) return Activations{reinterpret_cast<const float*>(xp), x->nb[1] / sizeof(float)};
  KITE_ASSIGN_OR_RETURN(void* xs, dev.scratch(sc.x, static_cast<size_t>(k * cols) * sizeof(float), "activation"));
  KITE_LAUNCH(launch_convert_rows(kF32, rows_of(x, xp), kF32, dense_rows(xs, k, cols), nullptr, k, cols, dev.stream()));
  return Activations{static_cast<const float*>(xs), static_cast<size_t>(k)};
}

// The int8 activations' scratch (launch_quantize_act's q and ds) sized for x: the first pair
// (q, ds), or the second (q2, ds2).
Result<Int8Activations> int8_scratch(Device& dev, OpScratch& sc, const Tensor* x, bool second = false) {
  const int64_t k = x->ne[0], cols = x->n_rows();
  Scratch& qs = second ? sc.q2 : sc.q;
  Scratch& dss = second ? sc.ds2 : sc.ds;
  const void *q0 = qs.ptr.get(), *ds0 = dss.ptr.get();
  KITE_ASSIGN_OR_RETURN(void* qp, dev.scratch(qs, static_cast<size_t>(k * cols), "int8 activation"));
  KITE_ASSIGN_OR_RETURN(void* dsp, dev.scratch(dss, static_cast<size_t>(k / 32 * cols) * 16, "activation scale"));
  if (qp != q0 || dsp != ds0) sc.int8 = {};  // (what it held is gone)
  return Int8Activations{x, static_cast<int8_t*>(qp), static_cast<float*>(dsp)};
}

}  // namespace

Result<Int8Activations> int8_activations(Device& dev, OpScratch& sc, const Tensor* x, const Activations& a) {
  if (sc.int8.of == x) return sc.int8;
  KITE_ASSIGN_OR_RETURN(Int8Activations q, int8_scratch(dev, sc, x));
  KITE_LAUNCH(launch_quantize_act(a.x, a.ldx, x->ne[0], x->n_rows(), q.q, q.ds, dev.stream()));
  sc.int8 = q;
  return q;
}

namespace {

// A matmul whose activations go the int8 way (launch_quantize_act, then mmvq or mmq).
bool int8_matmul(const Device& dev, const Tensor* n) {
  if (n->op != Op::kMulMat || is_float(n->src[0]->type)) return false;
  return n->src[1]->n_rows() <= kMaxMmvCols || use_mmq(dev, n);
}

// n zeroed counters (MatVecJob::glu_count, AttentionArgs::count: each launch leaves them zeroed).
Result<unsigned*> zeroed_counters(Device& dev, OpScratch& sc, int64_t n) {
  const void* before = sc.count.ptr.get();
  KITE_ASSIGN_OR_RETURN(void* p, dev.scratch(sc.count, static_cast<size_t>(n) * sizeof(unsigned), "counter"));
  if (p != before) KITE_CUDA_CHECK(cudaMemsetAsync(p, 0, sc.count.bytes, dev.stream()));
  return static_cast<unsigned*>(p);
}

// What a mat-vec launch (MatVecJob) computes beside its products: `epilogue`, the swiglu (or
// geglu) of a gate/up pair or the add of one product to a residual, and then that sum's rms_norm
// (`norm`). With `int8_epilogue` (a glu epilogue of int8 weights, m % 32 == 0) it also writes the
// glu output's int8 activations, for the down projection after it, with `norm_int8` the
// norm's (an int8 matmul of it follows). With `rope` (of a layer's q, k and v, the group's from
// rope->first on; one column) it also ropes q and k and writes k and v to the caches.
struct MatVecExtras {
  Tensor* epilogue = nullptr;
  bool int8_epilogue = false;
  Tensor* norm = nullptr;
  bool norm_int8 = false;
  const MatVecRope* rope = nullptr;
};

// One matmul, or (mat-vec shapes only) several weights against the same activations in one
// launch, with what `ex` adds to it. A matmul's bias (src[2]) is added by the mat-vec kernels
// as they store, or by an add launch after the other kernels.
Status mul_mat(Device& dev, OpScratch& sc, std::span<Tensor* const> group, const MatVecExtras& ex = {}) {
  Tensor* const epilogue = ex.epilogue;
  Tensor* n = group[0];
  const Tensor* w = n->src[0];
  const Tensor* x = n->src[1];
  const int64_t k = w->ne[0], m = w->ne[1], cols = x->n_rows();
  const cudaStream_t s = dev.stream();
  KITE_ASSIGN_OR_RETURN(const Activations act, activations(dev, sc, x));

  if (cols <= kMaxMmvCols) {
    MatVecJob job;
    job.n_out = static_cast<int>(group.size());
    for (size_t j = 0; j < group.size(); ++j) {
      const Tensor* wj = group[j]->src[0];
      KITE_ASSIGN_OR_RETURN(uint8_t * wjp, dev.address(wj));
      KITE_ASSIGN_OR_RETURN(uint8_t * djp, dev.address(group[j]));
      job.out[j] = MatVecOut{wjp, wj->nb[1], wj->ne[1], reinterpret_cast<float*>(djp),
                             static_cast<int64_t>(group[j]->nb[1] / sizeof(float))};
      if (const Tensor* b = group[j]->src[2]; b != nullptr) {
        KITE_ASSIGN_OR_RETURN(uint8_t * bp, dev.address(b));
        job.out[j].bias = reinterpret_cast<const float*>(bp);
      }
    }
    if (epilogue != nullptr) {
      KITE_ASSIGN_OR_RETURN(uint8_t * ep, dev.address(epilogue));
      const int64_t ld = static_cast<int64_t>(epilogue->nb[1] / sizeof(float));
      if (epilogue->op == Op::kSwiglu || epilogue->op == Op::kGeglu) {
        job.glu = reinterpret_cast<float*>(ep);
        job.glu_ldd = ld;
        job.gelu = epilogue->op == Op::kGeglu;
      } else {  // kAdd: the residual is the operand that is not this matmul
        const Tensor* res = epilogue->src[epilogue->src[0] == n ? 1 : 0];
        KITE_ASSIGN_OR_RETURN(uint8_t * rp, dev.address(res));
        job.add = reinterpret_cast<const float*>(rp);
        job.add_ld = static_cast<int64_t>(res->nb[1] / sizeof(float));
        job.sum = reinterpret_cast<float*>(ep);
        job.sum_ld = ld;
      }
    }
    if (ex.norm != nullptr) {
      KITE_ASSIGN_OR_RETURN(uint8_t * np, dev.address(ex.norm));
      job.norm = reinterpret_cast<float*>(np);
      job.norm_eps = ex.norm->params.f[0];
      if (const Tensor* nw = ex.norm->src[1]; nw != nullptr) {
        KITE_ASSIGN_OR_RETURN(uint8_t * wp2, dev.address(nw));
        job.norm_w = reinterpret_cast<const float*>(wp2);
      }
      KITE_ASSIGN_OR_RETURN(job.norm_count, zeroed_counters(dev, sc, 1));
    }
    if (ex.rope != nullptr) {
      job.with_rope = true;
      job.rope = *ex.rope;
    }
    // The int8 activations this launch writes (the swiglu's or the norm's): into the pair that
    // does not hold those it reads.
    Int8Activations q, out;
    if (!is_float(w->type)) {
      KITE_ASSIGN_OR_RETURN(q, int8_activations(dev, sc, x, act));
    }
    if (ex.int8_epilogue || ex.norm_int8) {
      KITE_ASSIGN_OR_RETURN(out, int8_scratch(dev, sc, ex.int8_epilogue ? epilogue : ex.norm, q.q == sc.q.ptr.get()));
      if (ex.int8_epilogue) {
        KITE_ASSIGN_OR_RETURN(job.glu_count, zeroed_counters(dev, sc, m / 32));
        job.glu_q = out.q;
        job.glu_ds = out.ds;
      } else {
        job.norm_q = out.q;
        job.norm_ds = out.ds;
      }
    }
    if (is_float(w->type)) {
      KITE_LAUNCH(launch_mmv_float(tid(w->type), job, k, act.x, act.ldx, static_cast<int>(cols), s));
    } else {
      KITE_LAUNCH(launch_mmvq(tid(w->type), job, k, q.q, q.ds, static_cast<int>(cols), s));
    }
    if (out.q != nullptr) sc.int8 = out;
    return ok_status();
  }
  if (group.size() != 1 || epilogue != nullptr || ex.rope != nullptr)
    return make_error("cuda: fused matmuls of ", cols, " columns");
  KITE_TRY(mul_mat_matrix(dev, sc, n, act));
  if (const Tensor* b = n->src[2]; b != nullptr) {  // the bias, broadcast over the columns
    KITE_ASSIGN_OR_RETURN(uint8_t * dp, dev.address(n));
    KITE_ASSIGN_OR_RETURN(uint8_t * bp, dev.address(b));
    KITE_LAUNCH(launch_binary(0, rows_of(n, dp), rows_of(n, dp), rows_of(b, bp), m, cols, s));
  }
  return ok_status();
}

// `fused`: split rows are merged by the attention launch itself where every row is a decode row
// (AttentionArgs::count), not by a second launch. With `int8_out` (an int8 matmul of the output
// follows) the launch also writes the output's int8 activations where it can: decode rows only,
// hd a multiple of 32.
Status attention(Device& dev, OpScratch& sc, Tensor* n, bool fused = false, bool int8_out = false) {
  const Tensor* q = n->src[0];
  const Tensor* kc = n->src[1];
  const Tensor* vc = n->src[2];
  const Tensor* table = n->src[5];
  AttentionArgs a;
  KITE_ASSIGN_OR_RETURN(uint8_t * qp, dev.address(q));
  KITE_ASSIGN_OR_RETURN(a.k, dev.address(kc));
  KITE_ASSIGN_OR_RETURN(a.v, dev.address(vc));
  KITE_ASSIGN_OR_RETURN(uint8_t * pos, dev.address(n->src[3]));
  KITE_ASSIGN_OR_RETURN(uint8_t * seq, dev.address(n->src[4]));
  KITE_ASSIGN_OR_RETURN(uint8_t * tab, dev.address(table));
  KITE_ASSIGN_OR_RETURN(uint8_t * out, dev.address(n));
  a.q = reinterpret_cast<const float*>(qp);
  a.q_nb1 = q->nb[1];
  a.q_nb2 = q->nb[2];
  a.k_nb1 = kc->nb[1];
  a.v_nb1 = vc->nb[1];
  a.k_type = tid(kc->type);
  a.v_type = tid(vc->type);
  a.pos = reinterpret_cast<const int32_t*>(pos);
  a.seq = reinterpret_cast<const int32_t*>(seq);
  a.table = reinterpret_cast<const int32_t*>(tab);
  a.max_blocks = static_cast<int>(table->ne[0]);
  a.block_size = n->params.i[1];
  a.n_kv = n->params.i[0];
  a.hd = static_cast<int>(q->ne[0]);
  a.group = static_cast<int>(q->ne[1] / a.n_kv);
  a.n_tok = static_cast<int>(q->ne[2]);
  a.scale = n->params.f[0];
  a.window = n->params.i[2];
  a.softcap = n->params.f[1];
  a.out = reinterpret_cast<float*>(out);
  a.max_chunks = attention_max_chunks(static_cast<int64_t>(a.max_blocks) * a.block_size);
  const size_t part = attention_partial_floats(a.n_tok, static_cast<int>(q->ne[1]), a.hd, a.max_chunks);
  if (part > 0) {
    KITE_ASSIGN_OR_RETURN(void* p, dev.scratch(sc.part, part * sizeof(float), "attention"));
    a.part = static_cast<float*>(p);
  }
  a.tc_min_run = attention_tc_min_run(a);
  if (fused && a.max_chunks > 1 && a.tc_min_run == 0) {  // split rows merged by the attention launch
    KITE_ASSIGN_OR_RETURN(a.count, zeroed_counters(dev, sc, static_cast<int64_t>(a.n_tok) * a.n_kv));
  }
  if (int8_out && a.tc_min_run == 0 && a.hd % 32 == 0 && n->nb[1] == n->row_bytes()) {
    KITE_ASSIGN_OR_RETURN(const Int8Activations q8, int8_scratch(dev, sc, n));
    a.q8 = q8.q;
    a.q8_ds = q8.ds;
    KITE_LAUNCH(launch_attention(a, dev.stream()));
    sc.int8 = q8;
    return ok_status();
  }
  KITE_LAUNCH(launch_attention(a, dev.stream()));
  return ok_status();
}

// launch_rms_norm's arguments for node n.
Result<NormArgs> norm_args(Device& dev, const Tensor* n) {
  NormArgs p;
  KITE_ASSIGN_OR_RETURN(uint8_t * a, dev.address(n->src[0]));
  KITE_ASSIGN_OR_RETURN(uint8_t * d, dev.address(n));
  p.src = rows_of(n->src[0], a);
  p.dst = rows_of(n, d);
  if (n->src[1] != nullptr) {
    KITE_ASSIGN_OR_RETURN(uint8_t * wp, dev.address(n->src[1]));
    p.w = reinterpret_cast<const float*>(wp);
  }
  p.eps = n->params.f[0];
  p.ne0 = n->src[0]->ne[0];
  p.n_rows = n->src[0]->n_rows();
  return p;
}

Result<RopeArgs> rope_args(Device& dev, Tensor* n) {
  const Tensor* x = n->src[0];
  RopeArgs a;
  KITE_ASSIGN_OR_RETURN(uint8_t * xp, dev.address(x));
  KITE_ASSIGN_OR_RETURN(uint8_t * pp, dev.address(n->src[1]));
  KITE_ASSIGN_OR_RETURN(uint8_t * dp, dev.address(n));
  a.src = rows_of(x, xp);
  a.dst = rows_of(n, dp);
  a.pos = reinterpret_cast<const int32_t*>(pp);
  a.hd = x->ne[0], a.n_head = x->ne[1], a.n_tok = x->ne[2];
  const OpParams& p = n->params;
  a.mode = p.i[0], a.n_rot = p.i[1], a.scaling = p.i[2], a.orig_ctx = p.i[3];
  a.base = p.f[0], a.factor = p.f[1], a.low_freq = p.f[2], a.high_freq = p.f[3];
  a.beta_fast = p.f[4], a.beta_slow = p.f[5], a.attn_factor = p.f[6];
  if (n->src[2] != nullptr) {  // frequency factors replace the llama3 formula (as on the CPU)
    KITE_ASSIGN_OR_RETURN(uint8_t * fp, dev.address(n->src[2]));
    a.freq_factors = reinterpret_cast<const float*>(fp);
    if (a.scaling == 2) a.scaling = 0;
  }
  return a;
}

// One rope node, or two (a layer's queries and keys) in one launch.
Status rope(Device& dev, Tensor* n, Tensor* second = nullptr) {
  KITE_ASSIGN_OR_RETURN(const RopeArgs a, rope_args(dev, n));
  RopeArgs b;
  if (second != nullptr) {
    KITE_ASSIGN_OR_RETURN(b, rope_args(dev, second));
  }
  KITE_LAUNCH(launch_rope(a, dev.stream(), second != nullptr ? &b : nullptr));
  return ok_status();
}

// A kv_write: its rows converted into the cache at their slots.
Result<RowConversion> kv_write_rows(Device& dev, const Tensor* n) {
  const Tensor* cache = n->src[0];
  const Tensor* rows = n->src[1];
  KITE_ASSIGN_OR_RETURN(uint8_t * cp, dev.address(cache));
  KITE_ASSIGN_OR_RETURN(uint8_t * rp, dev.address(rows));
  KITE_ASSIGN_OR_RETURN(uint8_t * sp, dev.address(n->src[2]));
  return RowConversion{kF32, rows_of(rows, rp), tid(cache->type), rows_of(cache, cp),
                       reinterpret_cast<const int32_t*>(sp), rows->ne[0], rows->n_rows()};
}

// One kv_write, or two (a layer's keys and values) in one launch.
// Op::kMulMatId: the activations' int8 columns (shared with the layer's other expert product of
// the same input), then one launch over every (token, slot) pair.
Status mul_mat_id(Device& dev, OpScratch& sc, Tensor* n) {
  const Tensor* w = n->src[0];
  const Tensor* x = n->src[1];
  const Tensor* route = n->src[2];
  KITE_ASSIGN_OR_RETURN(const Activations act, activations(dev, sc, x));
  KITE_ASSIGN_OR_RETURN(const Int8Activations q, int8_activations(dev, sc, x, act));
  MatVecIdArgs a;
  KITE_ASSIGN_OR_RETURN(a.w, dev.address(w));
  a.row_bytes = w->nb[1];
  a.expert_bytes = w->nb[2];
  a.k = w->ne[0];
  a.m = w->ne[1];
  a.n_expert = w->ne[2];
  KITE_ASSIGN_OR_RETURN(uint8_t * r, dev.address(route));
  a.route = reinterpret_cast<const float*>(r);
  a.route_ld = static_cast<int64_t>(route->nb[1] / sizeof(float));
  a.n_used = n->params.i[0];
  a.nx = static_cast<int>(x->ne[1]);
  a.n_tok = x->ne[2];
  a.q = q.q;
  a.ds = q.ds;
  KITE_ASSIGN_OR_RETURN(uint8_t * d, dev.address(n));
  a.dst = reinterpret_cast<float*>(d);
  KITE_LAUNCH(launch_mmvq_id(tid(w->type), a, dev.stream()));
  return ok_status();
}

Status kv_write(Device& dev, const Tensor* n, const Tensor* second = nullptr) {
  KITE_ASSIGN_OR_RETURN(const RowConversion a, kv_write_rows(dev, n));
  RowConversion b;
  if (second != nullptr) {
    KITE_ASSIGN_OR_RETURN(b, kv_write_rows(dev, second));
  }
  KITE_LAUNCH(launch_convert_rows(a, dev.stream(), second != nullptr ? &b : nullptr));
  return ok_status();
}

}  // namespace

bool node_supported(const Tensor& n) {
  switch (n.op) {
    case Op::kNone:
    case Op::kView: return true;
    case Op::kAdd:
    case Op::kMul:
    case Op::kSwiglu:
    case Op::kGeglu:
    case Op::kScale:
    case Op::kRmsNorm:
    case Op::kRope: return n.src[0]->type == DType::F32;
    case Op::kGetRows: return weight_type_ok(n.src[0]->type);
    case Op::kMulMat:
      return weight_type_ok(n.src[0]->type) && n.src[1]->type == DType::F32 &&
             (n.src[2] == nullptr || (n.src[2]->type == DType::F32 && n.src[2]->is_contiguous()));
    case Op::kCopy:
      if (n.type == DType::Q8_0) return is_float(n.src[0]->type) && n.ne[0] % 32 == 0;
      return is_float(n.type) && weight_type_ok(n.src[0]->type);
    case Op::kKvWrite: return kv_type_ok(n.src[0]->type, n.src[0]->ne[0]);
    case Op::kAllReduce: return false;  // (run by the backend itself: cuda_backend.cpp)
    case Op::kTopK:
      return n.src[0]->type == DType::F32 && n.src[0]->nb[0] == sizeof(float) && n.params.i[0] >= 1 &&
             n.params.i[0] <= kMaxTopK;
    case Op::kMulMatId:  // (quantized experts: the int8 kernels)
      return !is_float(n.src[0]->type) && weight_type_ok(n.src[0]->type) && n.src[0]->ne[0] % 32 == 0 &&
             n.src[1]->type == DType::F32 && n.src[2]->type == DType::F32 && n.src[2]->nb[0] == sizeof(float) &&
             n.src[0]->ne[1] < 4 * 65535;  // (its row blocks of 4 along the grid's y)
    case Op::kMoeSum:
      return n.src[0]->type == DType::F32 && n.src[0]->is_contiguous() && n.src[1]->nb[0] == sizeof(float) &&
             n.params.i[0] <= kMaxTopK;
    case Op::kAttention: {
      const int64_t hd = n.src[0]->ne[0];
      const int n_kv = n.params.i[0];
      if (n_kv <= 0 || n.src[0]->ne[1] % n_kv != 0) return false;
      return kv_type_ok(n.src[1]->type, hd) && kv_type_ok(n.src[2]->type, hd) &&
             attention_shape_ok(static_cast<int>(hd), static_cast<int>(n.src[0]->ne[1] / n_kv));
    }
  }
  return false;
}

Status run_node(Device& dev, OpScratch& sc, Tensor* n) {
  const cudaStream_t s = dev.stream();
  switch (n->op) {
    case Op::kNone:
    case Op::kView: return ok_status();
    case Op::kMulMat: return mul_mat(dev, sc, std::span<Tensor* const>(&n, 1));
    case Op::kAttention: return attention(dev, sc, n);
    case Op::kRope: return rope(dev, n);
    case Op::kAdd:
    case Op::kMul:
    case Op::kSwiglu:
    case Op::kGeglu: {
      KITE_ASSIGN_OR_RETURN(uint8_t * a, dev.address(n->src[0]));
      KITE_ASSIGN_OR_RETURN(uint8_t * b, dev.address(n->src[1]));
      KITE_ASSIGN_OR_RETURN(uint8_t * d, dev.address(n));
      const int op = n->op == Op::kAdd ? 0 : n->op == Op::kMul ? 1 : n->op == Op::kSwiglu ? 2 : 3;
      KITE_LAUNCH(launch_binary(op, rows_of(n, d), rows_of(n->src[0], a), rows_of(n->src[1], b), n->ne[0],
                                n->n_rows(), s));
      return ok_status();
    }
    case Op::kScale: {
      KITE_ASSIGN_OR_RETURN(uint8_t * a, dev.address(n->src[0]));
      KITE_ASSIGN_OR_RETURN(uint8_t * d, dev.address(n));
      KITE_LAUNCH(launch_scale(rows_of(n, d), rows_of(n->src[0], a), n->params.f[0], n->params.f[1], n->ne[0],
                               n->n_rows(), s));
      return ok_status();
    }
    case Op::kRmsNorm: {
      KITE_ASSIGN_OR_RETURN(const NormArgs p, norm_args(dev, n));
      KITE_LAUNCH(launch_rms_norm(p.dst, p.src, p.w, p.eps, p.ne0, p.n_rows, s));
      return ok_status();
    }
    case Op::kGetRows: {
      const Tensor* t = n->src[0];
      KITE_ASSIGN_OR_RETURN(uint8_t * tp, dev.address(t));
      KITE_ASSIGN_OR_RETURN(uint8_t * ids, dev.address(n->src[1]));
      KITE_ASSIGN_OR_RETURN(uint8_t * d, dev.address(n));
      KITE_LAUNCH(launch_get_rows(tid(t->type), tp, t->nb[1], reinterpret_cast<const int32_t*>(ids),
                                  reinterpret_cast<float*>(d), n->ne[0], n->ne[1], s));
      return ok_status();
    }
    case Op::kCopy: {
      const Tensor* a = n->src[0];
      KITE_ASSIGN_OR_RETURN(uint8_t * ap, dev.address(a));
      KITE_ASSIGN_OR_RETURN(uint8_t * d, dev.address(n));
      if (n->type == DType::Q8_0) {
        KITE_LAUNCH(launch_convert_rows(tid(a->type), rows_of(a, ap), kQ8_0, rows_of(n, d), nullptr, a->ne[0],
                                        a->n_rows(), s));
      } else {
        KITE_LAUNCH(launch_dequant_rows(tid(a->type), rows_of(a, ap), tid(n->type), rows_of(n, d), a->ne[0],
                                        a->n_rows(), s));
      }
      return ok_status();
    }
    case Op::kKvWrite: return kv_write(dev, n);
    case Op::kMulMatId: return mul_mat_id(dev, sc, n);
    case Op::kMoeSum: {
      KITE_ASSIGN_OR_RETURN(uint8_t * y, dev.address(n->src[0]));
      KITE_ASSIGN_OR_RETURN(uint8_t * r, dev.address(n->src[1]));
      KITE_ASSIGN_OR_RETURN(uint8_t * d, dev.address(n));
      KITE_LAUNCH(launch_moe_sum(reinterpret_cast<float*>(d), reinterpret_cast<const float*>(y), n->ne[0],
                                 n->params.i[0], n->ne[1], reinterpret_cast<const float*>(r),
                                 static_cast<int64_t>(n->src[1]->nb[1] / sizeof(float)), n->params.i[1] != 0,
                                 n->params.f[0], s));
      return ok_status();
    }
    case Op::kTopK: {
      const Tensor* a = n->src[0];
      KITE_ASSIGN_OR_RETURN(uint8_t * ap, dev.address(a));
      KITE_ASSIGN_OR_RETURN(uint8_t * d, dev.address(n));
      Rows draw;
      if (n->src[1] != nullptr) {
        KITE_ASSIGN_OR_RETURN(uint8_t * dp, dev.address(n->src[1]));
        draw = rows_of(n->src[1], dp);
      }
      KITE_LAUNCH(launch_top_k(rows_of(n, d), rows_of(a, ap), draw, a->ne[0], a->n_rows(), n->params.i[0],
                               n->params.i[1] != 0, s));
      return ok_status();
    }
    case Op::kAllReduce: break;
  }
  return make_error("cuda: op ", op_name(n->op), " has no kernel");
}

Fusions fusions_from_env() {
  auto off = [](const char* name) {
    const char* env = std::getenv(name);
    return env != nullptr && std::string_view(env) == "0";
  };
  return Fusions{!off("KITE_CUDA_FUSE"), !off("KITE_CUDA_NORM_TAIL"), !off("KITE_CUDA_ROPE_TAIL")};
}

namespace {

// A matmul on the mat-vec kernels that can share a launch with `first`: same activations, same
// weight type and k.
bool joins_matvec(const Tensor* first, const Tensor* n) {
  return n->op == Op::kMulMat && n->src[1] == first->src[1] && n->src[0]->type == first->src[0]->type &&
         n->src[0]->ne[0] == first->src[0]->ne[0];
}

// swiglu or geglu (gate, up) of two [m, cols] matmul outputs of the group, written like them.
bool is_glu_of(const Tensor* n, const Tensor* a, const Tensor* b) {
  if ((n->op != Op::kSwiglu && n->op != Op::kGeglu) ||
      !((n->src[0] == a && n->src[1] == b) || (n->src[0] == b && n->src[1] == a)))
    return false;
  return n->ne == a->ne && a->ne == b->ne && n->n_rows() == a->ne[1] && uniform_rows(n);
}

// Whether two tensors' bytes overlap (each spans Tensor::nbytes() from its first element).
bool overlaps(const Tensor* a, const Tensor* b) {
  const auto a0 = reinterpret_cast<uintptr_t>(a->data), b0 = reinterpret_cast<uintptr_t>(b->data);
  return a0 < b0 + b->nbytes() && b0 < a0 + a->nbytes();
}

// add(residual, mm) (either order) of a [m, cols] matmul output and a tensor of its shape.
bool is_residual_add_of(const Tensor* n, const Tensor* mm) {
  if (n->op != Op::kAdd || (n->src[0] == mm) == (n->src[1] == mm)) return false;
  const Tensor* res = n->src[n->src[0] == mm ? 1 : 0];
  return n->ne == mm->ne && res->ne == mm->ne && n->n_rows() == mm->ne[1] && uniform_rows(n) && uniform_rows(res);
}

// rms_norm of a residual add's sum into dense rows of 32-element blocks: what the mat-vec
// launch of the add can compute after it (MatVecJob::norm). Its last block reads the sum after
// every other block has read its inputs and written its rows, so the norm may overlap those,
// but not the sum or its weight.
bool is_norm_of_sum(const Tensor* n, const Tensor* add) {
  return n->op == Op::kRmsNorm && n->src[0] == add && n->ne == add->ne && n->ne[0] % 32 == 0 &&
         n->nb[1] == static_cast<size_t>(n->ne[0]) * sizeof(float) && uniform_rows(n) &&
         !overlaps(n, add) && (n->src[1] == nullptr || !overlaps(n, n->src[1]));
}

// Whether the tensors a launch writes overlap neither one another nor what it reads.
bool apart(std::initializer_list<const Tensor*> written, std::initializer_list<const Tensor*> read) {
  for (auto w = written.begin(); w != written.end(); ++w) {
    for (auto w2 = std::next(w); w2 != written.end(); ++w2)
      if (overlaps(*w, *w2)) return false;
    for (const Tensor* r : read)
      if (overlaps(*w, r)) return false;
  }
  return true;
}

// rope(q), rope(k), k' = reshape(rope(k)) to [hd * n_kv, n_tok], kv_write(k'), kv_write(v) with
// float caches or Q8_0 ones: what launch_rope_kv computes.
bool is_rope_kv(std::span<Tensor* const> nodes) {
  const Tensor *q = nodes[0], *k = nodes[1], *view = nodes[2], *kw = nodes[3], *vw = nodes[4];
  if (q->op != Op::kRope || k->op != Op::kRope || view->op != Op::kView || view->src[0] != k ||
      view->view_offset != 0 || kw->op != Op::kKvWrite || kw->src[1] != view || vw->op != Op::kKvWrite ||
      vw->src[2] != kw->src[2])
    return false;
  const DType kt = kw->src[0]->type, vt = vw->src[0]->type;
  if (!(is_float(kt) && is_float(vt)) && !(kt == DType::Q8_0 && vt == DType::Q8_0 && k->type == DType::F32))
    return false;
  if (!k->is_contiguous() || view->ne[0] != k->ne[0] * k->ne[1] || view->n_rows() != k->ne[2]) return false;
  return apart({q, k, kw->src[0], vw->src[0]}, {q->src[0], k->src[0], vw->src[1]});
}

// Two rms_norms of rows of one length in a row (qwen3's q_norm and k_norm): one launch.
bool is_norm_pair(const Tensor* a, const Tensor* b) {
  return a->op == Op::kRmsNorm && b->op == Op::kRmsNorm && a->src[0]->ne[0] == b->src[0]->ne[0] &&
         apart({a, b}, {a->src[0], b->src[0]});
}

// A layer's q, k and v products of one input (nodes[0..2]; q and k one mat-vec launch), the
// reshapes of q and k, qwen3's per-head norms of them or not (`*norms`: 2 or 0 nodes), then
// is_rope_kv's five nodes over them with float caches and one column: what the mat-vec
// launches' rope tails compute (MatVecJob::with_rope). Without the norms the rotary pairs are
// adjacent, or halves of n_rot apart with n_rot and hd multiples of 4 (a block's rows hold whole
// pairs); with them, hd is a multiple of 4 (a block's rows lie in one head) below 1024.
bool is_qkv_rope_kv(std::span<Tensor* const> nodes, size_t* norms) {
  if (nodes.size() < 10 || nodes[0]->src[1]->n_rows() > kMaxRopeTailCols || nodes[2]->op != Op::kMulMat ||
      nodes[2]->src[1] != nodes[0]->src[1])
    return false;
  const size_t nn = nodes[5]->op == Op::kRmsNorm ? 2 : 0;
  if (nodes.size() < 10 + nn) return false;
  const Tensor *vq = nodes[3], *vk = nodes[4], *q = nodes[5 + nn], *k = nodes[6 + nn], *kw = nodes[8 + nn],
               *vw = nodes[9 + nn];
  const Tensor *qs = nn > 0 ? nodes[5] : vq, *ks = nn > 0 ? nodes[6] : vk;  // the ropes' sources
  auto reshape_of = [](const Tensor* view, const Tensor* mm) {
    return view->op == Op::kView && view->src[0] == mm && view->view_offset == 0 && view->is_contiguous() &&
           mm->is_contiguous();
  };
  if (!reshape_of(vq, nodes[0]) || !reshape_of(vk, nodes[1]) || q->src[0] != qs || k->src[0] != ks ||
      !is_rope_kv(nodes.subspan(5 + nn)) || vw->src[1] != nodes[2] || !nodes[2]->is_contiguous())
    return false;
  if (nn > 0 && (!is_norm_pair(qs, ks) || qs->src[0] != vq || ks->src[0] != vk || !qs->is_contiguous() ||
                 !ks->is_contiguous() || q->ne[0] >= 1024))
    return false;
  auto pairs_ok = [nn](const Tensor* rope) {
    const int32_t mode = rope->params.i[0], n_rot = rope->params.i[1];
    const int64_t hd = rope->ne[0];
    return nn > 0 ? hd % 4 == 0 : mode == 0 || (n_rot % 4 == 0 && hd % 4 == 0);
  };
  if (!pairs_ok(q) || !pairs_ok(k) || !is_float(kw->src[0]->type)) return false;
  // The launch writes the norms, the ropes and the caches while it still reads its activations:
  // float weights read the input itself (int8 weights read its int8 activations, in scratch
  // memory), which the planner may have given to them, since the products were its last readers.
  *norms = nn;
  return (!is_float(nodes[0]->src[0]->type) && !is_float(nodes[2]->src[0]->type)) ||
         apart({q, k, kw->src[0], vw->src[0], qs, ks}, {nodes[0]->src[1]});
}

}  // namespace

Result<size_t> run_fused(Device& dev, OpScratch& sc, std::span<Tensor* const> nodes, const Fusions& fuse) {
  Tensor* n = nodes[0];
  if (!fuse.on) {
    sc.int8 = {};  // (no matmul reuses another's int8 activations either)
    KITE_TRY(run_node(dev, sc, n));
    return size_t{1};
  }
  // Attention merges its split rows itself (no merge launch) when they are all decode rows, and
  // when it feeds an int8 matmul (the output projection) also quantizes the rows it writes.
  if (n->op == Op::kAttention) {
    const bool int8_out = nodes.size() > 1 && int8_matmul(dev, nodes[1]) && nodes[1]->src[1] == n;
    KITE_TRY(attention(dev, sc, n, true, int8_out));
    return size_t{1};
  }
  if (nodes.size() < 2) {
    KITE_TRY(run_node(dev, sc, n));
    return size_t{1};
  }
  // A fused launch writes a later node's output while an earlier node's inputs are still being
  // read: the planner keeps a node's output apart from the inputs of the node before it
  // (planner.h), and the overlap checks below hold each fusion to that.
  //
  // qwen3's per-head norms of q and k: one launch.
  if (is_norm_pair(n, nodes[1])) {
    KITE_ASSIGN_OR_RETURN(const NormArgs a, norm_args(dev, n));
    KITE_ASSIGN_OR_RETURN(const NormArgs b, norm_args(dev, nodes[1]));
    KITE_LAUNCH(launch_rms_norm_pair(a, b, dev.stream()));
    return size_t{2};
  }
  // A layer's ropes of q and k, then the cache writes of k (through a reshape of its rope) and
  // of v: one launch.
  if (nodes.size() >= 5 && is_rope_kv(nodes)) {
    KITE_ASSIGN_OR_RETURN(const RopeArgs q, rope_args(dev, n));
    KITE_ASSIGN_OR_RETURN(const RopeArgs k, rope_args(dev, nodes[1]));
    KITE_ASSIGN_OR_RETURN(const RowConversion kc, kv_write_rows(dev, nodes[3]));
    KITE_ASSIGN_OR_RETURN(const RowConversion vc, kv_write_rows(dev, nodes[4]));
    KITE_LAUNCH(launch_rope_kv(q, k, kc, vc, dev.stream()));
    return size_t{5};
  }
  // Two ropes in a row (a layer's queries and keys).
  if (n->op == Op::kRope && nodes[1]->op == Op::kRope && apart({n, nodes[1]}, {n->src[0], nodes[1]->src[0]})) {
    KITE_TRY(rope(dev, n, nodes[1]));
    return size_t{2};
  }
  // Two kv_writes in a row (a layer's keys and values), both to Q8_0 or both to float caches.
  if (n->op == Op::kKvWrite && nodes[1]->op == Op::kKvWrite &&
      (n->src[0]->type == DType::Q8_0) == (nodes[1]->src[0]->type == DType::Q8_0) &&
      apart({n->src[0], nodes[1]->src[0]}, {n->src[1], nodes[1]->src[1]})) {
    KITE_TRY(kv_write(dev, n, nodes[1]));
    return size_t{2};
  }
  // rms_norm feeding an int8 matmul: the norm's launch also quantizes its rows.
  if (n->op == Op::kRmsNorm && int8_matmul(dev, nodes[1]) && nodes[1]->src[1] == n && n->src[0]->type == DType::F32 &&
      n->ne[0] % 32 == 0 && n->nb[1] == static_cast<size_t>(n->ne[0]) * sizeof(float) && uniform_rows(n)) {
    KITE_ASSIGN_OR_RETURN(const NormArgs p, norm_args(dev, n));
    KITE_ASSIGN_OR_RETURN(const Int8Activations q, int8_scratch(dev, sc, n));
    KITE_LAUNCH(launch_rms_norm_quantize(static_cast<float*>(p.dst.p), p.src, p.w, p.eps, p.ne0, p.n_rows, q.q, q.ds,
                                         dev.stream()));
    sc.int8 = q;
    return size_t{1};
  }
  // Matmuls of one input on the mat-vec kernels (a layer's q, k, v; gate and up, with their
  // swiglu; an output projection with its residual add): one launch.
  if (n->op == Op::kMulMat && n->src[1]->n_rows() <= kMaxMmvCols) {
    size_t count = 1;
    while (count < nodes.size() && count < static_cast<size_t>(kMaxMatVecOuts) && joins_matvec(n, nodes[count]))
      ++count;
    if (count == 2 && nodes.size() > 2 && is_glu_of(nodes[2], nodes[0], nodes[1]) &&
        !overlaps(nodes[2], n->src[1]) && n->src[2] == nullptr && nodes[1]->src[2] == nullptr) {
      Tensor* const pair[2] = {nodes[2]->src[0], nodes[2]->src[1]};  // gate, up
      // ... and the down projection's int8 activations, when it is an int8 matmul of the swiglu.
      const bool int8_down = nodes.size() > 3 && !is_float(n->src[0]->type) && n->src[0]->ne[1] % 32 == 0 &&
                             int8_matmul(dev, nodes[3]) && nodes[3]->src[1] == nodes[2];
      KITE_TRY(mul_mat(dev, sc, pair, MatVecExtras{.epilogue = nodes[2], .int8_epilogue = int8_down}));
      return size_t{3};
    }
    // q, k and v with (qwen3) their head norms, their ropes and cache writes (one column): one
    // launch, or where v's weights are of another type (Q4_K_M's Q6_K v) q and k's launch, then
    // v's.
    if (size_t norms = 0; (count == 3 || count == 2) && fuse.rope_tail && is_qkv_rope_kv(nodes, &norms)) {
      const size_t r0 = 5 + norms;  // the ropes
      MatVecRope r;
      KITE_ASSIGN_OR_RETURN(r.q, rope_args(dev, nodes[r0]));
      KITE_ASSIGN_OR_RETURN(r.k, rope_args(dev, nodes[r0 + 1]));
      KITE_ASSIGN_OR_RETURN(r.kc, kv_write_rows(dev, nodes[r0 + 3]));
      KITE_ASSIGN_OR_RETURN(r.vc, kv_write_rows(dev, nodes[r0 + 4]));
      if (norms > 0) {
        r.head_norm = true;
        KITE_ASSIGN_OR_RETURN(r.qn, norm_args(dev, nodes[5]));
        KITE_ASSIGN_OR_RETURN(r.kn, norm_args(dev, nodes[6]));
        KITE_ASSIGN_OR_RETURN(r.head_count, zeroed_counters(dev, sc, r.q.n_head + r.k.n_head));
      }
      KITE_TRY(mul_mat(dev, sc, nodes.first(count), MatVecExtras{.rope = &r}));
      if (count == 2) {
        r.first = MatVecRope::kV;
        KITE_TRY(mul_mat(dev, sc, nodes.subspan(2, 1), MatVecExtras{.rope = &r}));
      }
      return r0 + 5;
    }
    if (count == 1 && is_residual_add_of(nodes[1], n) && !overlaps(nodes[1], n->src[1])) {
      // ... and the sum's rms_norm (the next block's input), for a single column.
      if (fuse.norm_tail && nodes.size() > 2 && n->src[1]->n_rows() <= kMaxNormTailCols &&
          is_norm_of_sum(nodes[2], nodes[1])) {
        const bool int8 = nodes.size() > 3 && int8_matmul(dev, nodes[3]) && nodes[3]->src[1] == nodes[2];
        KITE_TRY(mul_mat(dev, sc, nodes.first(1),
                         MatVecExtras{.epilogue = nodes[1], .norm = nodes[2], .norm_int8 = int8}));
        return size_t{3};
      }
      KITE_TRY(mul_mat(dev, sc, nodes.first(1), MatVecExtras{.epilogue = nodes[1]}));
      return size_t{2};
    }
    KITE_TRY(mul_mat(dev, sc, nodes.first(count)));
    return count;
  }
  KITE_TRY(run_node(dev, sc, n));
  return size_t{1};
}

}  // namespace kite::cuda

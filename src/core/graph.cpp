#include "src/core/graph.h"

#include <algorithm>
#include <cassert>

namespace kite {

Tensor* Graph::make_like(DType type, const std::array<int64_t, kMaxDims>& ne, Op op, std::string name) {
  Tensor& t = arena_.emplace_back();
  t.type = type;
  t.ne = ne;
  t.nb = contiguous_strides(type, ne);
  t.op = op;
  t.name = std::move(name);
  t.layer = layer_;
  return &t;
}

Tensor* Graph::make(DType type, std::initializer_list<int64_t> ne, Op op, std::string name) {
  assert(ne.size() >= 1 && ne.size() <= kMaxDims);
  std::array<int64_t, kMaxDims> shape{1, 1, 1, 1};
  std::copy(ne.begin(), ne.end(), shape.begin());
  return make_like(type, shape, op, std::move(name));
}

Tensor* Graph::input(DType type, std::initializer_list<int64_t> ne, std::string name) {
  return make(type, ne, Op::kNone, std::move(name));
}

Tensor* Graph::external(DType type, std::initializer_list<int64_t> ne, void* data, std::string name) {
  Tensor* t = make(type, ne, Op::kNone, std::move(name));
  t->data = data;
  return t;
}

Tensor* Graph::reshape(Tensor* a, std::initializer_list<int64_t> ne) {
  assert(a->is_contiguous());
  Tensor* t = make(a->type, ne, Op::kView, a->name);
  assert(t->n_elements() == a->n_elements());
  t->src[0] = a;
  return t;
}

Tensor* Graph::rows(Tensor* a, int64_t first, int64_t count) {
  assert(a->is_contiguous() && first >= 0 && first + count <= a->n_rows());
  Tensor* t = make(a->type, {a->ne[0], count}, Op::kView, a->name);
  t->src[0] = a;
  t->view_offset = static_cast<size_t>(first) * a->nb[1];
  return t;
}

Tensor* Graph::get_rows(Tensor* table, Tensor* ids) {
  assert(ids->type == DType::I32);
  Tensor* t = make(DType::F32, {table->ne[0], ids->n_elements()}, Op::kGetRows, "get_rows");
  t->src = {table, ids};
  return t;
}

Tensor* Graph::mul_mat(Tensor* w, Tensor* x, Tensor* bias) {
  assert(w->ne[0] == x->ne[0] && x->type == DType::F32);
  assert(bias == nullptr || (bias->type == DType::F32 && bias->ne[0] == w->ne[1] && bias->n_rows() == 1));
  Tensor* t = make(DType::F32, {w->ne[1], x->n_rows()}, Op::kMulMat, w->name);
  t->src = {w, x, bias};
  return t;
}

Tensor* Graph::add(Tensor* a, Tensor* b) {
  assert(a->ne[0] == b->ne[0] && a->n_rows() % b->n_rows() == 0);
  Tensor* t = make_like(DType::F32, a->ne, Op::kAdd, "add");
  t->src = {a, b};
  return t;
}

Tensor* Graph::mul(Tensor* a, Tensor* b) {
  assert(a->ne[0] == b->ne[0] && a->n_rows() % b->n_rows() == 0);
  Tensor* t = make_like(DType::F32, a->ne, Op::kMul, "mul");
  t->src = {a, b};
  return t;
}

Tensor* Graph::scale(Tensor* a, float s) {
  Tensor* t = make_like(DType::F32, a->ne, Op::kScale, "scale");
  t->src[0] = a;
  t->params.f[0] = s;
  return t;
}

Tensor* Graph::softcap(Tensor* a, float cap) {
  assert(cap > 0.f);
  Tensor* t = make_like(DType::F32, a->ne, Op::kScale, "softcap");
  t->src[0] = a;
  t->params.f[0] = 1.f;
  t->params.f[1] = cap;
  return t;
}

Tensor* Graph::rms_norm(Tensor* a, Tensor* weight, float eps) {
  assert(weight == nullptr || weight->ne[0] == a->ne[0]);
  Tensor* t = make_like(DType::F32, a->ne, Op::kRmsNorm, "rms_norm");
  t->src = {a, weight};
  t->params.f[0] = eps;
  return t;
}

Tensor* Graph::rope(Tensor* a, Tensor* positions, const RopeParams& p, Tensor* freq_factors) {
  assert(freq_factors == nullptr || (freq_factors->type == DType::F32 && freq_factors->ne[0] * 2 >= p.n_rot));
  assert(positions->type == DType::I32 && positions->n_elements() == a->ne[2]);
  assert(p.n_rot % 2 == 0 && p.n_rot <= a->ne[0]);
  Tensor* t = make_like(DType::F32, a->ne, Op::kRope, "rope");
  t->src = {a, positions, freq_factors};
  t->params.i = {static_cast<int32_t>(p.mode), p.n_rot, static_cast<int32_t>(p.scaling), p.original_ctx};
  t->params.f = {p.freq_base, p.factor, p.low_freq_factor, p.high_freq_factor, p.beta_fast, p.beta_slow,
                 p.attn_factor};
  return t;
}

Tensor* Graph::swiglu(Tensor* gate, Tensor* up) {
  assert(gate->ne == up->ne);
  Tensor* t = make_like(DType::F32, gate->ne, Op::kSwiglu, "swiglu");
  t->src = {gate, up};
  return t;
}

Tensor* Graph::geglu(Tensor* gate, Tensor* up) {
  assert(gate->ne == up->ne);
  Tensor* t = make_like(DType::F32, gate->ne, Op::kGeglu, "geglu");
  t->src = {gate, up};
  return t;
}

Tensor* Graph::kv_write(Tensor* cache, Tensor* rows, Tensor* slots) {
  assert(rows->ne[0] == cache->ne[0] && slots->n_elements() == rows->n_rows());
  Tensor* t = make_like(cache->type, cache->ne, Op::kKvWrite, cache->name);
  t->src = {cache, rows, slots};
  return t;
}

Tensor* Graph::attention(Tensor* q, Tensor* k_cache, Tensor* v_cache, Tensor* positions, Tensor* token_seq,
                         Tensor* block_table, const AttentionParams& p) {
  assert(q->ne[1] % p.n_kv_head == 0 && k_cache->ne[0] == q->ne[0] * p.n_kv_head);
  Tensor* t = make(DType::F32, {q->ne[0] * q->ne[1], q->ne[2]}, Op::kAttention, "attention");
  t->src = {q, k_cache, v_cache, positions, token_seq, block_table};
  t->params.i[0] = p.n_kv_head;
  t->params.i[1] = p.block_size;
  t->params.i[2] = p.window;
  t->params.f[0] = p.scale;
  t->params.f[1] = p.softcap;
  return t;
}

Tensor* Graph::copy(Tensor* a, DType type) {
  Tensor* t = make_like(type, a->ne, Op::kCopy, "copy");
  t->src[0] = a;
  return t;
}

Tensor* Graph::all_reduce(Tensor* a) {
  Tensor* t = make_like(DType::F32, a->ne, Op::kAllReduce, "all_reduce");
  t->src[0] = a;
  return t;
}

Tensor* Graph::top_k(Tensor* a, int32_t k, bool log_sum_exp, Tensor* draw) {
  assert(a->type == DType::F32 && k >= 1 && k <= kMaxTopK && a->ne[0] < (int64_t{1} << 24));
  assert(draw == nullptr || (draw->type == DType::I32 && draw->ne[0] == 4 && draw->n_rows() == a->n_rows()));
  Tensor* t = make(DType::F32, {2 * int64_t{k} + 1 + (draw ? 2 : 0), a->n_rows()}, Op::kTopK, "top_k");
  t->src[0] = a;
  t->src[1] = draw;
  t->params.i[0] = k;
  t->params.i[1] = log_sum_exp ? 1 : 0;
  return t;
}

Tensor* Graph::mul_mat_id(Tensor* w, Tensor* x, Tensor* route, int32_t n_used) {
  assert(w->ne[0] == x->ne[0] && w->ne[3] == 1 && x->type == DType::F32 && n_used >= 1 && n_used <= kMaxTopK);
  assert((x->ne[1] == 1 || x->ne[1] == n_used) && x->ne[3] == 1);
  assert(route->type == DType::F32 && route->ne[0] >= 2 * n_used + 1 && route->n_rows() == x->ne[2]);
  Tensor* t = make(DType::F32, {w->ne[1], n_used, x->ne[2]}, Op::kMulMatId, w->name);
  t->src = {w, x, route};
  t->params.i[0] = n_used;
  return t;
}

Tensor* Graph::moe_sum(Tensor* y, Tensor* route, int32_t n_used, bool norm, float scale) {
  assert(y->type == DType::F32 && y->ne[1] == n_used && y->ne[3] == 1);
  assert(route->type == DType::F32 && route->ne[0] >= 2 * n_used + 1 && route->n_rows() == y->ne[2]);
  Tensor* t = make(DType::F32, {y->ne[0], y->ne[2]}, Op::kMoeSum, "moe_sum");
  t->src = {y, route};
  t->params.i[0] = n_used;
  t->params.i[1] = norm ? 1 : 0;
  t->params.f[0] = scale;
  return t;
}

void Graph::visit(Tensor* t) {
  if (!visited_.insert(t).second) return;
  for (Tensor* s : t->src)
    if (s != nullptr) visit(s);
}

void Graph::build(Tensor* out) {
  visit(out);
  outputs_.push_back(out);
  // Creation order is a topological order (a tensor's sources exist before it), and the one the
  // model was written in: a layer's q, k and v products stand side by side, so a backend can run
  // neighbours that share an input as one launch (the CUDA backend's fusions).
  nodes_.clear();
  leaves_.clear();
  for (Tensor& t : arena_)
    if (visited_.count(&t) != 0) (t.op == Op::kNone ? leaves_ : nodes_).push_back(&t);
}

}  // namespace kite

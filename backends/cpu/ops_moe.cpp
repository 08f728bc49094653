// kite/backends/cpu/ops_moe.cpp — mixture of experts: the chosen experts' products
// (Op::kMulMatId) and their sum with the router's weights (Op::kMoeSum).
//
// mul_mat_id groups the (token, slot) pairs by expert, so each expert's matrix is multiplied
// once, by all its columns together, through op_mul_mat (every SIMD path and weight type of a
// plain mul_mat; a decode step: one column an expert, the one-row kernels): thread 0 sorts the
// pairs (a counting sort by expert, in the shared scratch), the threads gather the columns,
// run the experts one after another, then scatter the products back to (slot, token) order.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "backends/cpu/ops.h"

namespace kite::cpu {
namespace {

// The chosen expert of slot j of route row t, or -1 for none (top_k's padding, or out of range).
int32_t route_id(const Tensor* route, int64_t t, int32_t n_used, int32_t j, int64_t n_expert) {
  const float f = reinterpret_cast<const float*>(route->row_ptr(t))[n_used + j];
  return f >= 0.f && f < static_cast<float>(n_expert) ? static_cast<int32_t>(f) : -1;
}

size_t round_up(size_t b) { return (b + 63) / 64 * 64; }

// Byte offsets into the shared scratch of a mul_mat_id: per expert the start of its pairs in
// expert order (n_expert + 1 entries); each pair's position in that order (-1: no expert);
// the pairs in that order; the gathered columns; the products; then what op_mul_mat needs.
struct IdLayout {
  int64_t n_expert = 0, n_pairs = 0;
  size_t start = 0, pos = 0, order = 0, x = 0, y = 0, inner = 0;
};

IdLayout id_layout(const Tensor* dst) {
  const Tensor* w = dst->src[0];
  IdLayout l;
  l.n_expert = w->ne[2];
  l.n_pairs = dst->ne[1] * dst->ne[2];
  const auto pairs = static_cast<size_t>(l.n_pairs);
  l.pos = round_up(static_cast<size_t>(l.n_expert + 1) * sizeof(int64_t));
  l.order = l.pos + round_up(pairs * sizeof(int32_t));
  l.x = l.order + round_up(pairs * sizeof(int32_t));
  l.y = l.x + round_up(pairs * static_cast<size_t>(w->ne[0]) * sizeof(float));
  l.inner = l.y + round_up(pairs * static_cast<size_t>(w->ne[1]) * sizeof(float));
  return l;
}

// A plain mul_mat node over expert e's matrix: `x` [k, n] -> `y` [m, n] (the three tensors are
// the caller's, filled in here).
void expert_mul_mat(const Tensor* w, int64_t e, float* x, float* y, int64_t n, Tensor* we, Tensor* xe, Tensor* ye) {
  we->type = w->type;
  we->ne = {w->ne[0], w->ne[1], 1, 1};
  we->nb = {w->nb[0], w->nb[1], w->nb[2], w->nb[2]};
  we->data = static_cast<uint8_t*>(w->data) + static_cast<size_t>(e) * w->nb[2];
  xe->type = DType::F32;
  xe->ne = {w->ne[0], n, 1, 1};
  xe->nb = contiguous_strides(DType::F32, xe->ne);
  xe->data = x;
  ye->type = DType::F32;
  ye->op = Op::kMulMat;
  ye->ne = {w->ne[1], n, 1, 1};
  ye->nb = contiguous_strides(DType::F32, ye->ne);
  ye->src = {we, xe};
  ye->data = y;
}

}  // namespace

size_t mul_mat_id_shared_bytes(const Tensor* dst) {
  const IdLayout l = id_layout(dst);
  // op_mul_mat's scratch grows with its columns: an expert has at most all the pairs.
  Tensor we, xe, ye;
  expert_mul_mat(dst->src[0], 0, nullptr, nullptr, l.n_pairs, &we, &xe, &ye);
  return l.inner + op_shared_bytes(&ye);
}

void op_mul_mat_id(Tensor* dst, const KernelCtx& c) {
  const Tensor* w = dst->src[0];
  const Tensor* x = dst->src[1];
  const Tensor* route = dst->src[2];
  const int32_t n_used = dst->params.i[0];
  const IdLayout l = id_layout(dst);
  const int64_t k = w->ne[0], m = w->ne[1];
  uint8_t* sh = c.shared->data();
  auto* start = reinterpret_cast<int64_t*>(sh);
  auto* pos = reinterpret_cast<int32_t*>(sh + l.pos);
  auto* order = reinterpret_cast<int32_t*>(sh + l.order);
  auto* xs = reinterpret_cast<float*>(sh + l.x);
  auto* ys = reinterpret_cast<float*>(sh + l.y);

  if (c.ith == 0) {  // counting sort of the pairs by expert (pair p = t * n_used + j)
    std::fill(start, start + l.n_expert + 1, 0);
    for (int64_t p = 0; p < l.n_pairs; ++p) {
      const int32_t e = route_id(route, p / n_used, n_used, static_cast<int32_t>(p % n_used), l.n_expert);
      if (e >= 0) ++start[e + 1];
    }
    for (int64_t e = 0; e < l.n_expert; ++e) start[e + 1] += start[e];
    // Each pair at its expert's next place (start[e] runs up to the next expert's start), then
    // the starts shifted back.
    for (int64_t p = 0; p < l.n_pairs; ++p) {
      const int32_t e = route_id(route, p / n_used, n_used, static_cast<int32_t>(p % n_used), l.n_expert);
      if (e < 0) {
        pos[p] = -1;
        continue;
      }
      const auto at = static_cast<int32_t>(start[e]++);
      pos[p] = at;
      order[at] = static_cast<int32_t>(p);
    }
    for (int64_t e = l.n_expert; e > 0; --e) start[e] = start[e - 1];
    start[0] = 0;
  }
  c.barrier->wait();
  const int64_t n_routed = start[l.n_expert];
  int64_t begin, end;
  split(n_routed, c, &begin, &end);
  for (int64_t at = begin; at < end; ++at) {  // gather: each routed pair's column
    const int64_t p = order[at], t = p / n_used, j = p % n_used;
    std::memcpy(xs + at * k, x->row_ptr(x->ne[1] == 1 ? 0 : j, t), static_cast<size_t>(k) * sizeof(float));
  }
  KernelCtx inner = c;
  inner.one_row = OneRowWay::kRows;
  inner.shared_offset = l.inner;
  Tensor we, xe, ye;
  for (int64_t e = 0; e < l.n_expert; ++e) {
    const int64_t n = start[e + 1] - start[e];
    if (n == 0) continue;
    c.barrier->wait();  // (the columns gathered; every thread done with the counter)
    if (c.ith == 0) c.counter->store(0, std::memory_order_relaxed);
    c.barrier->wait();
    expert_mul_mat(w, e, xs + start[e] * k, ys + start[e] * m, n, &we, &xe, &ye);
    op_mul_mat(&ye, inner);
  }
  c.barrier->wait();
  split(l.n_pairs, c, &begin, &end);
  for (int64_t p = begin; p < end; ++p) {  // scatter back to (slot, token) order
    auto* out = reinterpret_cast<float*>(dst->row_ptr(p % n_used, p / n_used));
    if (pos[p] < 0) std::fill(out, out + m, 0.f);
    else std::memcpy(out, ys + static_cast<int64_t>(pos[p]) * m, static_cast<size_t>(m) * sizeof(float));
  }
}

void op_moe_sum(Tensor* dst, const KernelCtx& c) {
  const Tensor* y = dst->src[0];
  const Tensor* route = dst->src[1];
  const int32_t n_used = dst->params.i[0];
  const bool norm = dst->params.i[1] != 0;
  const float scale = dst->params.f[0];
  const int64_t m = dst->ne[0];
  int64_t begin, end;
  split(dst->ne[1], c, &begin, &end);
  std::vector<float>& wts = *c.scratch;
  if (wts.size() < static_cast<size_t>(n_used)) wts.resize(static_cast<size_t>(n_used));
  for (int64_t t = begin; t < end; ++t) {
    const auto* r = reinterpret_cast<const float*>(route->row_ptr(t));
    const float lse = r[2 * n_used];
    float sum = 0.f;
    for (int32_t j = 0; j < n_used; ++j) {  // (padding: value -inf, weight 0)
      wts[static_cast<size_t>(j)] = r[n_used + j] >= 0.f ? std::exp(r[j] - lse) : 0.f;
      sum += wts[static_cast<size_t>(j)];
    }
    const float mul = (norm ? 1.f / std::max(sum, 6.103515625e-5f) : 1.f) * (scale != 0.f ? scale : 1.f);
    auto* out = reinterpret_cast<float*>(dst->row_ptr(t));
    std::fill(out, out + m, 0.f);
    for (int32_t j = 0; j < n_used; ++j) {
      const float wj = wts[static_cast<size_t>(j)] * mul;
      if (wj == 0.f) continue;
      const auto* yj = reinterpret_cast<const float*>(y->row_ptr(j, t));
      for (int64_t i = 0; i < m; ++i) out[i] += wj * yj[i];
    }
  }
}

}  // namespace kite::cpu

// top_k: each row's k largest entries (and optionally its log-sum-exp), the candidates the host
// samples from instead of a whole row of logits (Graph::top_k has the contract).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backends/cpu/ops.h"
#include "src/base/fast_exp.h"
#include "src/core/graph.h"

namespace kite::cpu {
namespace {

// (value, index) ordered best first: the larger value, then the lower index.
struct Entry {
  float v;
  int32_t i;
};
inline bool better(const Entry& a, const Entry& b) { return a.v > b.v || (a.v == b.v && a.i < b.i); }

// Passes over the row in blocks of kLanes, branch-free inside a block so they vectorize: most
// blocks hold nothing above the worst kept entry and cost one vector compare.
constexpr int64_t kLanes = 16;

bool any_above(const float* x, float t) {
  int any = 0;
  for (int64_t j = 0; j < kLanes; ++j) any |= x[j] > t ? 1 : 0;
  return any != 0;
}

// The largest entry that is not NaN (-inf when there is none), kLanes accumulators wide.
float max_of(const float* x, int64_t n) {
  float acc[kLanes];
  std::fill(std::begin(acc), std::end(acc), -std::numeric_limits<float>::infinity());
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int64_t j = 0; j < kLanes; ++j) acc[j] = x[i + j] > acc[j] ? x[i + j] : acc[j];
  float m = -std::numeric_limits<float>::infinity();
  for (float a : acc) m = a > m ? a : m;
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

// k = 1 (greedy steps): the maximum of each block of 512, keeping the first block that reaches
// the row's, then the first index of it there — one vectorized pass.
void best_one(const float* x, int64_t n, std::vector<Entry>& out) {
  constexpr int64_t kBlock = 512;
  float m = -std::numeric_limits<float>::infinity();
  int64_t first = 0;
  for (int64_t b = 0; b < n; b += kBlock) {
    const float bm = max_of(x + b, std::min(kBlock, n - b));
    if (bm > m) m = bm, first = b;
  }
  if (!(m > -std::numeric_limits<float>::infinity())) return;
  const int64_t i = std::find(x + first, x + std::min(n, first + kBlock), m) - x;
  out.push_back({x[i], static_cast<int32_t>(i)});  // (x[i], not m: -0 and +0 compare equal)
}

// sum(exp(x - m)) over the entries that are not NaN (-inf adds nothing), as the host sampler's
// log-sum-exp sums them.
double sum_exp(const float* x, int64_t n, float m) {
  float buf[kLanes];
  double z = 0.0;
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int64_t j = 0; j < kLanes; ++j) buf[j] = exp_masked(x[i + j], m, 1.f);
    for (int64_t w = kLanes / 2; w > 0; w /= 2)
      for (int64_t j = 0; j < w; ++j) buf[j] += buf[j + w];
    z += buf[0];
  }
  for (; i < n; ++i) z += exp_masked(x[i], m, 1.f);
  return z;
}

// Graph::top_k's draw: the token at temperature t with uniform u, exactly as Sampler's chain
// draws with every filter off (the same float weights, summed in double in index order).
int32_t draw_token(const float* x, int64_t n, float m, float t, double u, std::vector<float>& w) {
  if (!(t > 0.f) || !(m > -std::numeric_limits<float>::infinity())) return -1;
  const float inv_t = 1.f / t;
  w.resize(static_cast<size_t>(n));  // the weights, 0 for what is not allowed
  for (int64_t i = 0; i < n; ++i) w[static_cast<size_t>(i)] = exp_masked(x[i], m, inv_t);
  double total = 0.0;
  int64_t last = -1;
  for (int64_t i = 0; i < n; ++i) {
    total += w[static_cast<size_t>(i)];
    last = x[i] > -std::numeric_limits<float>::infinity() ? i : last;
  }
  const double target = u * total;
  double acc = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    if (!(x[i] > -std::numeric_limits<float>::infinity())) continue;
    acc += w[static_cast<size_t>(i)];
    if (target < acc) return static_cast<int32_t>(i);
  }
  return static_cast<int32_t>(last);  // (rounding: u landed at the very end)
}

}  // namespace

void op_top_k(Tensor* dst, const KernelCtx& c) {
  const Tensor* a = dst->src[0];
  const int32_t k = dst->params.i[0];
  const bool lse = dst->params.i[1] != 0;
  const int64_t n = a->ne[0];
  int64_t begin, end;
  split(a->n_rows(), c, &begin, &end);
  std::vector<Entry> heap;
  heap.reserve(static_cast<size_t>(k));
  // A heap of the best k so far with the worst kept on top. Scanning indices upwards, an entry
  // equal to the worst kept value is never better (its index is higher), so x <= worst rejects
  // it (and NaN, and -inf while the heap fills).
  auto worse_first = [](const Entry& x, const Entry& y) { return better(x, y); };
  for (int64_t r = begin; r < end; ++r) {
    const int64_t i1 = r % a->ne[1], i2 = (r / a->ne[1]) % a->ne[2], i3 = r / (a->ne[1] * a->ne[2]);
    const auto* x = reinterpret_cast<const float*>(a->row_ptr(i1, i2, i3));
    heap.clear();
    float worst = -std::numeric_limits<float>::infinity();
    auto consider = [&](int64_t i) {
      const float v = x[i];
      if (!(v > worst)) return;
      const Entry e{v, static_cast<int32_t>(i)};
      if (heap.size() < static_cast<size_t>(k)) {
        heap.push_back(e);
        std::push_heap(heap.begin(), heap.end(), worse_first);
        if (heap.size() < static_cast<size_t>(k)) return;
      } else {
        std::pop_heap(heap.begin(), heap.end(), worse_first);
        heap.back() = e;
        std::push_heap(heap.begin(), heap.end(), worse_first);
      }
      worst = heap.front().v;
    };
    if (k == 1) {
      best_one(x, n, heap);
    } else {
      int64_t i = 0;
      for (; i + kLanes <= n; i += kLanes)
        if (any_above(x + i, worst))
          for (int64_t j = 0; j < kLanes; ++j) consider(i + j);
      for (; i < n; ++i) consider(i);
      std::sort(heap.begin(), heap.end(), better);
    }
    auto* out = reinterpret_cast<float*>(dst->row_ptr(r));
    for (int32_t j = 0; j < k; ++j) {
      const bool have = j < static_cast<int32_t>(heap.size());
      out[j] = have ? heap[static_cast<size_t>(j)].v : -std::numeric_limits<float>::infinity();
      out[k + j] = have ? static_cast<float>(heap[static_cast<size_t>(j)].i) : -1.f;
    }
    float z = 0.f;
    if (lse) {  // max + log(sum(exp(x - max)))
      const float m = heap.empty() ? -std::numeric_limits<float>::infinity() : heap.front().v;
      z = std::isinf(m) ? m : static_cast<float>(m + std::log(sum_exp(x, n, m)));
    }
    out[2 * k] = z;
    if (const Tensor* d = dst->src[1]) {
      float t;
      double u;
      unpack_draw(reinterpret_cast<const int32_t*>(d->row_ptr(r)), &t, &u);
      const float m = heap.empty() ? -std::numeric_limits<float>::infinity() : heap.front().v;
      const int32_t drawn = draw_token(x, n, m, t, u, *c.scratch);
      out[2 * k + 1] = static_cast<float>(drawn);
      out[2 * k + 2] = drawn >= 0 ? x[drawn] : -std::numeric_limits<float>::infinity();
    }
  }
}

}  // namespace kite::cpu

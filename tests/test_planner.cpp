// The memory planner (src/core/planner.h): where a graph's activations live in the arena.
#include <doctest/doctest.h>

#include <unordered_map>
#include <vector>

#include "src/core/graph.h"
#include "src/core/planner.h"

using namespace kite;

namespace {

struct Bytes {
  uintptr_t lo, hi;
  bool overlaps(const Bytes& o) const { return lo < o.hi && o.lo < hi; }
};

Bytes bytes_of(const Tensor* t) {
  const auto lo = reinterpret_cast<uintptr_t>(t->data);
  return {lo, lo + t->nbytes()};
}

const Tensor* root_of(const Tensor* t) {
  while (aliases_src0(t->op)) t = t->src[0];
  return t;
}

}  // namespace

TEST_CASE("planner: live bytes are never reused, and no node's output touches the node before it") {
  // Three llama-shaped layers (norm, q/k/v, residual adds, gate/up/swiglu) over 3 tokens: the
  // patterns the CUDA backend fuses with their neighbours.
  Graph g;
  const int64_t d = 64, ff = 96, n = 3;
  std::vector<float> wd(static_cast<size_t>(d * ff), 0.f);
  auto weight = [&](int64_t k, int64_t m) { return g.external(DType::F32, {k, m}, wd.data(), "w"); };
  Tensor* x = g.input(DType::F32, {d, n}, "x");
  for (int layer = 0; layer < 3; ++layer) {
    Tensor* h = g.rms_norm(x, weight(d, 1), 1e-5f);
    Tensor* q = g.mul_mat(weight(d, d), h);
    Tensor* k = g.mul_mat(weight(d, d), h);
    Tensor* v = g.mul_mat(weight(d, d), h);
    x = g.add(x, g.mul_mat(weight(d, d), g.add(g.mul(q, k), v)));
    h = g.rms_norm(x, weight(d, 1), 1e-5f);
    Tensor* f = g.swiglu(g.mul_mat(weight(d, ff), h), g.mul_mat(weight(d, ff), h));
    x = g.add(x, g.mul_mat(weight(ff, d), f));
  }
  g.build(x);
  const std::vector<Tensor*>& nodes = g.nodes();
  // Creation order: q, k and v's products stand side by side.
  for (size_t i = 0; i + 2 < nodes.size(); ++i)
    if (nodes[i]->op == Op::kRmsNorm && nodes[i + 1]->op == Op::kMulMat) {
      CHECK(nodes[i + 2]->op == Op::kMulMat);
      CHECK(nodes[i + 2]->src[1] == nodes[i]);
    }

  const MemoryPlan plan = MemoryPlan::make(g);
  plan.place(reinterpret_cast<uint8_t*>(uintptr_t{1} << 20));  // (addresses only: nothing is written)
  std::unordered_map<const Tensor*, size_t> last_read;
  for (size_t i = 0; i < nodes.size(); ++i)
    for (const Tensor* s : nodes[i]->src)
      if (s != nullptr) last_read[root_of(s)] = i;
  last_read[x] = nodes.size();  // the output
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Bytes out = bytes_of(nodes[i]);
    CAPTURE(i);
    // Every earlier result still to be read (or the output, or an input) keeps its bytes.
    for (size_t j = 0; j < i; ++j) {
      const auto r = last_read.find(nodes[j]);
      if (r != last_read.end() && r->second >= i) CHECK_FALSE(out.overlaps(bytes_of(nodes[j])));
    }
    CHECK_FALSE(out.overlaps(bytes_of(g.leaves()[0])));
    // The node before: neither its inputs nor its output share bytes with this output.
    if (i == 0) continue;
    CHECK_FALSE(out.overlaps(bytes_of(nodes[i - 1])));
    for (const Tensor* s : nodes[i - 1]->src)
      if (s != nullptr) CHECK_FALSE(out.overlaps(bytes_of(s)));
  }
  // Bytes are still reused: the arena holds less than every activation side by side.
  size_t all = 0;
  for (const Tensor* t : nodes) all += t->nbytes();
  CHECK(plan.arena_bytes() < all / 2);
}

#include "src/core/split.h"

#include <string>
#include <unordered_set>

namespace kite {
namespace {

// The index of the backend that owns `buf` (-1: none of them).
int owner_of(Buffer* buf, std::span<Backend* const> backends) {
  for (size_t i = 0; i < backends.size(); ++i)
    if (&buf->backend() == backends[i]) return static_cast<int>(i);
  return -1;
}

std::unique_ptr<Tensor> contiguous_like(const Tensor& t, std::string name) {
  auto c = std::make_unique<Tensor>();
  c->type = t.type;
  c->ne = t.ne;
  c->nb = contiguous_strides(t.type, t.ne);
  c->layer = t.layer;
  c->name = std::move(name);
  return c;
}

}  // namespace

Result<SplitGraph> SplitGraph::make(Graph& g, std::span<Backend* const> backends,
                                    const std::function<int(int32_t layer)>& placement, int fallback,
                                    const std::function<bool(const Tensor&)>& to_fallback, size_t alignment) {
  SplitGraph sg;
  const int n_b = static_cast<int>(backends.size());
  if (n_b == 0) return make_error("graph split: no backends");

  // 1. Every node's backend; runs of one backend become splits.
  std::unordered_set<const Tensor*> moved;  // nodes sent to the fallback backend
  for (Tensor* n : g.nodes()) {
    int b = -1;
    Tensor* s = n->src[0];
    if (aliases_src0(n->op) && s != nullptr && s->op != Op::kNone) {
      b = sg.node_backend_.at(s);  // a view runs where its source's bytes are
      if (moved.count(s) != 0) moved.insert(n);
    } else if (aliases_src0(n->op) && s != nullptr && s->buffer != nullptr) {
      b = owner_of(s->buffer, backends);  // kv_write: where the cache is
      if (b < 0) return make_error("graph split: '", s->name, "' is in a buffer of none of the context's backends");
    } else {
      b = placement(n->layer);
      if (b < 0 || b >= n_b)
        return make_error("graph split: layer ", n->layer, " is placed on backend ", b, ", but there are ", n_b);
      if (fallback >= 0 && fallback < n_b && b != fallback) {
        bool computed = false, all_moved = true;  // (the nodes n reads: all moved to the fallback?)
        for (const Tensor* s2 : n->src)
          if (s2 != nullptr && s2->op != Op::kNone) {
            computed = true;
            all_moved = all_moved && moved.count(s2) != 0;
          }
        if (!backends[static_cast<size_t>(b)]->supports(*n) || (to_fallback && to_fallback(*n)) ||
            (computed && all_moved)) {
          b = fallback;
          moved.insert(n);
        }
      }
    }
    sg.node_backend_[n] = b;
    if (sg.splits_.empty() || sg.splits_.back().backend != b) sg.splits_.push_back(GraphSplit{b, {}, {}});
    sg.splits_.back().nodes.push_back(n);
  }

  // 2. Rewire sources that live elsewhere: inputs to per-backend replicas, nodes of another
  //    backend to a copy made before the first split that reads them.
  std::vector<std::vector<Tensor*>> nodes(static_cast<size_t>(n_b)), leaves(nodes.size()), keep(nodes.size());
  std::unordered_map<const Tensor*, std::vector<std::pair<int, Tensor*>>> copies;  // src -> (backend, dst)
  auto find = [](std::vector<std::pair<int, Tensor*>>& v, int b) -> Tensor* {
    for (auto& [vb, t] : v)
      if (vb == b) return t;
    return nullptr;
  };
  for (GraphSplit& split : sg.splits_) {
    const int b = split.backend;
    std::string at = "@";  // (appended, not concatenated: g++ 12 -O3 warns falsely (-Wrestrict) on operator+)
    at.append(backends[static_cast<size_t>(b)]->name()).append(std::to_string(b));
    for (Tensor* n : split.nodes) {
      nodes[static_cast<size_t>(b)].push_back(n);
      for (Tensor*& s : n->src) {
        if (s == nullptr) continue;
        if (s->op == Op::kNone && s->buffer != nullptr) {  // the KV cache: read where it lives
          const int owner = owner_of(s->buffer, backends);
          if (owner != b)
            return make_error("graph split: '", s->name, "' lives on backend ", owner, " but '", n->name,
                              "' reads it on backend ", b, " (a layer's KV must be on the layer's backend)");
          continue;
        }
        if (s->op == Op::kNone && s->data != nullptr) continue;  // a weight in host memory
        if (s->op == Op::kNone) {                                // a step input: one replica per reader
          auto& reps = sg.replicas_[s];
          Tensor* r = find(reps, b);
          if (r == nullptr) {
            if (reps.empty()) {
              r = s;
            } else {
              r = sg.owned_.emplace_back(contiguous_like(*s, s->name + at)).get();
            }
            reps.emplace_back(b, r);
            leaves[static_cast<size_t>(b)].push_back(r);
          }
          s = r;
          continue;
        }
        const int sb = sg.node_backend_.at(s);
        if (sb == b) continue;
        if (s->op == Op::kKvWrite || !s->is_contiguous())
          return make_error("graph split: '", n->name, "' on backend ", b, " reads '", s->name, "' of backend ", sb,
                            ", which cannot be copied (a cache or a strided view)");
        auto& dsts = copies[s];
        Tensor* d = find(dsts, b);
        if (d == nullptr) {
          d = sg.owned_.emplace_back(contiguous_like(*s, s->name + at)).get();
          dsts.emplace_back(b, d);
          split.copies.push_back(SplitCopy{s, d, sb});
          leaves[static_cast<size_t>(b)].push_back(d);
          keep[static_cast<size_t>(sb)].push_back(s);
        }
        s = d;
      }
    }
  }
  for (Tensor* out : g.outputs()) {
    auto it = sg.node_backend_.find(out);
    if (it != sg.node_backend_.end()) keep[static_cast<size_t>(it->second)].push_back(out);
  }

  // 3. One memory plan per backend over its nodes in execution order.
  for (size_t b = 0; b < nodes.size(); ++b)
    sg.plans_.push_back(MemoryPlan::make(nodes[b], leaves[b], keep[b], alignment));
  return sg;
}

int SplitGraph::n_copies() const {
  int n = 0;
  for (const GraphSplit& s : splits_) n += static_cast<int>(s.copies.size());
  return n;
}

int SplitGraph::backend_of(const Tensor* node) const {
  auto it = node_backend_.find(node);
  return it == node_backend_.end() ? -1 : it->second;
}

std::span<const std::pair<int, Tensor*>> SplitGraph::replicas(const Tensor* input) const {
  auto it = replicas_.find(input);
  if (it == replicas_.end()) return {};
  return it->second;
}

Status SplitGraph::compute(std::span<Backend* const> backends, std::vector<uint8_t>& staging, SplitStats* stats,
                           const std::function<Status(Tensor& node, Backend& backend)>& each_node) const {
  for (const GraphSplit& split : splits_) {
    Backend& be = *backends[static_cast<size_t>(split.backend)];
    for (const SplitCopy& c : split.copies) {
      Backend& from = *backends[static_cast<size_t>(c.src_backend)];
      KITE_TRY(from.synchronize());  // compute() may still be running on the source
      const size_t bytes = c.src->nbytes();
      if (from.is_host()) {
        KITE_TRY(be.upload(*c.dst, c.src->data, bytes));
      } else if (be.is_host()) {
        KITE_TRY(from.download(*c.src, c.dst->data, bytes));
      } else {  // device to device: through host memory
        if (staging.size() < bytes) staging.resize(bytes);
        KITE_TRY(from.download(*c.src, staging.data(), bytes));
        KITE_TRY(be.upload(*c.dst, staging.data(), bytes));
      }
      if (stats != nullptr) ++stats->copies, stats->copy_bytes += static_cast<int64_t>(bytes);
    }
    if (!each_node) {
      KITE_TRY(be.compute(split.nodes));
      continue;
    }
    for (Tensor* n : split.nodes) {
      KITE_TRY(be.compute(std::span<Tensor* const>(&n, 1)));
      if (n->op == Op::kView || n->op == Op::kKvWrite) continue;
      KITE_TRY(be.synchronize());
      KITE_TRY(each_node(*n, be));
    }
  }
  if (stats != nullptr) ++stats->runs;
  return ok_status();
}

}  // namespace kite

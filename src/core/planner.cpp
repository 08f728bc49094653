#include "src/core/planner.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <unordered_map>

namespace kite {
namespace {

Tensor* root_of(Tensor* t) {
  while (aliases_src0(t->op)) t = t->src[0];
  return t;
}

size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

// First-fit allocator over [0, inf) with coalescing free ranges.
class ArenaAllocator {
 public:
  explicit ArenaAllocator(size_t alignment) : alignment_(alignment) {}

  size_t alloc(size_t bytes) {
    bytes = align_up(std::max<size_t>(bytes, 1), alignment_);
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second >= bytes) {
        const size_t off = it->first;
        const size_t rest = it->second - bytes;
        free_.erase(it);
        if (rest > 0) free_[off + bytes] = rest;
        return off;
      }
    }
    // Grow: extend a free range that ends at the top, or start a new one there.
    size_t off = top_;
    if (!free_.empty()) {
      auto last = std::prev(free_.end());
      if (last->first + last->second == top_) {
        off = last->first;
        free_.erase(last);
      }
    }
    top_ = off + bytes;
    return off;
  }

  void free(size_t off, size_t bytes) {
    bytes = align_up(std::max<size_t>(bytes, 1), alignment_);
    auto [it, inserted] = free_.emplace(off, bytes);
    auto next = std::next(it);
    if (next != free_.end() && it->first + it->second == next->first) {
      it->second += next->second;
      free_.erase(next);
    }
    if (it != free_.begin()) {
      auto prev = std::prev(it);
      if (prev->first + prev->second == it->first) {
        prev->second += it->second;
        free_.erase(it);
      }
    }
  }

  size_t top() const { return top_; }

 private:
  size_t alignment_;
  size_t top_ = 0;
  std::map<size_t, size_t> free_;  // offset -> size
};

}  // namespace

MemoryPlan MemoryPlan::make(const Graph& g, size_t alignment) {
  return make(g.nodes(), g.leaves(), g.outputs(), alignment);
}

MemoryPlan MemoryPlan::make(std::span<Tensor* const> nodes, std::span<Tensor* const> leaves,
                            std::span<Tensor* const> keep, size_t alignment) {
  MemoryPlan plan;
  ArenaAllocator arena(alignment);

  // Last reader of each root (kept tensors: never freed).
  std::unordered_map<Tensor*, size_t> last_use;
  for (size_t i = 0; i < nodes.size(); ++i)
    for (Tensor* s : nodes[i]->src)
      if (s != nullptr) last_use[root_of(s)] = i;
  for (Tensor* out : keep) last_use[root_of(out)] = SIZE_MAX;

  for (Tensor* leaf : leaves)
    if (leaf->data == nullptr) plan.offsets_.emplace_back(leaf, arena.alloc(leaf->nbytes()));

  std::unordered_map<Tensor*, size_t> placed;
  // Roots done with at the node before this one: freed once this node's output is placed, so
  // that no node's output shares bytes with the inputs or output of the node before it (no op
  // is in place, and a backend may run two neighbours as one launch).
  std::vector<std::pair<size_t, size_t>> done;  // offset, bytes
  for (size_t i = 0; i < nodes.size(); ++i) {
    Tensor* n = nodes[i];
    if (aliases_src0(n->op)) {
      plan.aliases_.push_back(n);
    } else {
      const size_t off = arena.alloc(n->nbytes());
      placed[n] = off;
      plan.offsets_.emplace_back(n, off);
    }
    for (const auto& [off, bytes] : done) arena.free(off, bytes);
    done.clear();
    // Roots whose last reader is this node, and a node nobody reads (and not kept).
    auto retire = [&](Tensor* r) {
      auto p = placed.find(r);
      if (p == placed.end()) return;
      done.emplace_back(p->second, r->nbytes());
      placed.erase(p);
    };
    for (Tensor* s : n->src)
      if (s != nullptr && last_use[root_of(s)] == i) retire(root_of(s));
    if (!aliases_src0(n->op) && last_use.count(n) == 0) retire(n);
  }
  plan.arena_bytes_ = arena.top();
  return plan;
}

void MemoryPlan::place(uint8_t* base) const {
  for (const auto& [t, off] : offsets_) t->data = base + off;
  for (Tensor* n : aliases_) {
    n->data = static_cast<uint8_t*>(n->src[0]->data) + n->view_offset;
    if (n->op == Op::kKvWrite) n->nb = n->src[0]->nb;
  }
}

}  // namespace kite

// kite/src/core/planner.h — memory planning of a graph's activations, once per graph shape.
//
// Every node that produces new bytes, and every input leaf without bytes, gets an offset in one
// arena. A node's bytes are reused once the node after its last reader is placed (views and
// kv_write alias their root, which then lives as long as they do), so no node's output shares
// bytes with the inputs or the output of the node before it: a backend may run two neighbours
// as one launch. Inputs and outputs live for the whole graph. The arena is sized once and
// reused for every step of the same shape: no allocation per token.
#pragma once

#include <cstddef>
#include <span>
#include <utility>
#include <vector>

#include "src/core/graph.h"

namespace kite {

class MemoryPlan {
 public:
  // Plans `g` (after build()); `alignment` is the byte alignment of every placement.
  static MemoryPlan make(const Graph& g, size_t alignment = 64);
  // Plans a part of a graph (one backend's nodes, in execution order): `nodes`, the `leaves`
  // without bytes (inputs: live for the whole run), and `keep`, tensors whose bytes must outlive
  // the run (outputs, and what another backend copies out later). Sources that are not in
  // `nodes` are someone else's and are left alone.
  static MemoryPlan make(std::span<Tensor* const> nodes, std::span<Tensor* const> leaves,
                         std::span<Tensor* const> keep, size_t alignment = 64);

  size_t arena_bytes() const { return arena_bytes_; }
  // Points every planned tensor at base + its offset, and every view (of the planned nodes) at
  // its source's bytes.
  void place(uint8_t* base) const;
  void place(const Graph&, uint8_t* base) const { place(base); }

 private:
  size_t arena_bytes_ = 0;
  std::vector<std::pair<Tensor*, size_t>> offsets_;
  std::vector<Tensor*> aliases_;  // views and kv_write, in order
};

}  // namespace kite

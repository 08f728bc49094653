// kite/src/core/split.h — one graph over several backends (layer placement, `--gpu-layers`).
//
// Every node of a built graph is assigned a backend by the model part it belongs to
// (Tensor::layer, through a caller's placement function); views and kv_write go where their
// source's bytes are. Runs of consecutive nodes on one backend are "splits", executed in order.
// Where a node reads a tensor that another backend computed, the tensor is copied once into a
// tensor of the reader's arena before the first split that reads it; input leaves (positions,
// slots, block table, ...) get one replica per backend that reads them, which the caller uploads;
// weights in host memory are readable everywhere (device backends mirror them); tensors in a
// backend's own buffer (the KV cache) may be read only by that backend.
//
// Each backend has its own memory plan (one arena per backend); tensors that another backend
// copies out are kept alive for the whole run. The graph's nodes are rewired to read the
// replicas and copies, so a SplitGraph belongs to its Graph (built once per batch shape).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "src/base/status.h"
#include "src/core/backend.h"
#include "src/core/graph.h"
#include "src/core/planner.h"

namespace kite {

// `src` (computed on backend `src_backend`) copied into `dst`, a tensor of the reading split's
// backend.
struct SplitCopy {
  Tensor* src = nullptr;
  Tensor* dst = nullptr;
  int src_backend = 0;
};

struct GraphSplit {
  int backend = 0;
  std::vector<Tensor*> nodes;     // in graph order
  std::vector<SplitCopy> copies;  // done before `nodes` run
};

// Cross-backend traffic, accumulated by SplitGraph::compute().
struct SplitStats {
  int64_t runs = 0;    // compute() calls
  int64_t copies = 0;  // tensors copied between backends
  int64_t copy_bytes = 0;
};

class SplitGraph {
 public:
  // `placement(layer)` is the index into `backends` of the nodes tagged `layer`. Where a
  // `fallback` backend is given (>= 0: the CPU), a node runs there instead when its backend does
  // not support it, when `to_fallback` (if set) says so, or when every node it reads runs there
  // (so a chain of them does not cross back and forth): an MoE layer's experts on the CPU beside
  // its attention on a GPU. An error names a placement out of range or a tensor that lives on
  // one backend and is read by another.
  static Result<SplitGraph> make(Graph& g, std::span<Backend* const> backends,
                                 const std::function<int(int32_t layer)>& placement, int fallback = -1,
                                 const std::function<bool(const Tensor&)>& to_fallback = {}, size_t alignment = 64);

  const std::vector<GraphSplit>& splits() const { return splits_; }
  int n_copies() const;  // copies per run
  // The backend that computes `node` (-1: not a node of this graph).
  int backend_of(const Tensor* node) const;

  // Bytes of backend `b`'s arena, and pointing its tensors at `base` (before every run: the
  // arena may be shared with other graphs).
  size_t arena_bytes(int b) const { return plans_[static_cast<size_t>(b)].arena_bytes(); }
  void place(int b, uint8_t* base) const { plans_[static_cast<size_t>(b)].place(base); }

  // The replicas of input leaf `input` as (backend, tensor): the caller uploads the input's
  // bytes into each. Empty when no node reads it.
  std::span<const std::pair<int, Tensor*>> replicas(const Tensor* input) const;

  // Runs the splits in order: each split's copies (after synchronizing the source backend, so
  // the bytes are there), then its nodes, asynchronously where the backend is. `staging` is
  // host memory for copies between two device backends (grows once, then reused). With
  // `each_node`, nodes run one at a time and it is called after each computing node (after a
  // synchronize), e.g. for --dump-ops. The caller synchronizes the backends afterwards.
  Status compute(std::span<Backend* const> backends, std::vector<uint8_t>& staging, SplitStats* stats,
                 const std::function<Status(Tensor& node, Backend& backend)>& each_node = {}) const;

 private:
  std::vector<GraphSplit> splits_;
  std::vector<MemoryPlan> plans_;  // per backend
  std::unordered_map<const Tensor*, int> node_backend_;
  std::unordered_map<const Tensor*, std::vector<std::pair<int, Tensor*>>> replicas_;
  std::vector<std::unique_ptr<Tensor>> owned_;  // replicas and copy destinations
};

}  // namespace kite

// kite/src/core/profile.h — where a step's time goes, launch by launch (`kite bench --profile`).
//
// A backend given an OpProfile (Backend::set_profile) times each launch it makes, that is one
// node, or the run of nodes that one fused kernel computes, and adds it here under a label
// built from those nodes: "mul_mat q4_K 4096x14336 gate +up +swiglu". Launches with the same
// label (the same role in every layer) add up to one row. How a backend times is its own: the
// CPU reads the host clock around each node; CUDA records events around each launch and, while
// profiling, runs steps launch by launch instead of replaying CUDA graphs.
#pragma once

#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "src/core/tensor.h"

namespace kite {

class OpProfile {
 public:
  struct Row {
    std::string what;         // the launch's label (profile_label)
    int64_t calls = 0;        // launches
    double seconds = 0;       // their time, summed
    double weight_bytes = 0;  // bytes of matmul weights they read, summed (0: no matmul)
  };
  // A launch that computed `nodes` (in order; views are skipped) in `seconds`. Thread-safe
  // (tensor-parallel ranks add from their own threads).
  void add(std::span<Tensor* const> nodes, double seconds);
  void clear();
  // The rows, most time first.
  std::vector<Row> rows() const;
  double seconds() const;  // all launches' time

 private:
  mutable std::mutex mu_;
  std::unordered_map<std::string, Row> rows_;
};

// The label of a launch that computed `nodes`: the first node's op and role (its name without
// the layer: "l3.gate" is "gate"), with a matmul's weight type and shape (k x m), then "+role"
// for each further node (and its weight type where it differs from the first matmul's).
std::string profile_label(std::span<Tensor* const> nodes);

// The profile as a Markdown table, one row per label: calls and milliseconds per step, share of
// the launches' time, microseconds per call and, for matmuls, the weights' GB/s. `steps` divides
// the sums; `wall_seconds` (> 0) is the steps' wall-clock time, set beside the launches' total.
std::string format_profile(const OpProfile& p, int64_t steps, double wall_seconds);

}  // namespace kite

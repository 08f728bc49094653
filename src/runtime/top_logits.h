// kite/src/runtime/top_logits.h — a row of logits reduced to its k best entries on the device
// (Op::kTopK), and optionally a token drawn from the whole row there: what Context::decode brings
// back instead of the row when sampling needs no more (Sampler::samples_from_top,
// Sampler::draws_on_device), and what Sampler::sample_top samples from.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>

namespace kite {

struct TopLogits {
  std::span<const float> logits;  // the k largest, largest first (equal: lower id first); -inf pads
  std::span<const float> ids;     // their token ids, as exact floats; -1 pads
  float log_sum_exp = 0.f;        // log(sum(exp(logit))) over the whole row, when it was asked for
  int32_t drawn = -1;             // the token drawn from the whole row on the device (RowDraw)
  float drawn_logit = -std::numeric_limits<float>::infinity();  // its logit (in the row)

  size_t size() const { return logits.size(); }
  int32_t id(size_t j) const { return static_cast<int32_t>(ids[j]); }
  // The real entries (fewer than k when the row allows fewer tokens: the rest pad).
  size_t n_candidates() const {
    size_t n = 0;
    while (n < size() && id(n) >= 0) ++n;
    return n;
  }
};

// A draw from a whole row on the device (Graph::top_k's draw): Sampler's chain with every
// filter off, at `temperature` with the uniform `u` the sequence's RNG gave for it.
struct RowDraw {
  float temperature = 0.f;  // <= 0: no draw for this row
  double u = 0.0;
};

}  // namespace kite

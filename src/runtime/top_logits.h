// kite/src/runtime/top_logits.h — a row of logits reduced to its k best entries on the device
// (Op::kTopK): what Context::decode brings back instead of the row when sampling needs no more
// (Sampler::samples_from_top), and what Sampler::sample_top draws from.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace kite {

struct TopLogits {
  std::span<const float> logits;  // the k largest, largest first (equal: lower id first); -inf pads
  std::span<const float> ids;     // their token ids, as exact floats; -1 pads
  float log_sum_exp = 0.f;        // log(sum(exp(logit))) over the whole row, when it was asked for

  size_t size() const { return logits.size(); }
  int32_t id(size_t j) const { return static_cast<int32_t>(ids[j]); }
};

}  // namespace kite

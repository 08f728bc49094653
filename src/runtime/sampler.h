// kite/src/runtime/sampler.h — turning logits into the next token.
//
// The chain, in order: top-k, top-p, min-p, temperature, then a seeded draw; temperature <= 0
// is greedy (argmax, ties to the lowest id). Given the same seed and logits, the same tokens
// come out. (Penalties, logit bias, typical-p and grammars arrive with the sampling issue.)
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace kite {

struct SamplerParams {
  float temperature = 0.8f;
  int32_t top_k = 40;     // <= 0: off
  float top_p = 0.95f;    // >= 1: off
  float min_p = 0.05f;    // <= 0: off
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(const SamplerParams& params);
  int32_t sample(std::span<const float> logits);
  static int32_t argmax(std::span<const float> logits);

 private:
  SamplerParams params_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> cand_;  // reused: no allocation per token
  std::vector<float> probs_;
};

}  // namespace kite

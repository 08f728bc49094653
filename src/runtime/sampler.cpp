#include "src/runtime/sampler.h"

#include <algorithm>
#include <cmath>

namespace kite {

Sampler::Sampler(const SamplerParams& params) : params_(params), rng_(params.seed) {}

int32_t Sampler::argmax(std::span<const float> logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

int32_t Sampler::sample(std::span<const float> logits) {
  if (params_.temperature <= 0.f) return argmax(logits);
  cand_.clear();
  for (size_t i = 0; i < logits.size(); ++i) cand_.emplace_back(logits[i], static_cast<int32_t>(i));
  auto by_logit = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  size_t n = cand_.size();
  if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < n) {
    n = static_cast<size_t>(params_.top_k);
    std::partial_sort(cand_.begin(), cand_.begin() + static_cast<ptrdiff_t>(n), cand_.end(), by_logit);
  } else {
    std::sort(cand_.begin(), cand_.end(), by_logit);
  }
  // Probabilities of the survivors (at temperature 1 for the p filters, as llama.cpp does).
  const float max_l = cand_[0].first;
  std::vector<float>& p = probs_;
  p.resize(n);
  float sum = 0.f;
  for (size_t i = 0; i < n; ++i) sum += p[i] = std::exp(cand_[i].first - max_l);
  if (params_.top_p < 1.f) {
    float cum = 0.f;
    for (size_t i = 0; i < n; ++i) {
      cum += p[i] / sum;
      if (cum >= params_.top_p) {
        n = i + 1;
        break;
      }
    }
  }
  if (params_.min_p > 0.f) {
    size_t keep = 1;
    while (keep < n && p[keep] >= params_.min_p * p[0]) ++keep;
    n = keep;
  }
  // Temperature, then the draw.
  sum = 0.f;
  for (size_t i = 0; i < n; ++i) sum += p[i] = std::exp((cand_[i].first - max_l) / params_.temperature);
  const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng_) * sum;
  double acc = 0.0;
  for (size_t i = 0; i < n; ++i) {
    acc += p[i];
    if (u < acc) return cand_[i].second;
  }
  return cand_[n - 1].second;
}

}  // namespace kite

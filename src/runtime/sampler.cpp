#include "src/runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "src/base/fast_exp.h"

namespace kite {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// The candidate order everywhere: larger logit first, then lower id. As a heap comparator it
// puts the worst kept candidate on top.
bool better(const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
  return a.first > b.first || (a.first == b.first && a.second < b.second);
}

// The order a whole row lists its candidates in (Sampler::filter_candidates).
void sort_by_id(std::vector<std::pair<float, int32_t>>& c) {
  std::sort(c.begin(), c.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
}

// False for -inf (banned) and NaN.
bool allowed(float v) {
  return v > kNegInf;
}

// Passes over the whole vocabulary keep kLanes independent accumulators so the compiler can
// vectorize them (a single running max or sum is one long dependency chain).
constexpr size_t kLanes = 16;

// The largest allowed value; -inf when there is none.
float max_allowed(std::span<const float> x) {
  float acc[kLanes];
  std::fill(std::begin(acc), std::end(acc), kNegInf);
  size_t i = 0;
  for (; i + kLanes <= x.size(); i += kLanes)
    for (size_t j = 0; j < kLanes; ++j) acc[j] = x[i + j] > acc[j] ? x[i + j] : acc[j];
  float m = kNegInf;
  for (float a : acc) m = a > m ? a : m;
  for (; i < x.size(); ++i) m = x[i] > m ? x[i] : m;
  return m;
}

// Sum of exp(x - m) over the allowed values. The exponentials of a block go to a buffer and are
// summed as a tree: one running sum across the calls would be a chain through the stack.
double sum_exp(std::span<const float> x, float m) {
  float buf[kLanes];
  double z = 0.0;
  size_t i = 0;
  for (; i + kLanes <= x.size(); i += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) buf[j] = exp_masked(x[i + j], m, 1.f);
    for (size_t w = kLanes / 2; w > 0; w /= 2)
      for (size_t j = 0; j < w; ++j) buf[j] += buf[j + w];
    z += buf[0];
  }
  for (; i < x.size(); ++i) z += exp_masked(x[i], m, 1.f);
  return z;
}

// Does any of x[i, i + kLanes) exceed t? (Branch-free, so it vectorizes.)
bool any_above(const float* x, float t) {
  int any = 0;
  for (size_t j = 0; j < kLanes; ++j) any |= x[j] > t ? 1 : 0;
  return any != 0;
}

template <class T>
Error out_of_range(const char* field, const char* range, T got) {
  return make_error(field, " must be ", range, ", got ", got);
}

}  // namespace

Sampler::Sampler(const SamplerParams& params) : params_(params), rng_(params.seed), chosen_logprob_(kNaN) {}

Status Sampler::validate(const SamplerParams& p, int32_t n_vocab) {
  if (n_vocab <= 0) return make_error("the vocabulary is empty (n_vocab ", n_vocab, ")");
  if (!(p.temperature >= 0.f) || std::isinf(p.temperature))
    return out_of_range("temperature", "a finite number >= 0 (0: greedy)", p.temperature);
  if (p.top_k < 0) return out_of_range("top_k", ">= 0 (0: off)", p.top_k);
  if (!(p.top_p >= 0.f && p.top_p <= 1.f)) return out_of_range("top_p", "in [0, 1]", p.top_p);
  if (!(p.min_p >= 0.f && p.min_p <= 1.f)) return out_of_range("min_p", "in [0, 1]", p.min_p);
  if (!(p.typical_p >= 0.f) || std::isinf(p.typical_p))
    return out_of_range("typical_p", "a finite number >= 0 (>= 1: off)", p.typical_p);
  if (!(p.repeat_penalty > 0.f) || std::isinf(p.repeat_penalty))
    return out_of_range("repeat_penalty", "a finite number > 0 (1: off)", p.repeat_penalty);
  if (!std::isfinite(p.frequency_penalty))
    return out_of_range("frequency_penalty", "a finite number", p.frequency_penalty);
  if (!std::isfinite(p.presence_penalty))
    return out_of_range("presence_penalty", "a finite number", p.presence_penalty);
  if (p.penalty_last_n < -1)
    return out_of_range("penalty_last_n", ">= -1 (-1: whole history, 0: off)", p.penalty_last_n);
  if (p.n_logprobs < 0 || p.n_logprobs > n_vocab)
    return make_error("n_logprobs must be in [0, ", n_vocab, "] (the vocabulary size), got ", p.n_logprobs);
  for (size_t i = 0; i < p.logit_bias.size(); ++i) {
    const LogitBias& b = p.logit_bias[i];
    if (b.token < 0 || b.token >= n_vocab)
      return make_error("logit_bias[", i, "]: token ", b.token, " is out of range [0, ", n_vocab, ")");
    if (std::isnan(b.bias) || b.bias == std::numeric_limits<float>::infinity())
      return make_error("logit_bias[", i, "]: bias for token ", b.token, " must be finite or -inf (a ban), got ",
                        b.bias);
  }
  return ok_status();
}

// One vectorized pass over the row (a batched step samples dozens of 0.5 MB rows): the maximum
// of each block of 512, keeping the first block that reaches the final one, then the first index
// of it inside that block (ties go to the lowest id).
int32_t Sampler::argmax(std::span<const float> logits) {
  constexpr size_t kBlock = 512;
  float m = kNegInf;
  size_t first = 0;
  for (size_t b = 0; b < logits.size(); b += kBlock) {
    const float bm = max_allowed(logits.subspan(b, std::min(kBlock, logits.size() - b)));
    if (bm > m) m = bm, first = b;
  }
  if (m == kNegInf) return -1;
  const auto block = logits.subspan(first, std::min(kBlock, logits.size() - first));
  return static_cast<int32_t>(first + static_cast<size_t>(std::find(block.begin(), block.end(), m) - block.begin()));
}

// --- penalty window ------------------------------------------------------------------------------

bool Sampler::penalties_active() const {
  return params_.penalty_last_n != 0 &&
         (params_.repeat_penalty != 1.f || params_.frequency_penalty != 0.f || params_.presence_penalty != 0.f);
}

void Sampler::accept(int32_t token) {
  record(token, true);
}

void Sampler::accept_prompt(std::span<const int32_t> tokens) {
  for (int32_t t : tokens) record(t, false);
}

void Sampler::record(int32_t token, bool generated) {
  if (!penalties_active() || token < 0) return;
  count(token, generated, +1);
  if (params_.penalty_last_n < 0) return;  // the whole history: counts only, nothing leaves
  const auto cap = static_cast<size_t>(params_.penalty_last_n);
  if (window_.size() < cap) {
    window_.push_back({token, generated});
    return;
  }
  WindowEntry& oldest = window_[window_head_];
  count(oldest.token, oldest.generated, -1);
  oldest = {token, generated};
  window_head_ = (window_head_ + 1) % cap;
}

void Sampler::count(int32_t token, bool generated, int32_t delta) {
  auto it = std::lower_bound(counts_.begin(), counts_.end(), token,
                             [](const PenaltyCount& c, int32_t t) { return c.token < t; });
  if (delta > 0) {
    if (it == counts_.end() || it->token != token) it = counts_.insert(it, {token, 0, 0});
    it->all += 1;
    it->generated += generated ? 1 : 0;
    return;
  }
  // Leaving the window: the token is present by construction.
  it->all -= 1;
  it->generated -= generated ? 1 : 0;
  if (it->all == 0) counts_.erase(it);
}

void Sampler::apply_penalties_and_bias(std::span<float> logits) const {
  const size_t n = logits.size();
  if (penalties_active()) {
    const float rp = params_.repeat_penalty;
    for (const PenaltyCount& c : counts_) {
      if (static_cast<size_t>(c.token) >= n) continue;
      float& v = logits[static_cast<size_t>(c.token)];
      if (rp != 1.f) v = v <= 0.f ? v * rp : v / rp;
      v -= static_cast<float>(c.generated) * params_.frequency_penalty +
           (c.generated > 0 ? params_.presence_penalty : 0.f);
    }
  }
  for (const LogitBias& b : params_.logit_bias)
    if (b.token >= 0 && static_cast<size_t>(b.token) < n) logits[static_cast<size_t>(b.token)] += b.bias;
}

// --- sampling ------------------------------------------------------------------------------------

void Sampler::reset() {
  window_.clear();
  window_head_ = 0;
  counts_.clear();
  rng_.seed(params_.seed);
  top_logprobs_.clear();
  chosen_logprob_ = kNaN;
}

double Sampler::next_uniform() {
  return static_cast<double>(rng_() >> 11) * 0x1.0p-53;  // [0, 1), 53 random bits
}

int32_t Sampler::sample(std::span<const float> logits) {
  if (penalties_active() || !params_.logit_bias.empty()) {
    work_.assign(logits.begin(), logits.end());  // no reallocation once the vocabulary fits
    apply_penalties_and_bias(work_);
    return sample_modified(work_);
  }
  return sample_modified(logits);
}

int32_t Sampler::sample_in_place(std::span<float> logits) {
  apply_penalties_and_bias(logits);
  return sample_modified(logits);
}

int32_t Sampler::sample_modified(std::span<const float> logits) {
  top_logprobs_.clear();
  chosen_logprob_ = kNaN;
  if (params_.n_logprobs > 0) compute_logprobs(logits);
  const int32_t token = params_.temperature > 0.f ? sample_chain(logits) : argmax(logits);
  if (params_.n_logprobs > 0 && token >= 0)
    chosen_logprob_ = static_cast<float>(logits[static_cast<size_t>(token)] - log_z_);
  return token;
}

// The k best allowed tokens in (logit desc, id asc) order, in one pass over the vocabulary with a
// heap of k: most tokens cost one comparison against the k-th best so far.
void Sampler::select_top_k(std::span<const float> logits, size_t k, std::vector<Candidate>& out) {
  out.clear();
  if (k == 0) return;
  const size_t n = logits.size();
  size_t i = 0;
  for (; i < n && out.size() < k; ++i)
    if (allowed(logits[i])) out.emplace_back(logits[i], static_cast<int32_t>(i));
  std::make_heap(out.begin(), out.end(), better);
  if (out.size() == k) {
    float threshold = out.front().first;  // the worst kept; a later id with an equal logit is worse still
    auto consider = [&](size_t at) {
      const float v = logits[at];
      if (v > threshold) {
        std::pop_heap(out.begin(), out.end(), better);
        out.back() = {v, static_cast<int32_t>(at)};
        std::push_heap(out.begin(), out.end(), better);
        threshold = out.front().first;
      }
    };
    for (; i + kLanes <= n; i += kLanes)  // most blocks hold nothing above the threshold
      if (any_above(&logits[i], threshold))
        for (size_t j = 0; j < kLanes; ++j) consider(i + j);
    for (; i < n; ++i) consider(i);
  }
  std::sort_heap(out.begin(), out.end(), better);
}

void Sampler::compute_logprobs(std::span<const float> logits) {
  const float m = max_allowed(logits);
  if (m == kNegInf) {  // everything banned
    log_z_ = std::numeric_limits<double>::infinity();
    return;
  }
  log_z_ = static_cast<double>(m) + std::log(sum_exp(logits, m));
  select_top_k(logits, static_cast<size_t>(params_.n_logprobs), logprob_heap_);
  for (const Candidate& c : logprob_heap_) top_logprobs_.push_back({c.second, static_cast<float>(c.first - log_z_)});
}

float Sampler::filter_candidates(std::span<const float> logits) {
  const size_t n = logits.size();
  const int32_t k = params_.top_k;
  if (k > 0 && static_cast<size_t>(k) < n) {
    select_top_k(logits, static_cast<size_t>(k), cand_);
    return filter_top_k();
  }
  // Every allowed token is a candidate. Min-p (when typical-p is off) cuts relative to the
  // maximum, which top-p always keeps, so tokens under its cut can never survive: they are not
  // even listed — but top-p's normalizer (temperature 1, over the candidates) still counts them,
  // as it must.
  const bool typical = params_.typical_p < 1.f;
  const float max_logit = max_allowed(logits);
  if (max_logit == kNegInf) return kNegInf;
  const double z = params_.top_p < 1.f && !typical ? sum_exp(logits, max_logit) : 0.0;
  const float cut = params_.min_p > 0.f && !typical ? max_logit + std::log(params_.min_p) : kNegInf;
  if (params_.top_p < 1.f && !typical) {
    // Most nuclei close within the best few tokens: find those with one pass of a small heap
    // rather than listing every candidate for apply_top_p() to sort (which would keep the same
    // prefix of the same order).
    const double target = static_cast<double>(params_.top_p) * z;
    for (const size_t probe : {size_t{64}, size_t{1024}}) {
      if (probe >= n) break;
      select_top_k(logits, probe, cand_);
      double cum = 0.0;
      size_t kept = 0;
      bool closed = cand_.size() < probe;  // (every allowed token is here)
      for (; kept < cand_.size(); ++kept) {
        if (cand_[kept].first < cut) {  // (min-p's cut: the rest fall under it too)
          closed = true;
          break;
        }
        cum += std::exp(cand_[kept].first - max_logit);  // (as apply_top_p() sums)
        if (cum >= target) {
          closed = true;
          ++kept;
          break;
        }
      }
      if (closed) {
        cand_.resize(kept);
        cand_sorted_ = true;
        return filter_rest(max_logit, z);
      }
    }
  }
  cand_.clear();
  for (size_t i = 0; i < n; ++i)
    if (logits[i] >= cut && allowed(logits[i])) cand_.emplace_back(logits[i], static_cast<int32_t>(i));
  cand_sorted_ = false;
  return filter_rest(max_logit, z);
}

// The rest of the chain after top-k selected cand_ (sorted).
float Sampler::filter_top_k() {
  cand_sorted_ = true;
  if (cand_.empty()) return kNegInf;
  const float max_logit = cand_[0].first;
  double z = 0.0;
  for (const Candidate& c : cand_) z += std::exp(c.first - max_logit);
  return filter_rest(max_logit, z);
}

// Typical-p, top-p and min-p over cand_; `z` is top-p's normalizer.
float Sampler::filter_rest(float max_logit, double z) {
  const bool typical = params_.typical_p < 1.f;
  if (typical) {
    apply_typical();
    max_logit = cand_[0].first;
    z = 0.0;
    for (const Candidate& c : cand_) z += std::exp(c.first - max_logit);
  }
  if (params_.top_p < 1.f) apply_top_p(max_logit, z);
  if (params_.min_p > 0.f) apply_min_p();
  return max_logit;
}

int32_t Sampler::sample_chain(std::span<const float> logits) {
  return draw_candidate(filter_candidates(logits));
}

// probs_[i] = cand_[i]'s weight at the temperature (as the CPU top_k op's draw weighs a row:
// exp_masked, summed in double in order); returns their sum.
double Sampler::candidate_weights(float max_logit) {
  const float inv_t = 1.f / params_.temperature;
  probs_.resize(cand_.size());
  for (size_t i = 0; i < cand_.size(); ++i) probs_[i] = exp_masked(cand_[i].first, max_logit, inv_t);
  double total = 0.0;
  for (double p : probs_) total += p;
  return total;
}

// Temperature over the filtered cand_ (whose largest logit is `max_logit`), then the draw.
int32_t Sampler::draw_candidate(float max_logit) {
  if (max_logit == kNegInf) return -1;
  // (Every filter keeps the most likely candidate, max_logit.)
  const double total = candidate_weights(max_logit);
  const double u = next_uniform() * total;
  double acc = 0.0;
  for (size_t i = 0; i < cand_.size(); ++i) {
    acc += probs_[i];
    if (u < acc) return cand_[i].second;
  }
  return cand_.back().second;  // rounding: u landed at the very end
}

bool Sampler::samples_from_top(int32_t k, int32_t n_vocab) const {
  if (penalties_active() || !params_.logit_bias.empty() || params_.n_logprobs > k) return false;
  // (top_k >= the vocabulary keeps every token: not a top-k selection.)
  return params_.temperature <= 0.f || (params_.top_k > 0 && params_.top_k <= k && params_.top_k < n_vocab);
}

bool Sampler::lowers_only() const {
  const SamplerParams& p = params_;
  if (penalties_active() && (p.repeat_penalty < 1.f || p.frequency_penalty < 0.f || p.presence_penalty < 0.f))
    return false;
  return std::all_of(p.logit_bias.begin(), p.logit_bias.end(), [](const LogitBias& b) { return b.bias <= 0.f; });
}

bool Sampler::may_sample_from_top(int32_t k, int32_t n_vocab, bool grammar) const {
  const SamplerParams& p = params_;
  if (p.typical_p < 1.f) return false;
  if (grammar || penalties_active() || !p.logit_bias.empty()) {  // (the modified row's log-sum-exp is unknown)
    if (p.n_logprobs > 0 || !lowers_only()) return false;
  } else if (p.n_logprobs > k) {
    return false;
  }
  if (p.temperature <= 0.f) return true;
  if (p.top_k >= n_vocab) return false;  // (rare: whole rows)
  return (p.top_k > 0 && p.top_k <= k) || p.top_p < 1.f || p.min_p > 0.f;
}

bool Sampler::draws_on_device(int32_t k, int32_t n_vocab) const {
  const SamplerParams& p = params_;
  return p.temperature > 0.f && (p.top_k <= 0 || p.top_k >= n_vocab) && p.top_p >= 1.f && p.min_p <= 0.f &&
         p.typical_p >= 1.f && p.n_logprobs <= k && !penalties_active() && p.logit_bias.empty();
}

void Sampler::logprobs_from_top(const TopLogits& top, size_t n) {
  log_z_ = n == 0 ? std::numeric_limits<double>::infinity() : static_cast<double>(top.log_sum_exp);
  for (size_t j = 0; j < std::min(n, static_cast<size_t>(params_.n_logprobs)); ++j)
    top_logprobs_.push_back({top.id(j), static_cast<float>(top.logits[j] - log_z_)});
}

int32_t Sampler::take_drawn(const TopLogits& top) {
  top_logprobs_.clear();
  chosen_logprob_ = kNaN;
  if (params_.n_logprobs > 0 && top.drawn >= 0) {
    logprobs_from_top(top, top.n_candidates());
    chosen_logprob_ = static_cast<float>(top.drawn_logit - log_z_);
  }
  return top.drawn;
}

float Sampler::modified_logit(int32_t token, float logit) const {
  if (penalties_active()) {
    auto it = std::lower_bound(counts_.begin(), counts_.end(), token,
                               [](const PenaltyCount& c, int32_t t) { return c.token < t; });
    if (it != counts_.end() && it->token == token) {  // (as apply_penalties_and_bias)
      const float rp = params_.repeat_penalty;
      if (rp != 1.f) logit = logit <= 0.f ? logit * rp : logit / rp;
      logit -= static_cast<float>(it->generated) * params_.frequency_penalty +
               (it->generated > 0 ? params_.presence_penalty : 0.f);
    }
  }
  for (const LogitBias& b : params_.logit_bias)
    if (b.token == token) logit += b.bias;
  return logit;
}

// The chain over a row of which only the top entries are known (see sample_top in the header).
// top_cand_ holds the allowed entries, their logits modified, sorted; the first `certain` of them
// are the row's best in order, and every other token of the row is no better than `tail`.
int32_t Sampler::sample_top(const TopLogits& top, const std::function<bool(int32_t)>& allowed_token) {
  top_logprobs_.clear();
  chosen_logprob_ = kNaN;
  const size_t n = top.n_candidates();
  const bool complete = n < top.size();  // (fewer allowed tokens than k: all of them are here)
  const float tail = complete ? kNegInf : top.logits[top.size() - 1];
  const bool modified = allowed_token || penalties_active() || !params_.logit_bias.empty();
  if (params_.n_logprobs > 0) logprobs_from_top(top, n);  // (unmodified rows only: may_sample_from_top)
  // z over the row past the known entries: at most the row's sum less what the modifications
  // took from the known ones (they only lower logits).
  double z_taken = 0.0;
  top_cand_.clear();
  for (size_t j = 0; j < n; ++j) {
    const int32_t id = top.id(j);
    const float v = allowed_token && !allowed_token(id) ? kNegInf
                    : modified                          ? modified_logit(id, top.logits[j])
                                                        : top.logits[j];
    if (modified)
      z_taken += std::exp(static_cast<double>(top.logits[j]) - top.logits[0]) -
                 (allowed(v) ? std::exp(static_cast<double>(v) - top.logits[0]) : 0.0);
    if (allowed(v)) top_cand_.emplace_back(v, id);
  }
  size_t certain = top_cand_.size();
  if (modified && !complete) {
    // An entry is certain while it beats the tail: a changed logit equal to it may trail
    // tokens past the k (an unchanged one comes before them: the op breaks ties by id).
    std::sort(top_cand_.begin(), top_cand_.end(), better);
    certain = 0;
    while (certain < top_cand_.size() &&
           (top_cand_[certain].first > tail ||
            (top_cand_[certain].first == tail && modified_logit(top_cand_[certain].second, tail) == tail)))
      ++certain;
  } else if (modified) {
    std::sort(top_cand_.begin(), top_cand_.end(), better);
  }
  int32_t token = -1;
  if (params_.temperature <= 0.f) {
    if (certain > 0)
      token = top_cand_[0].second;
    else if (!complete)
      return kNeedsRow;
  } else {
    const bool top_k = params_.top_k > 0;
    const size_t want = top_k ? static_cast<size_t>(params_.top_k) : std::numeric_limits<size_t>::max();
    if (complete || certain >= want) {  // every candidate is known: the chain itself
      cand_.assign(top_cand_.begin(), top_cand_.begin() + static_cast<ptrdiff_t>(std::min(want, top_cand_.size())));
      if (top_k) {
        token = draw_candidate(filter_top_k());
      } else if (cand_.empty()) {
        token = -1;
      } else {  // (every allowed token: as filter_candidates lists them)
        const float max_logit = cand_[0].first;
        double z = 0.0;
        for (const Candidate& c : cand_) z += std::exp(c.first - max_logit);
        const float cut = params_.min_p > 0.f ? max_logit + std::log(params_.min_p) : kNegInf;
        std::erase_if(cand_, [cut](const Candidate& c) { return c.first < cut; });
        sort_by_id(cand_);
        cand_sorted_ = false;
        token = draw_candidate(filter_rest(max_logit, z));
      }
    } else {
      if (certain == 0) return kNeedsRow;
      // top-p's normalizer (relative to the maximum): z in [z_lo, z_hi]
      const double max_logit = top_cand_[0].first;
      double z_lo = 0.0, z_hi = 0.0;
      if (top_k) {  // the certain ones, and at most `want - certain` more no better than the tail
        for (size_t j = 0; j < certain; ++j) z_lo += std::exp(top_cand_[j].first - max_logit);
        z_hi = z_lo + static_cast<double>(want - certain) * std::exp(tail - max_logit);
      } else {  // every allowed token: the row's log-sum-exp, less what the modifications took
        const double scale = std::exp(top.logits[0] - max_logit);
        z_hi = (std::exp(static_cast<double>(top.log_sum_exp) - top.logits[0]) - z_taken) * scale;
        if (modified) {
          for (const Candidate& c : top_cand_) z_lo += std::exp(c.first - max_logit);
          // (the difference loses digits where the modifications took most of the row)
          z_hi += 1e-5 * std::exp(static_cast<double>(top.log_sum_exp) - top.logits[0]) * scale;
        } else {
          z_lo = z_hi;
        }
      }
      const size_t kept = top_kept(certain, tail, z_lo, z_hi);
      if (kept == 0) return kNeedsRow;
      cand_.assign(top_cand_.begin(), top_cand_.begin() + static_cast<ptrdiff_t>(kept));
      cand_sorted_ = top_k || params_.top_p < 1.f;
      if (!cand_sorted_)  // (min-p alone keeps the row's order: the draw walks it in that order)
        sort_by_id(cand_);
      token = draw_candidate(top_cand_[0].first);
    }
  }
  if (params_.n_logprobs > 0 && token >= 0)
    for (size_t j = 0; j < n; ++j)
      if (top.id(j) == token) chosen_logprob_ = static_cast<float>(top.logits[j] - log_z_);
  return token;
}

// How many of top_cand_'s first `certain` entries top-p and min-p keep, when the unknown rest of
// the candidates (each no better than `tail`) cannot change it (else 0); top-p's normalizer z
// (relative to the maximum) lies in [z_lo, z_hi].
size_t Sampler::top_kept(size_t certain, float tail, double z_lo, double z_hi) const {
  constexpr size_t kAll = std::numeric_limits<size_t>::max();
  const float max_logit = top_cand_[0].first;
  // Top-p keeps the first i + 1 where the running sum reaches top_p * z.
  size_t p_lo = kAll, p_hi = kAll;
  if (params_.top_p < 1.f) {
    double cum = 0.0;
    for (size_t j = 0; j < certain; ++j) {
      cum += std::exp(top_cand_[j].first - max_logit);  // (as apply_top_p() sums)
      if (p_lo == kAll && cum >= params_.top_p * z_lo) p_lo = j + 1;
      if (cum >= params_.top_p * z_hi) {
        p_hi = j + 1;
        break;
      }
    }
  }
  // Min-p keeps what is at least min_p times the maximum: known once a certain entry or the
  // tail falls under the cut.
  size_t m_lo = kAll, m_hi = kAll;
  if (params_.min_p > 0.f) {
    const float cut = max_logit + std::log(params_.min_p);
    m_lo = 0;
    while (m_lo < certain && top_cand_[m_lo].first >= cut) ++m_lo;
    if (tail < cut || m_lo < certain) m_hi = m_lo;
  }
  const size_t lo = std::min(p_lo, m_lo), hi = std::min(p_hi, m_hi);
  return lo == hi && hi <= certain ? hi : 0;
}

bool Sampler::distribution_in_place(std::span<float> logits, std::vector<TokenProb>& out) {
  out.clear();
  apply_penalties_and_bias(logits);
  top_logprobs_.clear();
  chosen_logprob_ = kNaN;
  if (params_.n_logprobs > 0) compute_logprobs(logits);
  if (params_.temperature <= 0.f) {
    const int32_t t = argmax(logits);
    if (t < 0) return false;
    out.push_back({t, 1.f});
    return true;
  }
  return candidate_distribution(filter_candidates(logits), out);
}

bool Sampler::distribution_from_top(const TopLogits& top, std::vector<TokenProb>& out) {
  out.clear();
  top_logprobs_.clear();
  chosen_logprob_ = kNaN;
  const size_t n = top.n_candidates();
  if (params_.n_logprobs > 0) logprobs_from_top(top, n);
  if (n == 0) return false;
  if (params_.temperature <= 0.f) {
    out.push_back({top.id(0), 1.f});
    return true;
  }
  cand_.clear();  // the chain's top-k branch, over the same candidates (as sample_top())
  for (size_t j = 0; j < std::min(n, static_cast<size_t>(params_.top_k)); ++j)
    cand_.emplace_back(top.logits[j], top.id(j));
  return candidate_distribution(filter_top_k(), out);
}

void Sampler::set_chosen(int32_t token, const TopLogits& top) {
  if (params_.n_logprobs <= 0) return;
  for (size_t j = 0; j < top.size(); ++j)
    if (top.id(j) == token) chosen_logprob_ = static_cast<float>(top.logits[j] - log_z_);
}

bool Sampler::candidate_distribution(float max_logit, std::vector<TokenProb>& out) {
  if (max_logit == kNegInf) return false;
  // The same arithmetic as sample_chain(), so a draw from `out` matches a draw there.
  const double total = candidate_weights(max_logit);
  out.reserve(cand_.size());
  for (size_t i = 0; i < cand_.size(); ++i) out.push_back({cand_[i].second, static_cast<float>(probs_[i] / total)});
  return true;
}

void Sampler::set_chosen(int32_t token, std::span<const float> logits) {
  if (params_.n_logprobs > 0 && token >= 0 && static_cast<size_t>(token) < logits.size())
    chosen_logprob_ = static_cast<float>(logits[static_cast<size_t>(token)] - log_z_);
}

int32_t draw_from(std::span<const TokenProb> dist, double u) {
  if (dist.empty()) return -1;
  double total = 0.0;
  for (const TokenProb& p : dist) total += p.prob;
  const double target = u * total;
  double acc = 0.0;
  for (const TokenProb& p : dist) {
    acc += p.prob;
    if (target < acc) return p.token;
  }
  return dist.back().token;  // rounding: u landed at the very end
}

// Locally typical sampling (Meister et al.): keep the tokens whose surprisal is closest to the
// entropy, up to a cumulative probability > typical_p; the survivors go back to logit order.
void Sampler::apply_typical() {
  if (!cand_sorted_) {
    std::sort(cand_.begin(), cand_.end(), better);
    cand_sorted_ = true;
  }
  const size_t n = cand_.size();
  const float m = cand_[0].first;
  probs_.resize(n);
  double z = 0.0;
  for (size_t i = 0; i < n; ++i) z += probs_[i] = std::exp(cand_[i].first - m);
  double entropy = 0.0;
  for (size_t i = 0; i < n; ++i) {
    probs_[i] /= z;
    if (probs_[i] > 0.0) entropy -= probs_[i] * std::log(probs_[i]);
  }
  auto score = [&](size_t i) {
    return probs_[i] > 0.0 ? std::abs(-std::log(probs_[i]) - entropy) : std::numeric_limits<double>::infinity();
  };
  order_.resize(n);
  for (size_t i = 0; i < n; ++i) order_[i] = i;
  std::sort(order_.begin(), order_.end(), [&](size_t a, size_t b) {
    const double sa = score(a), sb = score(b);
    return sa < sb || (sa == sb && a < b);
  });
  size_t keep = n;
  double cum = 0.0;
  for (size_t j = 0; j < n; ++j) {
    cum += probs_[order_[j]];
    if (cum > params_.typical_p) {
      keep = j + 1;
      break;
    }
  }
  // Compact in index order, which is logit order.
  std::sort(order_.begin(), order_.begin() + static_cast<ptrdiff_t>(keep));
  for (size_t j = 0; j < keep; ++j) cand_[j] = cand_[order_[j]];
  cand_.resize(keep);
}

// Nucleus: the smallest prefix in logit order whose probability (softmax over the candidates at
// temperature 1) reaches top_p. Unsorted candidates (top-k off) are sorted a growing chunk at a
// time, so a peaked distribution never pays for sorting the whole vocabulary.
void Sampler::apply_top_p(float max_logit, double z) {
  const double target = static_cast<double>(params_.top_p) * z;
  double cum = 0.0;
  size_t done = 0;
  size_t chunk = 64;
  while (done < cand_.size()) {
    const size_t end = std::min(cand_.size(), done + chunk);
    if (!cand_sorted_) {
      const auto first = cand_.begin() + static_cast<ptrdiff_t>(done);
      const auto last = cand_.begin() + static_cast<ptrdiff_t>(end);
      if (end < cand_.size()) std::nth_element(first, last, cand_.end(), better);
      std::sort(first, last, better);
    }
    for (size_t i = done; i < end; ++i) {
      cum += std::exp(cand_[i].first - max_logit);
      if (cum >= target) {
        cand_.resize(i + 1);
        cand_sorted_ = true;
        return;
      }
    }
    done = end;
    chunk *= 4;
  }
  cand_sorted_ = true;
}

// Drops tokens whose probability is below min_p times the most likely candidate's.
void Sampler::apply_min_p() {
  float m = cand_[0].first;
  if (!cand_sorted_)
    for (const Candidate& c : cand_) m = std::max(m, c.first);
  const float cut = m + std::log(params_.min_p);
  if (cand_sorted_) {
    size_t keep = 1;
    while (keep < cand_.size() && cand_[keep].first >= cut) ++keep;
    cand_.resize(keep);
  } else {
    std::erase_if(cand_, [cut](const Candidate& c) { return c.first < cut; });
  }
}

}  // namespace kite

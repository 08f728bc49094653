// kite/src/runtime/sampler.h — turning logits into the next token.
//
//   SamplerParams p;                       // llama.cpp's defaults: temp 0.8, top-k 40, top-p 0.95, min-p 0.05
//   p.seed = 42;
//   KITE_TRY(Sampler::validate(p, n_vocab)); // a message naming the field, for a CLI error or an HTTP 400
//   Sampler s(p);                          // one per sequence
//   s.accept_prompt(prompt_tokens);        // prompt tokens count toward the repeat penalty
//   for (;;) {
//     int32_t t = s.sample(logits);        // or sample_in_place() on a copy the caller owns
//     if (t < 0) break;                    // every token was banned (-inf)
//     s.accept(t);
//   }
//
// The chain, in this order (llama.cpp's semantics at every step):
//   1. penalties over the window of the last `penalty_last_n` accepted tokens (-1: the whole
//      history, 0: none). A token in the window with a positive logit is divided by
//      `repeat_penalty`, a non-positive one multiplied; then `count * frequency_penalty +
//      (count > 0) * presence_penalty` is subtracted.
//      Which tokens count: the repeat penalty counts every accepted token in the window, prompt
//      and generated (llama.cpp feeds the prompt to its penalty sampler); the frequency and
//      presence penalties count only the generated tokens in the window (OpenAI's and vLLM's
//      meaning: "how often the model has said it"). accept_prompt() records prompt tokens,
//      accept() generated ones.
//   2. logit bias: `bias` is added to the token's logit; -inf bans the token.
//   3. top-k (0: off), 4. typical-p (>= 1: off), 5. top-p (>= 1: off), 6. min-p (0: off) — the
//      p filters see the softmax of the surviving candidates at temperature 1;
//   7. temperature, 8. a draw from the survivors with the sequence's own RNG.
//   temperature 0 is greedy: the argmax after steps 1-2 (ties to the lowest id).
//
// Contracts:
//   - Reproducible: the same params (seed included), the same accepted tokens and the same
//     logits give the same token (mt19937_64 and our own conversion to [0, 1); no
//     std::*_distribution, whose output differs between standard libraries).
//   - sample() never changes the caller's logits (it copies them only when penalties or a bias
//     must be applied); sample_in_place() applies penalties and bias to the span it is given (the
//     scheduler passes its own copy, after the grammar mask wrote -inf to disallowed tokens).
//   - Cost: top-k (the default) is one pass over the vocabulary with a heap of k, no sort. With
//     top-k off, top-p sorts growing chunks of the candidates (min-p's cut is applied before,
//     without changing the result), and typical-p sorts all of them. Logprobs cost one exp per
//     vocabulary entry.
//   - No allocation per token once the buffers have grown to the vocabulary (and the penalty
//     window to its size).
//   - Logprobs (n_logprobs > 0): the log-softmax of the logits after penalties and bias (and
//     after whatever the caller masked), at temperature 1, before any truncation — the model's
//     own distribution, as OpenAI reports it. Banned tokens have -inf.
//   - Params that fail validate() never crash sample(): out-of-range bias tokens are ignored,
//     nonsense thresholds behave like their nearest valid value. Validate at the boundary.
//   - Not thread-safe; one Sampler per sequence.
#pragma once

#include <cstdint>
#include <functional>
#include <random>
#include <span>
#include <utility>
#include <vector>

#include "src/base/status.h"
#include "src/runtime/top_logits.h"

namespace kite {

struct LogitBias {
  int32_t token = 0;
  float bias = 0.f;  // added to the logit; -INFINITY bans the token
};

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.f;
};

// One entry of a sparse probability distribution over the vocabulary.
struct TokenProb {
  int32_t token = 0;
  float prob = 0.f;
};

// A draw from `dist` (probabilities that sum to about 1, any order) with the uniform `u` in
// [0, 1): the first entry whose running sum exceeds u * total. -1 when `dist` is empty.
int32_t draw_from(std::span<const TokenProb> dist, double u);

struct SamplerParams {
  float temperature = 0.8f;        // 0: greedy
  int32_t top_k = 40;              // 0: off
  float top_p = 0.95f;             // 1: off; 0 keeps only the most likely token
  float min_p = 0.05f;             // 0: off
  float typical_p = 1.0f;          // >= 1: off
  float repeat_penalty = 1.0f;     // 1: off
  float frequency_penalty = 0.0f;  // 0: off
  float presence_penalty = 0.0f;   // 0: off
  int32_t penalty_last_n = 64;     // window of recent tokens the penalties see; -1: all, 0: off
  std::vector<LogitBias> logit_bias;
  uint64_t seed = 0;
  int32_t n_logprobs = 0;  // report the top n logprobs per token (0: none)
};

class Sampler {
 public:
  explicit Sampler(const SamplerParams& params);

  // Checks every field against its range and the vocabulary; the message names the field, e.g.
  // "top_p must be in [0, 1], got 1.5" or "logit_bias[2]: token 99999 is out of range [0, 32000)".
  static Status validate(const SamplerParams& params, int32_t n_vocab);

  // The next token from `logits` (one float per vocabulary entry); -1 when every token is
  // banned (-inf or NaN). The caller's logits are left as they are.
  int32_t sample(std::span<const float> logits);
  // The same, applying penalties and bias to `logits` in place (no copy of the vocabulary).
  int32_t sample_in_place(std::span<float> logits);

  // The distribution the next sample() would draw from, as sparse (token, prob) pairs summing to
  // 1: penalties and bias are applied to `logits` in place, then top-k, typical-p, top-p, min-p
  // and temperature; temperature 0 gives the argmax with probability 1. Logprobs are computed
  // as sample() computes them (call set_chosen() once the token is known). False when every
  // token is banned. Speculative decoding verifies proposals against this distribution.
  bool distribution_in_place(std::span<float> logits, std::vector<TokenProb>& out);
  // A draw from `dist` with this sequence's RNG (reproducible like sample()).
  int32_t draw(std::span<const TokenProb> dist) { return draw_from(dist, next_uniform()); }
  // A uniform number in [0, 1) from this sequence's RNG.
  double uniform() { return next_uniform(); }
  // After distribution_in_place(): `token` is the one kept; sets chosen_logprob() from the
  // logits that call modified.
  void set_chosen(int32_t token, std::span<const float> logits);
  // The same from a row's top logits (Op::kTopK), when samples_from_top() holds: the
  // distribution distribution_in_place() gives from the whole row; then set_chosen(token, top).
  bool distribution_from_top(const TopLogits& top, std::vector<TokenProb>& out);
  void set_chosen(int32_t token, const TopLogits& top);

  // Records a generated token in the penalty window (call once for every token that was kept).
  void accept(int32_t token);
  // Records prompt tokens: they count toward the repeat penalty only (see the chain above).
  void accept_prompt(std::span<const int32_t> tokens);
  // Forgets the history and restarts the RNG from params.seed: the next samples repeat.
  void reset();

  // After a sample with n_logprobs > 0: the n most likely tokens, most likely first (ties: lower
  // id first), and the chosen token's logprob. Empty / NaN when n_logprobs is 0.
  std::span<const TokenLogprob> top_logprobs() const { return top_logprobs_; }
  float chosen_logprob() const { return chosen_logprob_; }

  const SamplerParams& params() const { return params_; }

  // Whether the next sample depends on nothing but the row's `k` largest logits (and its
  // log-sum-exp, for logprobs): no penalties, no logit bias, greedy or a top-k of at most k
  // (below the vocabulary size), at most k logprobs. Then sample_top() gives sample()'s token.
  bool samples_from_top(int32_t k, int32_t n_vocab) const;
  // Or may, seeing only them, find out whether it can (sample_top() then gives kNeedsRow when
  // not): top-p and/or min-p without top-k, a top-k above k with either; with a grammar
  // (`grammar`: its mask is applied to the candidates), penalties or a logit bias that only lower
  // logits, and no logprobs (the modified row's log-sum-exp is unknown). Greedy, top-k and
  // min-p usually close within the k best; top-p without top-k needs the row's log-sum-exp.
  bool may_sample_from_top(int32_t k, int32_t n_vocab, bool grammar = false) const;
  // Whether the next sample is a plain draw from the whole row (temperature > 0, every filter,
  // penalty and bias off: the OpenAI API's defaults; at most k logprobs), which the device can
  // make (RowDraw, TopLogits::drawn) with the next uniform() in place of the chain's own draw.
  bool draws_on_device(int32_t k, int32_t n_vocab) const;
  // The next token from a row's top logits (Op::kTopK), when samples_from_top() holds: the
  // token, logprobs and RNG draws sample() would give from the whole row (the logprobs up to
  // the rounding of the device's log-sum-exp). When only may_sample_from_top() holds, the same
  // or kNeedsRow, having drawn nothing: then sample() the whole row (Context::fetch_logits),
  // masked by `allowed` (a grammar's accepts(): the same tokens it keeps) if given. Penalties and
  // bias are applied to the k entries; a candidate they lower to the k-th logit or below may
  // trail tokens past the k, so the ones before it are what is known. Top-p's normalizer is
  // bounded by what is known (the log-sum-exp, the k-th logit); a nucleus that closes within
  // the rounding of those bounds may differ from the whole row's.
  static constexpr int32_t kNeedsRow = -2;
  int32_t sample_top(const TopLogits& top, const std::function<bool(int32_t)>& allowed = {});
  // The token drawn on the device, when draws_on_device() held (its uniform taken), with the
  // logprobs sample() would give (from the top k, the log-sum-exp and the drawn token's logit).
  int32_t take_drawn(const TopLogits& top);

  // The lowest id among the largest logits; -1 when empty or when all are -inf/NaN.
  static int32_t argmax(std::span<const float> logits);

 private:
  using Candidate = std::pair<float, int32_t>;  // (logit, token)
  struct WindowEntry {
    int32_t token;
    bool generated;
  };
  struct PenaltyCount {
    int32_t token;
    int32_t all;        // prompt and generated occurrences in the window
    int32_t generated;  // generated occurrences in the window
  };

  bool penalties_active() const;
  bool lowers_only() const;  // penalties and bias only lower logits (or ban tokens)
  float modified_logit(int32_t token, float logit) const;  // penalties and bias on one logit
  size_t top_kept(size_t certain, float tail, double z_lo, double z_hi) const;
  void record(int32_t token, bool generated);
  void count(int32_t token, bool generated, int32_t delta);
  void apply_penalties_and_bias(std::span<float> logits) const;
  int32_t sample_modified(std::span<const float> logits);
  void compute_logprobs(std::span<const float> logits);
  // compute_logprobs() from a row's top n candidates and log-sum-exp (the first n_logprobs).
  void logprobs_from_top(const TopLogits& top, size_t n);
  int32_t sample_chain(std::span<const float> logits);
  double candidate_weights(float max_logit);  // probs_ from cand_ at the temperature; their sum
  // Steps 3-6 of the chain into cand_; returns the largest logit (-inf: nothing allowed).
  float filter_candidates(std::span<const float> logits);
  float filter_top_k();
  float filter_rest(float max_logit, double z);
  int32_t draw_candidate(float max_logit);
  // Temperature over the filtered cand_, as draw_candidate() weighs it, into `out`.
  bool candidate_distribution(float max_logit, std::vector<TokenProb>& out);
  void select_top_k(std::span<const float> logits, size_t k, std::vector<Candidate>& out);
  void apply_typical();
  void apply_top_p(float max_logit, double z);
  void apply_min_p();
  double next_uniform();

  SamplerParams params_;
  std::mt19937_64 rng_;

  // Penalty window: a ring of the last penalty_last_n tokens, and per-token counts sorted by id.
  std::vector<WindowEntry> window_;
  size_t window_head_ = 0;
  std::vector<PenaltyCount> counts_;

  // Per-token buffers, reused.
  std::vector<float> work_;
  std::vector<Candidate> cand_;
  std::vector<Candidate> top_cand_;  // sample_top: the known candidates
  bool cand_sorted_ = false;  // cand_ is in (logit desc, id asc) order
  std::vector<double> probs_;
  std::vector<size_t> order_;
  std::vector<Candidate> logprob_heap_;
  std::vector<TokenLogprob> top_logprobs_;
  float chosen_logprob_ = 0.f;
  double log_z_ = 0.0;
};

}  // namespace kite

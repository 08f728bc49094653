// kite/src/runtime/speculative.h — speculative decoding: drafters that guess a sequence's next
// tokens, the rule that verifies the guesses against the target model, and the policy that
// decides how many to guess.
//
// The scheduler drives it (scheduler.h): each step, a decoding sequence with k proposals puts
// its pending token and the k proposals into the target's batch, all with logits; position by
// position the target's distribution p accepts or rejects the proposal (verify_proposal), the
// first rejection emits a replacement token and ends the run, and when all k are accepted the
// last position gives a bonus token. Rejected positions are truncated from the KV cache.
//
// Contracts:
//  - The output distribution is exactly the target's: a proposal x drawn from q is accepted with
//    probability min(1, p(x)/q(x)); on rejection the token is drawn from normalize(max(0, p - q)).
//    With temperature 0, p is one-hot at the sampler's argmax, so greedy output is identical to
//    decoding without speculation.
//  - Drafters never change the target's KV cache; the draft model's KV (its own Context with the
//    same sequence slots) follows each sequence's accepted tokens lazily: before drafting, the
//    slot is truncated to the common prefix with the sequence and the tokens it has not seen are
//    fed in.
//  - Nothing here allocates per token once the buffers have grown.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "src/base/status.h"
#include "src/runtime/context.h"
#include "src/runtime/sampler.h"

namespace kite {

enum class SpecMode { kNone, kDraft, kNgram };
const char* spec_mode_name(SpecMode m);  // "none", "draft", "ngram"
Result<SpecMode> parse_spec_mode(std::string_view name);

struct SpeculativeOptions {
  SpecMode mode = SpecMode::kNone;
  int32_t max_draft = 8;  // proposals per sequence and step at most
  float p_min = 0.75f;    // the draft model stops when its top probability is below this
  int32_t ngram_min = 1;  // n-gram lookup: suffix lengths tried, longest first
  int32_t ngram_max = 4;
  int32_t max_step_drafts = 64;  // proposals over all sequences in one step at most (the budget)
  bool adaptive = true;          // choose draft lengths from acceptance and measured cost; false:
                                 // always max_draft (what llama.cpp's speculative-simple does)
  Status validate() const;
};

struct SpecStats {
  int64_t drafted = 0;      // proposals verified by the target
  int64_t accepted = 0;     // proposals accepted
  int64_t draft_steps = 0;  // draft-model decode steps
  int64_t spec_steps = 0;   // target steps in which some sequence speculated
};

// --- verification --------------------------------------------------------------------------------

struct Verdict {
  int32_t token = -1;     // the token to emit at this position
  bool accepted = false;  // token == the proposal
};

// The rejection rule at one position. `p` is the target's distribution (what its sampler would
// draw from), `x` the proposal, `q` the distribution x was drawn from (empty: one-hot at x, as
// for n-gram proposals). Accepts when u_accept < p(x) / q(x); otherwise draws from
// normalize(max(0, p - q)) with u_draw (from p itself if that is empty, which only rounding can
// cause). `scratch` is reused storage.
Verdict verify_proposal(std::span<const TokenProb> p, int32_t x, std::span<const TokenProb> q, double u_accept,
                        double u_draw, std::vector<TokenProb>& scratch);

// --- n-gram / prompt lookup --------------------------------------------------------------------

// Proposes the tokens that followed the most recent earlier occurrence of the sequence's longest
// suffix of n_max..n_min tokens. One index per sequence; update() hashes only the tokens added
// since the last call (a sequence's tokens only grow).
class NgramIndex {
 public:
  NgramIndex(int32_t n_min, int32_t n_max);
  void update(std::span<const int32_t> tokens);
  // Appends up to `max` proposals to `out` (after update(tokens)); returns how many.
  int32_t propose(std::span<const int32_t> tokens, int32_t max, std::vector<int32_t>& out) const;
  void reset();

 private:
  static uint64_t hash(std::span<const int32_t> gram);
  int32_t n_min_, n_max_;
  std::vector<std::unordered_map<uint64_t, int32_t>> maps_;  // [n - n_min]: key -> index after the n-gram
  size_t indexed_ = 0;                                       // tokens[0, indexed_) are in the maps
};

// --- draft model ---------------------------------------------------------------------------------

// One sequence's proposals: tokens and, for each, the distribution it was drawn from.
struct Draft {
  std::vector<int32_t> tokens;
  std::vector<std::vector<TokenProb>> q;  // empty: one-hot (n-gram); else one per token
  void clear() {
    tokens.clear();
    q.clear();
  }
};

class DraftModel {
 public:
  // `draft` must have as many sequence slots as the target and the same vocabulary.
  DraftModel(Context& draft, const SpeculativeOptions& opts) : ctx_(draft), opts_(opts) {}

  struct Item {
    int32_t slot = 0;
    std::span<const int32_t> tokens;  // the sequence: prompt + generated, the pending token last
    int32_t k = 0;                    // proposals wanted
    Sampler* sampler = nullptr;       // the draft's sampler for this sequence
    Draft* out = nullptr;             // filled with at most k proposals
  };
  // Drafts for every item in batched draft steps (one per proposal depth). Items whose slot
  // cannot get KV blocks get no proposals. An error (from the draft context) leaves every
  // slot cleared.
  Status propose(std::span<Item> items, SpecStats& stats);
  // Forgets a slot (the sequence finished or was preempted).
  void reset(int32_t slot);
  // Drops what the draft holds past the common prefix with `tokens`.
  void rollback(int32_t slot, std::span<const int32_t> tokens);
  // Seconds and tokens of the last propose() (for the cost model).
  double last_seconds() const { return last_seconds_; }
  int32_t last_depth() const { return last_depth_; }
  int64_t last_tokens() const { return last_tokens_; }
  Context& context() { return ctx_; }

 private:
  std::vector<int32_t>& seen(int32_t slot);

  Context& ctx_;
  SpeculativeOptions opts_;
  std::vector<std::vector<int32_t>> seen_;  // per slot: the tokens in the draft's KV
  std::vector<BatchToken> batch_;
  std::vector<int32_t> active_;
  std::vector<int64_t> first_;
  std::vector<float> logits_;
  double last_seconds_ = 0;
  int32_t last_depth_ = 0;
  int64_t last_tokens_ = 0;
};

// --- policy ------------------------------------------------------------------------------------

// An online least-squares fit of seconds = a + b * tokens with exponential forgetting.
class StepCostFit {
 public:
  void add(double tokens, double seconds);
  bool ready() const { return n_ >= 6 && var_ok(); }
  double a() const;
  double b() const;

 private:
  bool var_ok() const;
  double s0_ = 0, sn_ = 0, st_ = 0, snn_ = 0, snt_ = 0;
  int64_t n_ = 0;
};

// A sequence's acceptance estimate: accepted / trials with forgetting, toward a prior of 0.5
// when it stops speculating (so it is re-probed after a while).
class AcceptanceEstimate {
 public:
  void record(int32_t drafted, int32_t accepted);
  void idle_step();
  double rate() const { return (num_ + 1.0) / (den_ + 2.0); }

 private:
  double num_ = 0, den_ = 0;
};

struct StepCost {
  double target_fixed = 1.0, target_per_token = 0.15;  // seconds (or any unit, the same for all)
  double draft_fixed = 0.0, draft_per_token = 0.0;     // zero for n-gram lookup
};

// Draft lengths maximizing expected tokens per second for one step: `rate[i]` is sequence i's
// acceptance estimate, `max_k[i]` its ceiling, `base_tokens` the step's tokens without drafts.
// Proposals are added where the expected gain per cost is largest, only while that raises the
// step's throughput, and at most `budget` in all. Writes out_k (same size as rate).
void plan_draft_lengths(std::span<const double> rate, std::span<const int32_t> max_k, int64_t base_tokens,
                        const StepCost& cost, int32_t budget, std::span<int32_t> out_k);

}  // namespace kite

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
//    fed in; a slot more than draft_window tokens behind restarts from the sequence's last
//    draft_window tokens instead (its context is then a suffix of the sequence; proposals only
//    affect acceptance, never the output).
//  - Nothing here allocates per token once the buffers have grown.
#pragma once

#include <algorithm>
#include <array>
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

// Relative costs of one step (seconds, or any unit that is the same for all four).
struct StepCost {
  double target_fixed = 1.0, target_per_token = 0.15;
  double draft_fixed = 0.0, draft_per_token = 0.0;  // zero for n-gram lookup
};

struct SpeculativeOptions {
  SpecMode mode = SpecMode::kNone;
  int32_t max_draft = 8;  // proposals per sequence and step at most
  float p_min = 0.75f;    // the draft model stops when its top probability is below this
  // How a draft model proposes for a sequence that samples (temperature > 0): its most likely
  // token, verified as an n-gram's proposal is (kept when the target's own sample is that token:
  // the rows sample as any row does, from their top 64 or drawn on the device, and the draft's
  // steps bring back one logit a row), or drawn from its distribution and verified by the
  // rejection rule against it (more proposals kept where the models are unsure, but each draft
  // row and verified row comes back whole to the host). Greedy sequences propose the most likely
  // token either way.
  bool sample_drafts = false;
  int32_t ngram_min = 2;  // n-gram lookup: suffix lengths tried, longest first (see NgramIndex)
  int32_t ngram_max = 12;
  int32_t max_step_drafts = 64;  // proposals over all sequences in one step at most (the budget)
  bool adaptive = true;          // choose draft lengths from acceptance and cost, and back off
                                 // after fruitless probes (ProbeBackoff); false: always max_draft
                                 // (what llama.cpp's speculative-simple does)
  int32_t backoff_cap = 256;     // adaptive: steps a sequence waits at most between fruitless probes
  int32_t draft_window = 32;     // a draft model more than this many tokens behind its sequence
                                 // restarts from the last draft_window tokens instead of catching
                                 // up on all of them (0: always catch up). Only acceptance changes.
  // Adaptive draft lengths weigh acceptance against step costs: cost_prior, scaled to the
  // target's measured seconds per step as soon as a few steps ran, with each model's own fit
  // of seconds against tokens once it is ready (StepCostFit::ready: steps of different sizes;
  // the draft's fit settles within a few probes, as its catch-ups differ in length). Measured
  // costs make the decisions, and so the drafted counts, vary from run to run.
  // measure_cost = false plans with cost_prior only: every decision is then a function of the
  // tokens and the models' outputs (reproducible; tests).
  bool measure_cost = true;
  StepCost cost_prior{1.0, 0.1, 0.15, 0.01};  // an extra row a tenth of a step, a draft step a seventh
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

// Prompt lookup: proposes the continuation of the sequence's longest suffix (n_max..n_min
// tokens) that occurred before, copied from its most recent occurrence. Selective, because a
// wrong proposal costs a verified row:
//  - an n-gram that was followed by different tokens at different places is ambiguous: no
//    proposal starts from it, and a proposal stops before the first position whose context
//    (the n tokens before it) is ambiguous;
//  - a match of n tokens proposes at most n (at most `max` when n == n_max: the text repeats
//    for at least that long).
// (llama.cpp's ngram-simple looks up one size, 12 tokens, and copies up to 48 when at least 12
// follow; this accepts shorter matches, limited by their length and their ambiguity.)
// One index per sequence; update() hashes only the tokens added since the last call (a
// sequence's tokens only grow; shorter tokens start over).
class NgramIndex {
 public:
  NgramIndex(int32_t n_min, int32_t n_max);
  void update(std::span<const int32_t> tokens);
  // Appends up to `max` proposals to `out` (after update(tokens)); returns how many.
  int32_t propose(std::span<const int32_t> tokens, int32_t max, std::vector<int32_t>& out) const;
  void reset();

 private:
  struct Entry {
    int32_t next = 0;        // index of the token after the most recent occurrence
    bool ambiguous = false;  // some occurrence was followed by another token
  };
  static uint64_t hash(std::span<const int32_t> gram);
  int32_t n_min_, n_max_;
  std::vector<std::unordered_map<uint64_t, Entry>> maps_;  // [n - n_min]: key -> entry
  size_t indexed_ = 0;                                     // tokens[0, indexed_) are in the maps
};

// --- draft model ---------------------------------------------------------------------------------

// One sequence's proposals: tokens and, for each, the distribution it was drawn from.
struct Draft {
  std::vector<int32_t> tokens;
  std::vector<std::vector<TokenProb>> q;  // empty: one-hot (n-gram, a draft's greedy proposals); else one per token
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
  // Tokens a propose() would feed the draft for a sequence of n_tokens in `slot` before its
  // first proposal (a catch-up after a back-off, a whole prompt for a new sequence; at most
  // draft_window once the slot started), at least 1. An upper bound: the prefix cache may
  // hold some of a new sequence's prompt.
  int64_t catch_up(int32_t slot, size_t n_tokens) const;
  // The draft steps of the last propose(): tokens and seconds of each (for the cost model).
  struct StepTime {
    int64_t tokens = 0;
    double seconds = 0;
  };
  std::span<const StepTime> last_steps() const { return last_steps_; }
  Context& context() { return ctx_; }

 private:
  std::vector<int32_t>& seen(int32_t slot);
  // Positions the draft holds for the sequence `tokens`: the window's start, after truncating to
  // the common prefix; restarts the slot when it is more than draft_window tokens behind.
  size_t sync(int32_t slot, std::span<const int32_t> tokens);

  Context& ctx_;
  SpeculativeOptions opts_;
  std::vector<std::vector<int32_t>> seen_;  // per slot: the tokens in the draft's KV
  std::vector<size_t> offset_;              // per slot: seen_ is tokens[offset_, ...)
  std::vector<BatchToken> batch_;
  std::vector<int32_t> active_;
  std::vector<int64_t> first_;
  std::vector<float> logits_;
  std::vector<StepTime> last_steps_;
  std::vector<int32_t> whole_rows_;  // a step's outputs that come back whole (the rest: top 1)
  int top_k_ = -1;                   // whether ctx_ reduces rows to their top 1 (-1: not asked yet)
};

// --- policy ------------------------------------------------------------------------------------

// A sequence's exponential back-off after fruitless probes (adaptive mode, draft model only:
// n-gram lookup is free, so it looks every step and the plan weighs its acceptance). A probe is
// a step in which the sequence was given a draft-model run; it is fruitless when no proposal
// came back or none was accepted. After the i-th fruitless probe in a row the sequence skips
// min(2^(i-1), cap) steps without drafting at all (no draft-model catch-up); a probe that accepted at least two proposals resets it, and one
// that accepted exactly one keeps the current wait (one token rarely pays for a draft step and
// a verified row; resetting on it made a pair that cannot pay probe again every step). Over n
// steps of a drafter that is never right it probes about log2(n) times while the waits grow,
// then once per cap + 1 steps.
class ProbeBackoff {
 public:
  // Whether this step may probe. A step that may not counts one step of the wait.
  bool ready() {
    if (wait_ == 0) return true;
    --wait_;
    return false;
  }
  // The outcome of a probe: proposals accepted (0 when none came back).
  void record(int32_t accepted, int32_t cap) {
    if (accepted >= 2) {
      level_ = 0;
    } else if (accepted == 0) {
      level_ = std::min(cap, std::max(1, level_ * 2));
    }
    wait_ = level_;
  }
  int32_t wait() const { return wait_; }

 private:
  int32_t wait_ = 0, level_ = 0;
};

// Measured seconds per step against its tokens, fitted as seconds = a + b * tokens. Each step
// size (tokens, rounded) keeps its last kWindow times, and its cost is their lower quartile:
// a step that was preempted, or that built a graph, only makes a time longer, so the quartile
// follows what the step costs (and a sustained change within a few steps) while outliers do
// not move it. The line is a least-squares fit through the sizes seen at least kMinObs times,
// each weighted by its count (capped at the window), so one odd step of a rare size cannot set
// the slope on its own (a plain fit over raw observations could: one slow first 3-token step
// among hundreds of 1-token ones made every extra row look as costly as a whole step).
class StepCostFit {
 public:
  static constexpr int kMinObs = 3;
  static constexpr int kWindow = 16;
  void add(double tokens, double seconds);
  // At least two sizes seen kMinObs times each.
  bool ready() const;
  // The line (a, b when ready(); a the mean cost and b 0 with one size; 0, 0 with none).
  void fit(double* a, double* b) const;
  double a() const;
  double b() const;
  // Before it is ready (e.g. every step had the same size): the count-weighted mean over the
  // sizes' costs and tokens.
  int64_t observations() const { return n_; }
  double mean_tokens() const;
  double mean_seconds() const;

 private:
  struct Size {
    double tokens = 0;                  // running mean (sizes are rounded)
    std::array<float, kWindow> last{};  // ring of the last times
    int64_t n = 0;
    double cost() const;  // the lower quartile of the window
    int32_t count() const { return static_cast<int32_t>(std::min<int64_t>(n, kWindow)); }
  };
  std::vector<Size> sizes_;  // [rounded tokens], the last one collects all larger steps
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

// Draft lengths maximizing expected tokens per second for one step: `rate[i]` is sequence i's
// acceptance estimate, `max_k[i]` its ceiling, `base_tokens` the step's tokens without drafts,
// `catch_up[i]` (empty: none) the tokens the draft model must first feed for sequence i, whose
// cost (draft_per_token each) its first proposal carries. Proposals are added where the
// expected gain per cost is largest, only while that raises the step's throughput, and at most
// `budget` in all. Writes out_k (same size as rate).
void plan_draft_lengths(std::span<const double> rate, std::span<const int32_t> max_k, int64_t base_tokens,
                        const StepCost& cost, int32_t budget, std::span<int32_t> out_k,
                        std::span<const int64_t> catch_up = {});

}  // namespace kite

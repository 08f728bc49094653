// kite/src/runtime/scheduler.h — continuous batching: many requests share one model step.
//
// Each step() packs the next token of every generating sequence plus chunks of waiting prompts
// (chunked prefill) under a token budget, runs the model once, samples, streams text through
// the callbacks, retires finished sequences and admits waiting ones. The CLI, the server and the
// C API all drive generation through it.
//
//   Scheduler s(ctx, tokenizer, {});
//   Request r;  r.prompt = tok.encode("Once upon a time");  r.params.max_tokens = 64;
//   r.on_event = [](const StreamEvent& e) { std::cout << e.text; };
//   KITE_ASSIGN_OR_RETURN(uint64_t id, s.submit(std::move(r)));
//   KITE_TRY(s.run_until_idle());
//
// Contracts:
//  - submit() and cancel() are thread-safe; step() and everything else run on one thread (the
//    engine thread), which is also where the callbacks run. Callbacks must not block.
//  - Admission is first come, first served: a waiting sequence is admitted when a sequence slot
//    is free and the pool can hold all of its uncomputed tokens (after its prefix-cache match).
//    It is admitted at the next step and starts its prompt in that step.
//  - A step takes one row per decoding sequence (oldest first), then prompt chunks (FIFO): all
//    of the token budget when nothing decodes, at most max_prefill_tokens beside decoding rows,
//    and never less than a small reserved share while prompts wait (see SchedulerOptions).
//  - When a running sequence needs a block and none is left, the most recently admitted
//    sequence is preempted: its blocks are released (full ones stay in the prefix cache), it goes
//    back to the front of the queue, and it is recomputed later from its prompt and the tokens it
//    already generated. No request is dropped or corrupted; its sampler state is kept.
//  - A request with n > 1 prefills its prompt once; the n sequences fork from it and share the
//    prompt's blocks (copy-on-write).
//  - Every request ends with exactly one event whose `finished` is set (per choice), and then
//    on_done once with the usage of the whole request.
//  - Speculative decoding (SchedulerOptions::speculative, speculative.h): a decoding sequence may
//    put its pending token plus k proposals (n-gram lookup or the draft Context) into a step;
//    accepted tokens are emitted one by one through the same path as any token (stop strings,
//    grammar, logprobs, max_tokens), rejected positions are truncated from both KV caches.
//    Greedy output is identical to decoding without speculation; sampled output has the
//    target's distribution. Grammar-constrained and logprob requests speculate too (each
//    position is masked and scored as a plain step would be). Drafts take only free blocks:
//    nobody is preempted to make room for them. k adapts per sequence to its acceptance rate
//    and to the measured cost of the extra rows and draft steps (0 when it cannot pay).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "src/base/thread_team.h"
#include "src/runtime/context.h"
#include "src/runtime/sampler.h"
#include "src/runtime/speculative.h"
#include "src/runtime/stop_matcher.h"
#include "src/runtime/tokenizer.h"

namespace kite {

class Grammar;
class TokenIndex;

enum class FinishReason { kNone, kStop, kLength, kCancelled, kError };
const char* finish_reason_name(FinishReason r);  // "stop", "length", "cancelled", "error"

struct GenerationParams {
  SamplerParams sampling;
  int32_t max_tokens = 256;                 // generated tokens at most; <= 0: until the context is full
  std::vector<std::string> stop;            // stop strings (not included in the output)
  std::vector<int32_t> stop_tokens;         // extra stop token ids (besides end-of-generation)
  bool ignore_eos = false;                  // keep going past end-of-generation tokens
  std::shared_ptr<const Grammar> grammar;   // constrains the output (GBNF or JSON Schema)
  int32_t n = 1;                            // independent completions of one prompt
};

struct StreamEvent {
  uint64_t request = 0;
  int32_t choice = 0;
  int32_t token = -1;                       // -1 on a final event that carries no token
  std::string text;                         // text that became final with this token
  float logprob = 0.f;                      // of `token`, when sampling.n_logprobs > 0
  std::vector<TokenLogprob> top_logprobs;   // when sampling.n_logprobs > 0
  bool finished = false;
  FinishReason reason = FinishReason::kNone;
  std::string error;                        // reason == kError
};

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;            // over all choices
  int64_t cached_tokens = 0;                // prompt tokens served by the prefix cache
};

struct Request {
  std::vector<int32_t> prompt;
  GenerationParams params;
  std::function<void(const StreamEvent&)> on_event;  // engine thread
  std::function<void(const Usage&)> on_done;         // engine thread, once, after the last event
};

// What one model step computed: for logs (kite serve --log-steps) and for tests of the policy.
struct StepInfo {
  int64_t step = 0;             // 1 for the first model step
  int32_t decode_rows = 0;      // sequences that computed their one pending token (+ proposals)
  int32_t drafted = 0;          // speculative proposals among the rows
  int32_t prompt_tokens = 0;    // prompt (or recompute) tokens
  int32_t prompt_seqs = 0;      // sequences with a prompt chunk in this step
  int32_t first_tokens = 0;     // sequences that sampled their first token in this step
  int32_t admitted = 0;         // sequences admitted at the start of this step
  int32_t running = 0, waiting = 0;  // after the step
  int32_t waiting_prompt_tokens = 0; // uncomputed prompt tokens of admitted sequences, after the step
  bool new_shape = false;       // the first step of this (tokens, outputs) shape: its graph was built
  int32_t top_k = 0;            // the rows came back as their top k logits (0: whole rows)
  int32_t device_draws = 0;     // ... and this many were drawn there (plain temperature sampling)
  int32_t whole_rows = 0;       // ... and this many came back whole beside them (a grammar, penalties)
  int32_t fetched_rows = 0;     // ... and this many were fetched whole after (top-p past the top k)
  double seconds = 0;           // the model step (graph build, forward pass, logits)
};

struct SchedulerOptions {
  int32_t max_batch_tokens = 512;   // tokens per model step (decode tokens + prefill chunks)
  // Prompt tokens per step while other sequences decode (0: up to max_batch_tokens). Bounds the
  // step time the decoding sequences wait for, and spreads a burst of arrivals over several
  // steps so that they do not stay in lock step (arriving, prefilling and finishing together).
  // A step with nothing decoding takes prompts up to max_batch_tokens; prompts that wait always
  // get at least min(this, 16, max_batch_tokens / 4) tokens of a step, even when decoding rows
  // would fill the budget.
  int32_t max_prefill_tokens = 0;
  std::function<void(const StepInfo&)> on_step;  // engine thread, after each model step
  int32_t max_queued = 256;         // waiting requests before submit() answers kBusy
  int32_t max_tokens_cap = 0;       // upper bound on any request's max_tokens; 0: the context
  SpeculativeOptions speculative;   // mode kDraft needs the draft Context in the constructor
  // Threads that sample a step's rows at once (0: the machine's cores, at most 8; 1: the engine
  // thread alone), for steps with at least `parallel_sampling_floats` floats of logits to sample
  // outside a grammar: at 64 sequences of a 128256-token vocabulary that is 33 MB a step, several
  // ms for one thread (kite-bench-sampling), as long as a GPU's whole step. Each sequence keeps
  // its own sampler, so the tokens do not depend on the thread count.
  int32_t sampling_threads = 0;
  int64_t parallel_sampling_floats = int64_t{1} << 20;
  // Rows that need no more than their best `top_k_outputs` logits (greedy, or a top-k up to
  // this, without penalties, logit bias or a grammar: Sampler::samples_from_top) are reduced to
  // those on the model's device (Op::kTopK; to the best one when every such row is greedy
  // without logprobs) and only they come back: at 64 sequences of a 128K vocabulary, 33 KB a
  // step instead of 33 MB, sampled in microseconds. Rows of plain temperature sampling (the
  // OpenAI API's defaults: Sampler::draws_on_device) are drawn there too. Rows of top-p or
  // min-p without top-k, with a grammar, or with penalties that only lower logits come back as
  // their top k too, and are fetched whole after the step only where the candidates reach past
  // them (Sampler::may_sample_from_top, Context::fetch_logits). The other rows come back whole
  // beside them, or every row does when those are most of the step. The tokens are the same
  // (on a GPU, but for the rounding of a sum near a draw's boundary). 0: always whole rows.
  int32_t top_k_outputs = 64;
};

struct SchedulerStats {
  int64_t steps = 0, preemptions = 0, computed_tokens = 0, generated_tokens = 0;
  int32_t running = 0, waiting = 0;
  double min_pool_use_at_preemption = 1.0;  // fraction of KV blocks in use when a preemption happened
  int64_t drafted = 0, accepted = 0;        // speculative proposals verified / accepted
  int64_t draft_steps = 0, spec_steps = 0;  // draft-model steps; target steps with proposals
};

class Scheduler {
 public:
  static constexpr int64_t kMinPromptShare = 16;  // prompt tokens a step keeps for waiting prompts

  // Sequence slots are the context's (ContextOptions::n_seqs): at most that many run at once.
  // `draft` (speculative mode kDraft) is the draft model's context; check it first with
  // check_speculative() — options that fail it turn speculation off.
  Scheduler(Context& ctx, std::shared_ptr<const Tokenizer> tokenizer, const SchedulerOptions& opts = {},
            Context* draft = nullptr);
  // Whether `opts.speculative` can run with these contexts (the draft's vocabulary and slots
  // must match the target's); the message names what differs.
  static Status check_speculative(const SchedulerOptions& opts, Context& target, Context* draft);
  ~Scheduler();

  // Queues a request; errors (kInvalidArgument, kTooLarge, kBusy) name what is wrong. Thread-safe.
  Result<uint64_t> submit(Request request);
  // Stops a request; its blocks are freed at the next step. Unknown ids are ignored. Thread-safe.
  void cancel(uint64_t id);

  // One model step (does nothing when there is no work). Engine thread only.
  Status step();
  bool idle() const;
  Status run_until_idle();
  // Blocks the engine thread until there is work (a submit or cancel) or `timeout` passes.
  void wait_for_work(std::chrono::milliseconds timeout);
  SchedulerStats stats() const;

 private:
  struct Job;
  struct Seq;
  void intake();
  void admit();
  void preempt_newest();
  void finish(Seq& s, FinishReason reason, const std::string& error = {});
  // Samples the step's output `row` for `s` (unless presample() did) and emits the token.
  void emit_token(Seq& s, size_t row);
  // The token for the step's output `row`: drawn on the device, from its top logits (the row
  // fetched when they do not settle it) or from the whole row; -1 when nothing is allowed.
  Result<int32_t> sample_output(Seq& s, size_t row);
  // The token from a whole row: masked by the sequence's grammar (on a copy), then sampled.
  int32_t sample_row(Seq& s, std::span<const float> logits);
  OutputTopK step_top_k();
  // Samples the rows emit_token() will need, without a grammar, on the sampling team at once;
  // after a top-k step, every one-row sequence's row (presample_top).
  void presample();
  void presample_top(int threads);
  bool emit(Seq& s, int32_t token);  // false when the sequence finished
  Status draft_step(int64_t* budget);
  void verify(Seq& s, size_t row, int32_t n_draft);
  StepCost step_cost() const;
  int64_t pending_prompt_tokens() const;  // uncomputed tokens of running sequences with more than one
  StepInfo describe_step();
  Status fork_choices(Seq& s);
  void fail_all(const Error& e);
  int32_t free_slot() const;
  void publish_stats();

  Context& ctx_;
  std::shared_ptr<const Tokenizer> tok_;
  std::shared_ptr<const TokenIndex> token_index_;  // built by the first submit with a grammar
  std::once_flag index_once_;
  SchedulerOptions opts_;

  mutable std::mutex mu_;  // guards incoming_, cancels_, next_id_, snapshot_
  std::condition_variable work_cv_;
  std::vector<std::unique_ptr<Job>> incoming_;
  std::vector<uint64_t> cancels_;
  uint64_t next_id_ = 1;
  SchedulerStats snapshot_;  // stats_ as of the last step, for other threads

  std::vector<std::unique_ptr<Job>> jobs_;
  std::deque<Seq*> waiting_;
  std::vector<Seq*> running_;   // in admission order (forks join at the end): the newest is last
  std::vector<bool> slot_used_;
  SchedulerStats stats_;      // engine thread

  std::unique_ptr<DraftModel> drafter_;
  StepCostFit target_cost_, draft_cost_;  // measured seconds per step vs tokens

  // Per-step scratch (reused).
  struct Chunk {
    Seq* seq;
    int32_t n;            // tokens of s->tokens in this step
    int32_t n_draft = 0;  // proposals after them (decode steps only)
  };
  std::vector<BatchToken> batch_;
  std::vector<Chunk> chunks_;
  std::vector<float> logits_;
  std::vector<TokenProb> dist_, scratch_;
  std::vector<double> rates_;
  std::vector<int32_t> max_k_, k_;
  std::vector<int64_t> catch_up_;  // per spec_chunks_ entry: tokens the draft model must first feed
  std::vector<size_t> spec_chunks_;
  std::vector<DraftModel::Item> items_;
  struct Presampled {
    Seq* seq;
    size_t row;
    int32_t token;
  };
  std::vector<Presampled> presampled_;  // in chunk order; emit_token takes them in turn
  size_t presampled_next_ = 0;
  std::vector<size_t> fetch_rows_, fetch_entries_;  // presample_top: rows to fetch, their presampled_ entries
  OutputTopK top_k_;  // what this step's rows came back as
  std::vector<RowDraw> draws_;  // top_k_.draws: per output row (temperature 0: not drawn)
  std::vector<int32_t> whole_rows_;  // top_k_.whole_rows
  int32_t fetched_rows_ = 0;         // this step's rows sampled from Context::fetch_logits
                                     // (candidates past the top k: top-p, a grammar, penalties)
  enum class RowsFrom : uint8_t { kTop, kDraw, kWhole };
  std::vector<RowsFrom> chunk_rows_;  // per chunk: how step_top_k brings its rows back
  bool draws_supported_ = false;
  std::unique_ptr<ThreadTeam> sampling_team_;  // created by the first step that needs it
  std::set<std::pair<size_t, size_t>> shapes_;  // (tokens, outputs) stepped so far: StepInfo::new_shape
  int32_t admitted_ = 0;                        // by the last admit()
};

}  // namespace kite

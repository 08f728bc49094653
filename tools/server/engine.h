// kite/tools/server/engine.h — the engine thread: loads the model, warms it up and drives the
// scheduler; HTTP handler threads submit requests and wait on a RequestStream.
//
// Threading: only the engine thread touches the Scheduler's step(), the Context and the KV
// cache. Handlers call submit()/cancel() (thread-safe in the Scheduler) and wait on their
// RequestStream, which the engine thread's callbacks fill (they only lock, append and notify).
// The KV statistics reach other threads through the EngineSnapshot published after each step.
//
// Embeddings (/v1/embeddings) and prompt scoring (completions' echo with logprobs) run on the
// engine thread too, as AuxJobs between scheduler steps (see AuxJob).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "src/runtime/chat_template.h"
#include "src/runtime/embed.h"
#include "src/runtime/scheduler.h"
#include "tools/common.h"
#include "tools/server/metrics.h"

namespace kite::tools::server {

using Clock = std::chrono::steady_clock;

// One event of one part (one prompt) of an HTTP request.
struct PartEvent {
  int32_t part = 0;
  StreamEvent event;
};

// The queue between the engine thread (producer) and one HTTP handler (consumer).
class RequestStream {
 public:
  RequestStream(int32_t n_parts, Metrics* metrics);

  // Engine thread.
  void on_event(int32_t part, const StreamEvent& e);
  void on_done(int32_t part, const Usage& u);

  // Handler thread: waits up to `wait` for news, appends pending events to *out. Returns true
  // when every part is done and everything was handed out.
  bool drain(std::vector<PartEvent>* out, std::chrono::milliseconds wait);
  // Usage summed over the parts (complete once drain() returned true).
  Usage usage() const;

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<PartEvent> pending_;
  int32_t parts_left_;
  Usage usage_;
  Metrics* metrics_;
  Clock::time_point start_ = Clock::now();
  std::vector<std::vector<Clock::time_point>> last_token_;  // [part][choice]
};

// Work that the engine thread runs between scheduler steps, one input per turn, on a small
// Context of its own (one sequence, created on first use) over the shared Model: the scheduler's
// slots and KV blocks are never touched, and a long list of inputs never stalls the generations
// for more than one input's forward pass. A handler queues a job and waits for it.
class AuxJob {
 public:
  virtual ~AuxJob() = default;
  // Handler thread: waits until every input is done or failed (true), or `deadline` (false).
  bool wait_until(Clock::time_point deadline);
  // Handler thread: the engine drops the job at its next turn (the waiter gets an error).
  void cancel() { cancelled_.store(true); }
  // Valid once wait_until() returned true.
  const std::optional<Error>& error() const { return error_; }

 protected:
  virtual size_t n_inputs() const = 0;
  // Engine thread: computes input `i` on `ctx`, whose sequence 0 is empty (leave it empty).
  virtual Status run_input(Context& ctx, size_t i) = 0;

 private:
  friend class Engine;
  void finish(std::optional<Error> error);

  size_t next_ = 0;  // engine thread: the next input
  std::optional<Error> error_;
  std::atomic<bool> cancelled_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;  // guarded by mu_
};

// One /v1/embeddings request: a pooled vector per input.
class EmbedJob : public AuxJob {
 public:
  EmbedJob(std::vector<std::vector<int32_t>> inputs, const EmbedOptions& options)
      : inputs_(std::move(inputs)), options_(options) {}
  const std::vector<std::vector<float>>& results() const { return results_; }

 protected:
  size_t n_inputs() const override { return inputs_.size(); }
  Status run_input(Context& ctx, size_t i) override;

 private:
  const std::vector<std::vector<int32_t>> inputs_;
  const EmbedOptions options_;
  std::vector<std::vector<float>> results_;  // written by the engine thread before finishing
};

// What the model thought of one prompt position: the logprob of the token there given the
// tokens before it, and the most likely tokens at that position (most likely first, ties by
// lower id). Position 0 has nothing before it: NaN and no candidates.
struct PositionLogprobs {
  float logprob = 0.f;
  std::vector<TokenLogprob> top;
};

// Prompt logprobs for /v1/completions `echo` with `logprobs`: every position of every prompt,
// from the model's own distribution (log-softmax of the logits at temperature 1, before any
// penalty, bias or truncation: what the sampler reports for generated tokens with default
// sampling). Costs one extra prefill of each prompt on the engine's auxiliary context.
class ScoreJob : public AuxJob {
 public:
  ScoreJob(std::vector<std::vector<int32_t>> prompts, int32_t n_top) : prompts_(std::move(prompts)), n_top_(n_top) {}
  // [prompt][position], one entry per prompt token.
  const std::vector<std::vector<PositionLogprobs>>& results() const { return results_; }

 protected:
  size_t n_inputs() const override { return prompts_.size(); }
  Status run_input(Context& ctx, size_t i) override;

 private:
  const std::vector<std::vector<int32_t>> prompts_;
  const int32_t n_top_;
  std::vector<std::vector<PositionLogprobs>> results_;
};

struct EngineOptions {
  ModelArgs model;
  int32_t parallel = 4;
  SchedulerOptions scheduler;
  std::string template_name;  // a built-in template name or a file; empty: the model's own
  SpecArgs spec;              // speculative decoding (--draft, --spec, ...)
};

class Engine {
 public:
  enum class State { kLoading, kReady, kFailed, kStopped };

  Engine(EngineOptions opts, Metrics* metrics);
  ~Engine();

  // Starts the engine thread: load, warm up, then serve until stop().
  void start();
  // Stops the engine thread (pending requests are cancelled first).
  void stop();

  State state() const { return state_.load(std::memory_order_acquire); }
  std::string failure() const;

  // Valid once state() is kReady (set before the state is published).
  const Tokenizer& tokenizer() const { return *loaded_.tokenizer; }
  const ChatTemplate& chat_template() const { return *template_; }
  const std::string& model_id() const { return model_id_; }
  const std::string& fingerprint() const { return fingerprint_; }
  int64_t n_ctx() const { return loaded_.ctx->kv().n_ctx(); }
  int64_t n_embd() const { return loaded_.model->hparams().n_embd; }
  int32_t parallel() const { return opts_.parallel; }

  // Submits one Scheduler request per prompt, all feeding `stream` (part i = prompts[i]).
  // On an error nothing stays queued. Thread-safe.
  Result<std::vector<uint64_t>> submit(std::vector<std::vector<int32_t>> prompts, const GenerationParams& params,
                                       std::shared_ptr<RequestStream> stream);
  void cancel(const std::vector<uint64_t>& ids);
  void cancel_all();
  // Queues an auxiliary job (kBusy when --max-queue jobs already wait). Thread-safe.
  Status submit_aux(std::shared_ptr<AuxJob> job);
  // Requests submitted and not yet done (generations and embedding jobs).
  size_t active() const;

  EngineSnapshot snapshot() const;

 private:
  void thread_main();
  Status load_and_warm_up();
  Status warm_up();
  void publish();
  // Runs one input of the oldest auxiliary job; false when there was none.
  bool aux_turn();
  bool aux_waiting() const;
  void fail_aux(const Error& e);

  EngineOptions opts_;
  Metrics* metrics_;
  Loaded loaded_;
  std::optional<ChatTemplate> template_;
  std::unique_ptr<Context> draft_ctx_;     // --draft; declared before scheduler_, which uses it
  std::unique_ptr<Scheduler> scheduler_;
  std::string model_id_, fingerprint_;
  std::atomic<State> state_{State::kLoading};
  std::atomic<bool> stop_{false};
  std::thread thread_;

  mutable std::mutex mu_;  // guards failure_, snapshot_, active_
  std::string failure_;
  EngineSnapshot snapshot_;
  std::set<uint64_t> active_;

  mutable std::mutex aux_mu_;  // guards aux_queue_
  std::deque<std::shared_ptr<AuxJob>> aux_queue_;
  std::unique_ptr<Context> aux_ctx_;  // engine thread only; created on the first job
};

}  // namespace kite::tools::server

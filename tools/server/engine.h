// kite/tools/server/engine.h — the engine thread: loads the model, warms it up and drives the
// scheduler; HTTP handler threads submit requests and wait on a RequestStream.
//
// Threading: only the engine thread touches the Scheduler's step(), the Context and the KV
// cache. Handlers call submit()/cancel() (thread-safe in the Scheduler) and wait on their
// RequestStream, which the engine thread's callbacks fill (they only lock, append and notify).
// The KV statistics reach other threads through the EngineSnapshot published after each step.
//
// Embeddings (/v1/embeddings) run on the engine thread too, between scheduler steps, one input
// per turn, on a small Context of their own (one sequence, created on first use) over the same
// shared Model: the scheduler's slots and KV blocks are never touched, and a long list of
// inputs never stalls the generations for more than one input's forward pass.
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

// One /v1/embeddings request between its handler and the engine thread.
class EmbedJob {
 public:
  EmbedJob(std::vector<std::vector<int32_t>> inputs, const EmbedOptions& options)
      : inputs_(std::move(inputs)), options_(options) {}

  // Handler thread: waits until every input is embedded, an error, or `deadline`. true: finished
  // (then results() or error() hold the outcome); false: timed out, and the job is cancelled.
  bool wait_until(Clock::time_point deadline);
  const std::vector<std::vector<float>>& results() const { return results_; }
  const std::optional<Error>& error() const { return error_; }

 private:
  friend class Engine;
  void finish(std::optional<Error> error);

  const std::vector<std::vector<int32_t>> inputs_;
  const EmbedOptions options_;
  size_t next_ = 0;                          // engine thread: the next input to embed
  std::vector<std::vector<float>> results_;  // written by the engine thread before done_
  std::optional<Error> error_;
  std::atomic<bool> cancelled_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;  // guarded by mu_
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
  int64_t n_ctx() const { return opts_.model.ctx; }
  int64_t n_embd() const { return loaded_.model->hparams().n_embd; }
  int32_t parallel() const { return opts_.parallel; }

  // Submits one Scheduler request per prompt, all feeding `stream` (part i = prompts[i]).
  // On an error nothing stays queued. Thread-safe.
  Result<std::vector<uint64_t>> submit(std::vector<std::vector<int32_t>> prompts, const GenerationParams& params,
                                       std::shared_ptr<RequestStream> stream);
  void cancel(const std::vector<uint64_t>& ids);
  void cancel_all();
  // Queues an embedding job (kBusy when --max-queue jobs already wait). Thread-safe.
  Status submit_embeddings(std::shared_ptr<EmbedJob> job);
  // Requests submitted and not yet done (generations and embedding jobs).
  size_t active() const;

  EngineSnapshot snapshot() const;

 private:
  void thread_main();
  Status load_and_warm_up();
  void publish();
  // Embeds one input of the oldest embedding job; false when there was none.
  bool embed_turn();
  bool embeddings_waiting() const;
  void fail_embeddings(const Error& e);

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

  mutable std::mutex embed_mu_;  // guards embed_queue_
  std::deque<std::shared_ptr<EmbedJob>> embed_queue_;
  std::unique_ptr<Context> embed_ctx_;  // engine thread only; created on the first job
};

}  // namespace kite::tools::server

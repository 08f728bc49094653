#include "tools/server/engine.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "formats/quant/types.h"

namespace kite::tools::server {

namespace {
// Wakes the engine thread out of Scheduler::wait_for_work(): the scheduler never hands out this
// id, and cancel() of an unknown id is ignored apart from waking the engine.
constexpr uint64_t kWakeId = UINT64_MAX;
}  // namespace

bool AuxJob::wait_until(Clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_until(lock, deadline, [&] { return done_; });
}

void AuxJob::finish(std::optional<Error> error) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    error_ = std::move(error);
    done_ = true;
  }
  cv_.notify_all();
}

Status EmbedJob::run_input(Context& ctx, size_t i) {
  KITE_ASSIGN_OR_RETURN(std::vector<float> v, embed(ctx, inputs_[i], options_));
  results_.push_back(std::move(v));
  return ok_status();
}

namespace {

// Prompt positions per model step when scoring: every position keeps its logits, so the step's
// output is kScoreBatch x n_vocab floats however long the prompt.
constexpr size_t kScoreBatch = 64;

// Logprobs of position p's token from the logits of position p - 1.
PositionLogprobs position_logprobs(std::span<const float> logits, int32_t token, int32_t n_top,
                                   std::vector<int32_t>* order) {
  double max = -INFINITY;
  for (float l : logits) max = std::max(max, static_cast<double>(l));
  double sum = 0;
  for (float l : logits) sum += std::exp(static_cast<double>(l) - max);
  const double log_z = max + std::log(sum);
  PositionLogprobs out;
  out.logprob = static_cast<float>(static_cast<double>(logits[static_cast<size_t>(token)]) - log_z);
  const size_t k = std::min(static_cast<size_t>(std::max(n_top, 0)), logits.size());
  order->resize(logits.size());
  for (size_t t = 0; t < order->size(); ++t) (*order)[t] = static_cast<int32_t>(t);
  std::partial_sort(order->begin(), order->begin() + static_cast<std::ptrdiff_t>(k), order->end(),
                    [&](int32_t a, int32_t b) {
                      const float la = logits[static_cast<size_t>(a)], lb = logits[static_cast<size_t>(b)];
                      return la > lb || (la == lb && a < b);
                    });
  for (size_t j = 0; j < k; ++j)
    out.top.push_back({(*order)[j], static_cast<float>(logits[static_cast<size_t>((*order)[j])] - log_z)});
  return out;
}

}  // namespace

Status ScoreJob::run_input(Context& ctx, size_t i) {
  const std::vector<int32_t>& tokens = prompts_[i];
  if (static_cast<int64_t>(tokens.size()) > ctx.kv().n_ctx())
    return make_error_code(ErrorCode::kTooLarge, "the prompt has ", tokens.size(), " tokens, more than the context's ",
                           ctx.kv().n_ctx());
  std::vector<PositionLogprobs> out;
  out.reserve(tokens.size());
  out.push_back({std::nanf(""), {}});  // nothing before the first token
  std::vector<BatchToken> batch;
  std::vector<int32_t> order;
  Status st = ok_status();
  // The last token's logits predict past the prompt: not needed.
  for (size_t start = 0; start + 1 < tokens.size() && st; start += kScoreBatch) {
    const size_t end = std::min(tokens.size() - 1, start + kScoreBatch);
    batch.clear();
    for (size_t p = start; p < end; ++p) batch.push_back({tokens[p], 0, true});
    st = ctx.decode(batch);
    for (size_t o = 0; st && o < ctx.n_outputs(); ++o)
      out.push_back(position_logprobs(ctx.logits(o), tokens[start + o + 1], n_top_, &order));
  }
  ctx.kv().clear(0);  // also on error: the next job starts from an empty sequence
  if (!st) return st.error();
  results_.push_back(std::move(out));
  return ok_status();
}

RequestStream::RequestStream(int32_t n_parts, Metrics* metrics)
    : parts_left_(n_parts), metrics_(metrics), last_token_(static_cast<size_t>(n_parts)) {}

void RequestStream::on_event(int32_t part, const StreamEvent& e) {
  const auto now = Clock::now();
  if (e.token >= 0 && metrics_ && part >= 0 && part < static_cast<int32_t>(last_token_.size())) {
    auto& times = last_token_[part];
    if (e.choice >= static_cast<int32_t>(times.size())) times.resize(e.choice + 1, Clock::time_point{});
    auto& last = times[e.choice];
    if (last == Clock::time_point{}) metrics_->observe_ttft(std::chrono::duration<double>(now - start_).count());
    else metrics_->observe_inter_token(std::chrono::duration<double>(now - last).count());
    last = now;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_.push_back({part, e});
  }
  cv_.notify_one();
}

void RequestStream::on_done(int32_t /*part*/, const Usage& u) {
  if (metrics_) {
    metrics_->add_tokens(u.prompt_tokens, u.completion_tokens, u.cached_tokens);
    metrics_->observe_request_latency(std::chrono::duration<double>(Clock::now() - start_).count());
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    usage_.prompt_tokens += u.prompt_tokens;
    usage_.completion_tokens += u.completion_tokens;
    usage_.cached_tokens += u.cached_tokens;
    --parts_left_;
  }
  cv_.notify_one();
}

bool RequestStream::drain(std::vector<PartEvent>* out, std::chrono::milliseconds wait) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, wait, [&] { return !pending_.empty() || parts_left_ <= 0; });
  for (auto& e : pending_) out->push_back(std::move(e));
  pending_.clear();
  return parts_left_ <= 0;
}

Usage RequestStream::usage() const {
  std::lock_guard<std::mutex> lock(mu_);
  return usage_;
}

namespace {

// FNV-1a over the model's files: names, sizes and their first and last MiB. Cheap for any model
// size, and it changes when the weights (or the file set) change.
std::string model_digest(const std::string& path) {
  namespace fs = std::filesystem;
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](const void* p, size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  };
  std::vector<fs::path> files;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    for (const auto& e : fs::directory_iterator(path, ec))
      if (e.is_regular_file(ec)) files.push_back(e.path());
  } else {
    files.push_back(path);
  }
  std::sort(files.begin(), files.end());
  std::vector<char> buf(1 << 20);
  for (const auto& f : files) {
    const std::string name = f.filename().string();
    mix(name.data(), name.size());
    const uint64_t size = fs::file_size(f, ec);
    mix(&size, sizeof size);
    std::ifstream in(f, std::ios::binary);
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    mix(buf.data(), static_cast<size_t>(in.gcount()));
    if (size > buf.size()) {
      in.clear();
      in.seekg(static_cast<std::streamoff>(size - buf.size()));
      in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
      mix(buf.data(), static_cast<size_t>(in.gcount()));
    }
  }
  char out[32];
  std::snprintf(out, sizeof out, "fp_%016llx", static_cast<unsigned long long>(h));
  return out;
}

std::string model_name(const std::string& path) {
  std::filesystem::path p(path);
  while (!p.empty() && p.filename().empty()) p = p.parent_path();  // "dir/" -> "dir"
  std::string name = p.filename().string();
  return name.empty() ? std::string("kite") : name;
}

Result<ChatTemplate> load_template(const std::string& name, const Model& model) {
  if (name.empty()) {
    if (const auto* v = model.source().metadata().find("tokenizer.chat_template")) {
      (void)v;
      auto text = model.source().metadata().get<std::string>("tokenizer.chat_template");
      if (text) {
        auto t = ChatTemplate::parse(*text);
        if (!t) return t.error().with_context("the model's chat template");
        return t;
      }
    }
    return ChatTemplate::builtin("chatml");
  }
  const auto names = ChatTemplate::builtin_names();
  if (std::find(names.begin(), names.end(), name) != names.end()) return ChatTemplate::builtin(name);
  std::ifstream f(name, std::ios::binary);
  if (!f) return make_error("--template ", name, ": neither a built-in template nor a readable file");
  std::stringstream ss;
  ss << f.rdbuf();
  auto t = ChatTemplate::parse(ss.str());
  if (!t) return t.error().with_context("--template " + name);
  return t;
}

}  // namespace

Engine::Engine(EngineOptions opts, Metrics* metrics) : opts_(std::move(opts)), metrics_(metrics) {}

Engine::~Engine() { stop(); }

void Engine::start() { thread_ = std::thread([this] { thread_main(); }); }

void Engine::stop() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

std::string Engine::failure() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failure_;
}

Status Engine::load_and_warm_up() {
  KITE_ASSIGN_OR_RETURN(loaded_, load_model(opts_.model, opts_.parallel));
  KITE_ASSIGN_OR_RETURN(ChatTemplate t, load_template(opts_.template_name, *loaded_.model));
  template_.emplace(std::move(t));
  model_id_ = model_name(opts_.model.model);
  fingerprint_ = model_digest(opts_.model.model);
  KITE_ASSIGN_OR_RETURN(opts_.scheduler.speculative, speculative_options(opts_.spec));
  KITE_ASSIGN_OR_RETURN(draft_ctx_, load_draft(opts_.spec, opts_.model, *loaded_.model, opts_.parallel));
  KITE_TRY(Scheduler::check_speculative(opts_.scheduler, *loaded_.ctx, draft_ctx_.get()));
  scheduler_ = std::make_unique<Scheduler>(*loaded_.ctx, loaded_.tokenizer, opts_.scheduler, draft_ctx_.get());
  KITE_TRY(warm_up());
  return ok_status();
}

// Before /health turns 200, the shapes a busy server meets first are built and run once (their
// graphs, the activation arena at its largest, the weights paged in), so that the first clients
// do not pay for them: every slot gets a short prompt, together as long as one step's budget
// (a burst on an idle server is prefilled in one such step), then decodes a row per slot. When
// the pool cannot hold that (a small --kv-memory), one short generation does.
Status Engine::warm_up() {
  const KvCache& kv = loaded_.ctx->kv();
  const int32_t slots = kv.n_seqs();
  const int32_t n_vocab = loaded_.model->hparams().n_vocab;
  const int64_t per_slot = std::clamp<int64_t>((opts_.scheduler.max_batch_tokens + slots - 1) / slots, 1,
                                               std::max<int64_t>(kv.n_ctx() - 3, 1));
  const int64_t blocks = slots * ((per_slot + 2 + kv.block_size() - 1) / kv.block_size());
  const bool full = blocks <= kv.pool().n_blocks() && slots <= opts_.scheduler.max_queued;
  EncodeOptions eo;
  eo.add_special = true;
  const std::vector<int32_t> hello = loaded_.tokenizer->encode("Hello", eo);
  for (int32_t j = 0; j < (full ? slots : 1); ++j) {
    Request r;
    if (full) {
      for (int64_t k = 0; k < per_slot; ++k)  // distinct prompts: no prefix-cache sharing
        r.prompt.push_back(static_cast<int32_t>((1 + j * per_slot + k) % n_vocab));
    } else {
      r.prompt = hello.empty() ? std::vector<int32_t>{0} : hello;
    }
    r.params.max_tokens = 2;
    r.params.sampling.temperature = 0;
    r.params.ignore_eos = true;
    KITE_TRY(scheduler_->submit(std::move(r)));
  }
  return scheduler_->run_until_idle();
}

void Engine::publish() {
  const KvStats kv = loaded_.ctx->kv().stats();
  const SchedulerStats s = scheduler_->stats();
  std::lock_guard<std::mutex> lock(mu_);
  snapshot_.running = s.running;
  snapshot_.waiting = s.waiting;
  snapshot_.steps = s.steps;
  snapshot_.preemptions = s.preemptions;
  snapshot_.spec_drafted = s.drafted;
  snapshot_.spec_accepted = s.accepted;
  snapshot_.kv_blocks_total = kv.blocks_total;
  snapshot_.kv_blocks_used = kv.blocks_used;
  snapshot_.kv_blocks_cached = kv.blocks_cached;
  snapshot_.prefix_queried_tokens = kv.prefix_queried_tokens;
  snapshot_.prefix_hit_tokens = kv.prefix_hit_tokens;
}

void Engine::thread_main() {
  if (auto st = load_and_warm_up(); !st) {
    std::lock_guard<std::mutex> lock(mu_);
    failure_ = st.error().message;
    state_.store(State::kFailed, std::memory_order_release);
    return;
  }
  publish();
  state_.store(State::kReady, std::memory_order_release);
  while (!stop_.load()) {
    // One auxiliary input per turn, then one generation step: neither starves the other.
    const bool aux = aux_turn();
    if (scheduler_->idle()) {
      if (aux || aux_waiting()) continue;
      publish();
      scheduler_->wait_for_work(std::chrono::milliseconds(50));
      continue;
    }
    if (auto st = scheduler_->step(); !st)
      std::fprintf(stderr, "kite serve: engine step failed: %s\n", st.error().message.c_str());
    publish();
  }
  // Shutting down: whatever is still queued or running ends as cancelled.
  fail_aux(make_error_code(ErrorCode::kBusy, "the server is shutting down"));
  cancel_all();
  for (int i = 0; i < 1000 && !scheduler_->idle(); ++i)
    if (!scheduler_->step()) break;
  publish();
  state_.store(State::kStopped, std::memory_order_release);
}

Result<std::vector<uint64_t>> Engine::submit(std::vector<std::vector<int32_t>> prompts,
                                             const GenerationParams& params, std::shared_ptr<RequestStream> stream) {
  if (state() != State::kReady) return make_error_code(ErrorCode::kBusy, "the model is not ready");
  std::vector<uint64_t> ids;
  for (size_t i = 0; i < prompts.size(); ++i) {
    Request r;
    r.prompt = std::move(prompts[i]);
    r.params = params;
    const int32_t part = static_cast<int32_t>(i);
    struct Cell {
      uint64_t id = 0;    // guarded by mu_
      bool done = false;  // guarded by mu_
    };
    auto cell = std::make_shared<Cell>();
    r.on_event = [stream, part](const StreamEvent& e) { stream->on_event(part, e); };
    r.on_done = [this, stream, part, cell](const Usage& u) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        cell->done = true;
        active_.erase(cell->id);
      }
      stream->on_done(part, u);
    };
    // Not under mu_: submit may build the grammar's token index, and the engine thread's
    // on_done needs mu_. A request that is done before it is recorded is simply not recorded.
    auto id = scheduler_->submit(std::move(r));
    if (!id) {
      cancel(ids);
      if (i > 0) return id.error().with_context("prompt " + std::to_string(i));
      return id.error();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      cell->id = *id;
      if (!cell->done) active_.insert(*id);
    }
    ids.push_back(*id);
  }
  return ids;
}

void Engine::cancel(const std::vector<uint64_t>& ids) {
  if (!scheduler_) return;
  for (uint64_t id : ids) scheduler_->cancel(id);
}

void Engine::cancel_all() {
  std::vector<uint64_t> ids;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ids.assign(active_.begin(), active_.end());
  }
  cancel(ids);
}

size_t Engine::active() const {
  size_t n = 0;
  {
    std::lock_guard<std::mutex> lock(aux_mu_);
    n = aux_queue_.size();
  }
  std::lock_guard<std::mutex> lock(mu_);
  return n + active_.size();
}

Status Engine::submit_aux(std::shared_ptr<AuxJob> job) {
  if (state() != State::kReady) return make_error_code(ErrorCode::kBusy, "the model is not ready");
  {
    std::lock_guard<std::mutex> lock(aux_mu_);
    const size_t limit = static_cast<size_t>(std::max(1, opts_.scheduler.max_queued));
    if (aux_queue_.size() >= limit)
      return make_error_code(ErrorCode::kBusy, "too many embedding or scoring requests waiting (", aux_queue_.size(),
                             "); try again later");
    aux_queue_.push_back(std::move(job));
  }
  scheduler_->cancel(kWakeId);
  return ok_status();
}

bool Engine::aux_waiting() const {
  std::lock_guard<std::mutex> lock(aux_mu_);
  return !aux_queue_.empty();
}

void Engine::fail_aux(const Error& e) {
  std::deque<std::shared_ptr<AuxJob>> jobs;
  {
    std::lock_guard<std::mutex> lock(aux_mu_);
    jobs.swap(aux_queue_);
  }
  for (auto& j : jobs) j->finish(e);
}

bool Engine::aux_turn() {
  std::shared_ptr<AuxJob> job;
  {
    std::lock_guard<std::mutex> lock(aux_mu_);
    if (aux_queue_.empty()) return false;
    job = aux_queue_.front();  // only this thread pops, so it stays the front
  }
  auto pop = [&](std::optional<Error> error) {
    {
      std::lock_guard<std::mutex> lock(aux_mu_);
      aux_queue_.pop_front();
    }
    job->finish(std::move(error));
  };
  if (job->cancelled_.load()) {
    pop(make_error("cancelled"));
    return true;
  }
  if (job->next_ >= job->n_inputs()) {
    pop(std::nullopt);
    return true;
  }
  if (!aux_ctx_) {
    ContextOptions co;
    co.n_threads = opts_.model.threads;
    co.n_ctx = n_ctx();
    co.n_seqs = 1;
    co.device = opts_.model.device;
    co.gpu_layers = opts_.model.gpu_layers;
    co.cpu_moe = opts_.model.cpu_moe;
    co.kv_type = quant::find_traits(opts_.model.kv_type)->type;
    co.prefix_cache = false;
    auto ctx = Context::create(loaded_.model, co);
    if (!ctx) {
      pop(ctx.error().with_context("cannot create the auxiliary context"));
      return true;
    }
    aux_ctx_ = std::move(*ctx);
  }
  const size_t i = job->next_++;
  if (auto st = job->run_input(*aux_ctx_, i); !st) {
    pop(job->n_inputs() > 1 ? st.error().with_context("input " + std::to_string(i)) : st.error());
    return true;
  }
  if (job->next_ == job->n_inputs()) pop(std::nullopt);
  return true;
}

EngineSnapshot Engine::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return snapshot_;
}

}  // namespace kite::tools::server

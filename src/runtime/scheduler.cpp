#include "src/runtime/scheduler.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <optional>

#include "src/runtime/grammar/grammar.h"
#include "src/runtime/scheduler_internal.h"

namespace kite {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kNone: return "none";
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kCancelled: return "cancelled";
    case FinishReason::kError: return "error";
  }
  return "none";
}

Scheduler::Scheduler(Context& ctx, std::shared_ptr<const Tokenizer> tokenizer, const SchedulerOptions& opts,
                     Context* draft)
    : ctx_(ctx), tok_(std::move(tokenizer)), opts_(opts) {
  slot_used_.assign(static_cast<size_t>(ctx_.kv().n_seqs()), false);
  if (!check_speculative(opts_, ctx_, draft)) opts_.speculative.mode = SpecMode::kNone;
  if (opts_.speculative.mode == SpecMode::kDraft) drafter_ = std::make_unique<DraftModel>(*draft, opts_.speculative);
  if (opts_.top_k_outputs > kMaxTopK) opts_.top_k_outputs = kMaxTopK;
  if (opts_.top_k_outputs > 0 && !ctx_.supports_top_k()) opts_.top_k_outputs = 0;
  draws_supported_ = opts_.top_k_outputs > 0 && ctx_.supports_top_k(true);
}

Status Scheduler::check_speculative(const SchedulerOptions& opts, Context& target, Context* draft) {
  const SpeculativeOptions& so = opts.speculative;
  if (so.mode == SpecMode::kNone) return ok_status();
  KITE_TRY(so.validate());
  if (so.mode != SpecMode::kDraft) return ok_status();
  if (draft == nullptr) return make_error("speculative mode 'draft' needs a draft model");
  const int32_t nv = target.model().hparams().n_vocab, dv = draft->model().hparams().n_vocab;
  if (nv != dv) return make_error("the draft model's vocabulary has ", dv, " tokens, the target's ", nv);
  const int32_t ts = target.kv().n_seqs(), ds = draft->kv().n_seqs();
  if (ts != ds) return make_error("the draft context has ", ds, " sequence slots, the target's ", ts);
  return ok_status();
}

Scheduler::~Scheduler() = default;

Result<uint64_t> Scheduler::submit(Request request) {
  const KvCache& kv = ctx_.kv();
  const GenerationParams& p = request.params;
  const int32_t n_vocab = ctx_.model().hparams().n_vocab;
  if (request.prompt.empty()) return make_error_code(ErrorCode::kInvalidArgument, "prompt is empty");
  for (int32_t t : request.prompt)
    if (t < 0 || t >= n_vocab)
      return make_error_code(ErrorCode::kInvalidArgument, "prompt token ", t, " is outside the vocabulary (", n_vocab, " tokens)");
  if (static_cast<int64_t>(request.prompt.size()) >= kv.n_ctx())
    return make_error_code(ErrorCode::kTooLarge, "prompt has ", request.prompt.size(), " tokens; the context holds ",
                           kv.n_ctx(), " (including at least one generated token)");
  const int64_t bs = kv.block_size();
  const int64_t blocks = (static_cast<int64_t>(request.prompt.size()) + bs) / bs;
  if (blocks > kv.pool().n_blocks())
    return make_error_code(ErrorCode::kTooLarge, "prompt needs ", blocks, " KV blocks; the pool has ", kv.pool().n_blocks());
  if (p.n < 1 || p.n > kv.n_seqs())
    return make_error_code(ErrorCode::kInvalidArgument, "n must be between 1 and ", kv.n_seqs(), ", got ", p.n);
  if (auto st = Sampler::validate(p.sampling, n_vocab); !st)
    return make_error_code(ErrorCode::kInvalidArgument, st.error().message);
  if (auto st = StopMatcher::validate(p.stop); !st) return make_error_code(ErrorCode::kInvalidArgument, st.error().message);
  for (int32_t t : p.stop_tokens)
    if (t < 0 || t >= n_vocab) return make_error_code(ErrorCode::kInvalidArgument, "stop token ", t, " is outside the vocabulary");

  auto job = std::make_unique<Job>();
  job->req = std::move(request);
  job->n_prompt = static_cast<int64_t>(job->req.prompt.size());
  job->live = job->req.params.n;
  const int64_t room = kv.n_ctx() - job->n_prompt;
  int32_t& max_tokens = job->req.params.max_tokens;
  if (max_tokens <= 0 || max_tokens > room) max_tokens = static_cast<int32_t>(room);
  if (opts_.max_tokens_cap > 0) max_tokens = std::min(max_tokens, opts_.max_tokens_cap);
  if (job->req.params.grammar && !tok_)
    return make_error_code(ErrorCode::kInvalidArgument, "a grammar needs the model's tokenizer");
  if (job->req.params.grammar) std::call_once(index_once_, [this] { token_index_ = TokenIndex::build(*tok_); });
  auto seq = std::make_unique<Seq>(job.get(), 0, tok_.get(), job->req.params);
  seq->tokens = job->req.prompt;
  seq->sampler.accept_prompt(seq->tokens);
  if (job->req.params.grammar) seq->grammar.emplace(job->req.params.grammar, token_index_);
  job->seqs.push_back(std::move(seq));

  std::lock_guard<std::mutex> lock(mu_);
  if (static_cast<int32_t>(incoming_.size()) + snapshot_.waiting >= opts_.max_queued)
    return make_error_code(ErrorCode::kBusy, "the queue is full (", opts_.max_queued, " requests waiting)");
  job->id = next_id_++;
  const uint64_t id = job->id;
  incoming_.push_back(std::move(job));
  work_cv_.notify_one();
  return id;
}

void Scheduler::cancel(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  cancels_.push_back(id);
  work_cv_.notify_one();
}

void Scheduler::wait_for_work(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!running_.empty() || !waiting_.empty()) return;  // engine-thread state: safe to read here
  work_cv_.wait_for(lock, timeout, [this] { return !incoming_.empty() || !cancels_.empty(); });
}

bool Scheduler::idle() const {
  std::lock_guard<std::mutex> lock(mu_);
  return incoming_.empty() && cancels_.empty() && waiting_.empty() && running_.empty();
}

SchedulerStats Scheduler::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return snapshot_;
}

void Scheduler::publish_stats() {
  stats_.running = static_cast<int32_t>(running_.size());
  stats_.waiting = static_cast<int32_t>(waiting_.size());
  std::lock_guard<std::mutex> lock(mu_);
  snapshot_ = stats_;
}

void Scheduler::intake() {
  std::vector<std::unique_ptr<Job>> incoming;
  std::vector<uint64_t> cancels;
  {
    std::lock_guard<std::mutex> lock(mu_);
    incoming.swap(incoming_);
    cancels.swap(cancels_);
  }
  for (auto& j : incoming) {
    waiting_.push_back(j->seqs[0].get());
    jobs_.push_back(std::move(j));
  }
  for (uint64_t id : cancels)
    for (auto& j : jobs_)
      if (j->id == id)
        for (auto& s : j->seqs)
          if (!s->done) finish(*s, FinishReason::kCancelled);
}

int32_t Scheduler::free_slot() const {
  for (size_t i = 0; i < slot_used_.size(); ++i)
    if (!slot_used_[i]) return static_cast<int32_t>(i);
  return -1;
}

void Scheduler::admit() {
  KvCache& kv = ctx_.kv();
  while (!waiting_.empty()) {
    Seq* s = waiting_.front();
    Job* j = s->job;
    const int32_t slots = (!j->forked && j->req.params.n > 1) ? j->req.params.n : 1;
    if (std::count(slot_used_.begin(), slot_used_.end(), false) < slots) return;
    const int32_t slot = free_slot();
    const int64_t matched = kv.match_prefix(slot, s->tokens);
    if (kv.blocks_needed(slot, static_cast<int64_t>(s->tokens.size()) - matched) > kv.pool().available()) {
      kv.clear(slot);
      return;
    }
    waiting_.pop_front();
    slot_used_[static_cast<size_t>(slot)] = true;
    s->slot = slot;
    s->computed = matched;
    for (int32_t i = 1; i < slots; ++i) {
      const int32_t r = free_slot();
      slot_used_[static_cast<size_t>(r)] = true;
      j->reserved_slots.push_back(r);
    }
    if (j->first_admission) j->usage.cached_tokens = matched;
    j->first_admission = false;
    running_.push_back(s);
    ++admitted_;
  }
}

// Preempts the most recently admitted running sequence (there is one: callers check).
void Scheduler::preempt_newest() {
  const BlockPool& pool = ctx_.kv().pool();
  stats_.min_pool_use_at_preemption = std::min(
      stats_.min_pool_use_at_preemption, static_cast<double>(pool.n_referenced()) / std::max(1, pool.n_blocks()));
  Seq* v = running_.back();
  running_.pop_back();
  Job* j = v->job;
  ctx_.kv().clear(v->slot);
  if (drafter_) drafter_->reset(v->slot);
  slot_used_[static_cast<size_t>(v->slot)] = false;
  for (int32_t r : j->reserved_slots) slot_used_[static_cast<size_t>(r)] = false;
  j->reserved_slots.clear();
  v->slot = -1;
  v->computed = 0;
  waiting_.push_front(v);
  ++stats_.preemptions;
}

Status Scheduler::step() {
  intake();
  admitted_ = 0;
  admit();
  if (running_.empty()) {
    jobs_.erase(std::remove_if(jobs_.begin(), jobs_.end(), [](const auto& j) { return j->live == 0; }), jobs_.end());
    publish_stats();
    return ok_status();
  }
  KvCache& kv = ctx_.kv();
  batch_.clear();
  chunks_.clear();
  const int64_t total = opts_.max_batch_tokens;
  const int64_t cap = opts_.max_prefill_tokens > 0 ? opts_.max_prefill_tokens : total;
  // Waiting prompts keep a share of every step, however many rows decode (a quarter of a small
  // budget at most, so that decoding rows are not the ones starved instead).
  const int64_t reserve = std::min({pending_prompt_tokens(), kMinPromptShare, cap, total / 4});
  int64_t budget = std::max<int64_t>(total - reserve, 1);
  // Pass 0: sequences with one token pending (decoding), oldest first; they may preempt newer
  // ones for a block. Pass 1: prompt chunks with what the budget and the pool have left, at
  // most `cap` tokens when something decodes (all of the budget when nothing does).
  for (int pass = 0; pass < 2; ++pass) {
    if (pass == 1) {
      budget = total - static_cast<int64_t>(batch_.size());
      if (!chunks_.empty()) budget = std::min(budget, cap);
    }
    for (size_t i = 0; i < running_.size() && budget > 0;) {
      Seq* s = running_[i];
      const int64_t pending = static_cast<int64_t>(s->tokens.size()) - s->computed;
      if ((pending == 1) != (pass == 0)) {
        ++i;
        continue;
      }
      int64_t n = std::min(pending, budget);
      if (pass == 0) {
        bool self_preempted = false;
        while (kv.blocks_needed(s->slot, n) > kv.pool().available()) {
          if (running_.size() == 1) {  // alone and still no room: the pool cannot hold it
            finish(*s, FinishReason::kLength);
            self_preempted = true;
            break;
          }
          self_preempted = running_.back() == s;
          preempt_newest();
          if (self_preempted) break;
        }
        if (self_preempted) continue;  // running_[i] is now the next sequence (or past the end)
      } else {
        if (kv.blocks_needed(s->slot, n) > kv.pool().available()) {  // the largest chunk that fits
          int64_t lo = 0, hi = n;
          while (lo < hi) {
            const int64_t mid = (lo + hi + 1) / 2;
            if (kv.blocks_needed(s->slot, mid) <= kv.pool().available()) {
              lo = mid;
            } else {
              hi = mid - 1;
            }
          }
          n = lo;
        }
        if (n == 0) {
          ++i;
          continue;
        }
      }
      KITE_TRY(kv.reserve(s->slot, n));
      for (int64_t k = 0; k < n; ++k) {
        const int64_t idx = s->computed + k;
        batch_.push_back({s->tokens[static_cast<size_t>(idx)], s->slot, idx + 1 == static_cast<int64_t>(s->tokens.size())});
      }
      chunks_.push_back({s, static_cast<int32_t>(n)});
      budget -= n;
      ++i;
    }
    if (pass == 0 && opts_.speculative.mode != SpecMode::kNone && !batch_.empty()) {
      if (auto st = draft_step(&budget); !st) {
        fail_all(st.error());
        return st;
      }
    }
  }
  if (batch_.empty()) {
    // Every running sequence waits for blocks held by the others: make room by preempting.
    if (running_.size() > 1) {
      preempt_newest();
    } else if (!running_.empty()) {
      finish(*running_.front(), FinishReason::kError, "the KV pool is too small for this request");
    }
    publish_stats();
    return ok_status();
  }

  StepInfo info = describe_step();
  const auto t0 = std::chrono::steady_clock::now();
  top_k_ = step_top_k();
  info.top_k = top_k_.k;
  info.whole_rows = static_cast<int32_t>(top_k_.whole_rows.size());
  info.device_draws = static_cast<int32_t>(
      std::count_if(draws_.begin(), draws_.end(), [](const RowDraw& d) { return d.temperature > 0.f; }));
  if (auto st = ctx_.decode(batch_, OutputKind::kLogits, top_k_); !st) {
    fail_all(st.error());
    return st;
  }
  info.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // Speculation's cost model: seconds per decode step against its tokens (not a shape's first).
  if (info.prompt_seqs == 0 && !ctx_.last_built_graph()) target_cost_.add(static_cast<double>(batch_.size()), info.seconds);
  ++stats_.steps;
  stats_.computed_tokens += static_cast<int64_t>(batch_.size());
  fetched_rows_ = 0;
  presample();
  size_t out = 0;
  for (const Chunk& c : chunks_) {
    Seq* s = c.seq;
    const bool first = s->generated == 0;
    if (c.n_draft > 0) {
      verify(*s, out, c.n_draft);
      out += static_cast<size_t>(c.n_draft) + 1;
    } else {
      s->computed += c.n;
      if (s->computed != static_cast<int64_t>(s->tokens.size())) continue;
      const size_t row = out++;
      if (s->job->req.params.n > 1 && !s->job->forked) {
        if (auto st = fork_choices(*s); !st) {
          finish(*s, FinishReason::kError, st.error().message);
          continue;
        }
        for (auto& c : s->job->seqs) emit_token(*c, row);
      } else {
        emit_token(*s, row);
      }
    }
    if (first && s->generated > 0) ++info.first_tokens;
  }
  // Retire finished jobs.
  jobs_.erase(std::remove_if(jobs_.begin(), jobs_.end(), [](const auto& j) { return j->live == 0; }), jobs_.end());
  publish_stats();
  if (opts_.on_step) {
    info.fetched_rows = fetched_rows_;
    info.running = stats_.running;
    info.waiting = stats_.waiting;
    info.waiting_prompt_tokens = static_cast<int32_t>(pending_prompt_tokens());
    opts_.on_step(info);
  }
  return ok_status();
}

int64_t Scheduler::pending_prompt_tokens() const {
  int64_t n = 0;
  for (const Seq* s : running_) {
    const int64_t pending = static_cast<int64_t>(s->tokens.size()) - s->computed;
    if (pending > 1) n += pending;
  }
  return n;
}

// The composition of the step in batch_/chunks_ (before it runs).
StepInfo Scheduler::describe_step() {
  StepInfo info;
  info.step = stats_.steps + 1;
  info.admitted = admitted_;
  for (const Chunk& c : chunks_) {
    const int64_t pending = static_cast<int64_t>(c.seq->tokens.size()) - c.seq->computed;
    if (pending == 1 && c.n == 1) {
      ++info.decode_rows;
      info.drafted += c.n_draft;
    } else {
      ++info.prompt_seqs;
      info.prompt_tokens += c.n;
    }
  }
  size_t outputs = 0;
  for (const BatchToken& t : batch_) outputs += t.logits ? 1 : 0;
  info.new_shape = shapes_.insert({batch_.size(), std::max<size_t>(outputs, 1)}).second;
  return info;
}

// --- speculative decoding ------------------------------------------------------------------------

// Whether a fit of a decode step's cost is usable: an extra token costing more than the step's
// fixed part is not what a decode step does (its weights are read once for all rows); such a
// fit comes from a loaded machine whose stalls fell unevenly on the step sizes.
static bool plausible(const StepCostFit& f, double* a, double* b) {
  if (!f.ready()) return false;
  f.fit(a, b);
  return *b <= *a;
}

// The options' prior, in seconds once the target has a few measured steps; each fit replaces
// its half of it when ready and plausible (nothing is measured without measure_cost).
StepCost Scheduler::step_cost() const {
  const SpeculativeOptions& so = opts_.speculative;
  const bool draft = so.mode == SpecMode::kDraft;
  StepCost c = so.cost_prior;
  if (!draft) c.draft_fixed = c.draft_per_token = 0;
  if (!so.measure_cost) return c;
  double a = 0, b = 0;
  if (plausible(target_cost_, &a, &b)) {
    const double scale = c.target_fixed > 0 ? a / c.target_fixed : 1.0;
    c.draft_fixed *= scale, c.draft_per_token *= scale;
    c.target_fixed = a;
    c.target_per_token = b;
  } else if (target_cost_.observations() >= 3) {  // one step size so far: scale the prior to it
    const double prior = c.target_fixed + c.target_per_token * target_cost_.mean_tokens();
    const double scale = prior > 0 ? target_cost_.mean_seconds() / prior : 1.0;
    c.target_fixed *= scale, c.target_per_token *= scale, c.draft_fixed *= scale, c.draft_per_token *= scale;
  } else {
    return c;  // no unit to compare the draft's seconds with yet
  }
  if (!draft) return c;
  if (plausible(draft_cost_, &a, &b)) {
    c.draft_fixed = a, c.draft_per_token = b;
  } else if (draft_cost_.observations() > 0) {  // the prior's draft/target ratio can be far off:
    // a small draft model's step costs what its layers' fixed overheads cost, not its size
    const double prior = c.draft_fixed + c.draft_per_token * draft_cost_.mean_tokens();
    const double scale = prior > 0 ? draft_cost_.mean_seconds() / prior : 1.0;
    c.draft_fixed *= scale, c.draft_per_token *= scale;
  }
  return c;
}

// After pass 0 (every decoding sequence has its pending token in batch_): chooses draft lengths,
// drafts, reserves the extra KV positions from free blocks only, and rebuilds batch_ with each
// sequence's proposals right after its pending token, all with logits.
Status Scheduler::draft_step(int64_t* budget) {
  const SpeculativeOptions& so = opts_.speculative;
  KvCache& kv = ctx_.kv();
  spec_chunks_.clear();
  rates_.clear();
  max_k_.clear();
  catch_up_.clear();
  for (size_t c = 0; c < chunks_.size(); ++c) {
    Seq* s = chunks_[c].seq;
    const GenerationParams& p = s->job->req.params;
    if (p.n > 1 && !s->job->forked) continue;  // the fork happens at this token
    const int64_t len = static_cast<int64_t>(s->tokens.size());
    int64_t cap = std::min<int64_t>(so.max_draft, p.max_tokens - s->generated - 1);
    cap = std::min(cap, kv.n_ctx() - len - 1);
    s->draft.clear();
    if (cap <= 0) continue;
    // A draft model backs off after fruitless probes (each costs draft steps and a catch-up); an
    // n-gram lookup costs nothing, so it looks every step and the plan weighs its acceptance.
    if (so.adaptive && so.mode == SpecMode::kDraft && !s->backoff.ready()) continue;
    if (so.mode == SpecMode::kNgram) {
      if (!s->ngram) s->ngram.emplace(so.ngram_min, so.ngram_max);
      s->ngram->update(s->tokens);
      cap = s->ngram->propose(s->tokens, static_cast<int32_t>(cap), s->draft.tokens);
      if (cap == 0) continue;
    }
    spec_chunks_.push_back(c);
    rates_.push_back(s->acceptance.rate());
    max_k_.push_back(static_cast<int32_t>(cap));
    if (drafter_) catch_up_.push_back(drafter_->catch_up(s->slot, s->tokens.size()));
  }
  if (spec_chunks_.empty()) return ok_status();
  k_.assign(spec_chunks_.size(), 0);
  const int32_t step_budget = static_cast<int32_t>(std::min<int64_t>(so.max_step_drafts, *budget));
  if (so.adaptive) {
    plan_draft_lengths(rates_, max_k_, static_cast<int64_t>(batch_.size()), step_cost(), step_budget, k_, catch_up_);
  } else {
    int32_t left = step_budget;
    for (size_t i = 0; i < k_.size(); ++i) left -= k_[i] = std::min(max_k_[i], std::max(left, 0));
  }
  if (drafter_) {
    items_.clear();
    for (size_t i = 0; i < spec_chunks_.size(); ++i) {
      if (k_[i] == 0) continue;
      Seq* s = chunks_[spec_chunks_[i]].seq;
      if (!s->draft_sampler) {
        SamplerParams dp = s->sampler.params();  // this choice's params (its own seed), without history
        dp.repeat_penalty = 1.f, dp.frequency_penalty = 0.f, dp.presence_penalty = 0.f, dp.n_logprobs = 0;
        dp.seed = dp.seed * 0x9e3779b97f4a7c15ull + 1;
        s->draft_sampler.emplace(dp);
      }
      items_.push_back({s->slot, s->tokens, k_[i], &*s->draft_sampler, &s->draft});
    }
    if (!items_.empty()) {
      SpecStats ds;
      KITE_TRY(drafter_->propose(items_, ds));
      stats_.draft_steps += ds.draft_steps;
      for (const DraftModel::StepTime& t : drafter_->last_steps())
        draft_cost_.add(static_cast<double>(t.tokens), t.seconds);
    }
  }
  // Rebuild the batch: pending token, then the proposals that fit in free blocks.
  batch_.clear();
  int64_t drafted = 0;
  size_t next = 0;
  for (size_t c = 0; c < chunks_.size(); ++c) {
    Chunk& ch = chunks_[c];
    Seq* s = ch.seq;
    batch_.push_back({s->tokens.back(), s->slot, true});
    if (next >= spec_chunks_.size() || spec_chunks_[next] != c) continue;
    const int32_t want = k_[next++];
    int64_t k = std::min<int64_t>(want, static_cast<int64_t>(s->draft.tokens.size()));
    while (k > 0 && kv.blocks_needed(s->slot, 1 + k) > kv.pool().available()) --k;
    if (k == 0) {
      // A planned draft that came back empty (the draft model was unsure) cost a draft step
      // for nothing: count it as a failed trial so the policy backs off.
      if (want > 0 && s->draft.tokens.empty()) {
        s->acceptance.record(1, 0);
        s->backoff.record(0, so.backoff_cap);
      } else {
        s->acceptance.idle_step();
      }
      s->draft.clear();
      continue;
    }
    KITE_TRY(kv.reserve(s->slot, 1 + k));
    s->draft.tokens.resize(static_cast<size_t>(k));
    if (!s->draft.q.empty()) s->draft.q.resize(static_cast<size_t>(k));
    for (int32_t t : s->draft.tokens) batch_.push_back({t, s->slot, true});
    ch.n_draft = static_cast<int32_t>(k);
    drafted += k;
  }
  if (drafted > 0) ++stats_.spec_steps;
  *budget -= drafted;
  return ok_status();
}

// Verifies a sequence's proposals against the target's logits rows row..row+n_draft and emits
// the accepted tokens plus one more (a replacement or the bonus), then rolls the KV back.
void Scheduler::verify(Seq& s, size_t row, int32_t n_draft) {
  const bool greedy = s.sampler.params().temperature <= 0.f;
  // N-gram proposals are certain (one-hot q): the row's own sample is exactly the rejection
  // rule's outcome (accepted with probability p(x); else drawn from p without x), so their rows
  // sample as any row does (drawn on the device, from the top k, fetched). A draft model's
  // proposals need the rows' distributions.
  const bool one_hot = s.draft.q.empty();
  const int64_t first = s.computed;  // the pending token's position
  int32_t accepted = 0, sampled = 0;
  for (int32_t j = 0; j <= n_draft && !s.done; ++j) {
    const bool bonus = j == n_draft;
    const int32_t x = bonus ? -1 : s.draft.tokens[static_cast<size_t>(j)];
    const size_t r = row + static_cast<size_t>(j);
    int32_t token = -1;
    bool ok = false;
    if (greedy || one_hot) {
      auto t = sample_output(s, r);
      if (!t) {
        finish(s, FinishReason::kError, t.error().message);
        break;
      }
      token = *t;
      ok = !bonus && token == x;
      ++sampled;
    } else {
      // The row's top logits (step_top_k: a top-k, without a grammar or penalties), or the whole row.
      const bool from_top = top_k_.k > 0 && !ctx_.has_logits(r);
      const TopLogits top = from_top ? ctx_.top_logits(r) : TopLogits{};
      if (!from_top) {
        const std::span<const float> l = ctx_.logits(r);
        logits_.assign(l.begin(), l.end());
        if (s.grammar) s.grammar->apply(logits_);
      }
      if (from_top ? s.sampler.distribution_from_top(top, dist_) : s.sampler.distribution_in_place(logits_, dist_)) {
        if (bonus) {
          token = s.sampler.draw(dist_);
        } else {
          const double u_accept = s.sampler.uniform(), u_draw = s.sampler.uniform();
          const Verdict v = verify_proposal(dist_, x, s.draft.q[static_cast<size_t>(j)], u_accept, u_draw, scratch_);
          token = v.token;
          ok = v.accepted;
        }
        if (from_top) s.sampler.set_chosen(token, top);
        else s.sampler.set_chosen(token, logits_);
      }
    }
    if (token < 0) {
      finish(s, FinishReason::kError, "no token is allowed (the grammar and the logit bias exclude them all)");
      break;
    }
    if (!emit(s, token) || !ok) break;
    ++accepted;
  }
  // Plain temperature sampling takes a uniform for every row, used or not: a step that draws the
  // rows on the device took them all before it (step_top_k).
  const bool drawn = !draws_.empty() && draws_[row].temperature > 0.f;
  if (one_hot && !drawn && s.sampler.draws_on_device(std::numeric_limits<int32_t>::max(), ctx_.model().hparams().n_vocab))
    for (; sampled <= n_draft; ++sampled) (void)s.sampler.uniform();
  stats_.drafted += n_draft;
  stats_.accepted += accepted;
  s.acceptance.record(n_draft, accepted);
  if (opts_.speculative.adaptive && opts_.speculative.mode == SpecMode::kDraft)
    s.backoff.record(accepted, opts_.speculative.backoff_cap);  // a probe
  if (s.done) return;  // finish() released both caches
  // tokens = ..., pending, accepted proposals, the new pending token: positions up to the
  // accepted ones are in the KV, the rest of the proposals are not part of the sequence.
  s.computed = first + 1 + accepted;
  ctx_.kv().truncate(s.slot, s.computed);
  if (drafter_) drafter_->rollback(s.slot, std::span<const int32_t>(s.tokens).first(static_cast<size_t>(s.computed)));
}

Status Scheduler::fork_choices(Seq& s) {
  Job* j = s.job;
  const GenerationParams& p = j->req.params;
  for (int32_t c = 1; c < p.n; ++c) {
    const int32_t slot = j->reserved_slots[static_cast<size_t>(c - 1)];
    KITE_TRY(ctx_.kv().fork(s.slot, slot));
    GenerationParams cp = p;
    cp.sampling.seed = p.sampling.seed + static_cast<uint64_t>(c);  // independent draws
    auto seq = std::make_unique<Seq>(j, c, tok_.get(), cp);
    seq->tokens = s.tokens;
    seq->sampler.accept_prompt(seq->tokens);
    seq->computed = s.computed;
    seq->slot = slot;
    if (s.grammar) seq->grammar = *s.grammar;  // same state (nothing generated yet); shares its cache
    running_.push_back(seq.get());
    j->seqs.push_back(std::move(seq));
  }
  j->reserved_slots.clear();
  j->forked = true;
  return ok_status();
}

bool Scheduler::emit(Seq& s, int32_t token) {
  const GenerationParams& p = s.job->req.params;
  s.sampler.accept(token);
  ++s.generated;
  ++s.job->usage.completion_tokens;
  ++stats_.generated_tokens;

  StreamEvent ev;
  ev.request = s.job->id;
  ev.choice = s.choice;
  ev.token = token;
  if (p.sampling.n_logprobs > 0) {
    ev.logprob = s.sampler.chosen_logprob();
    const auto top = s.sampler.top_logprobs();
    ev.top_logprobs.assign(top.begin(), top.end());
  }
  const bool stop_token = (!p.ignore_eos && tok_ && tok_->is_eog(token)) ||
                          std::find(p.stop_tokens.begin(), p.stop_tokens.end(), token) != p.stop_tokens.end();
  FinishReason reason = FinishReason::kNone;
  if (stop_token) {
    reason = FinishReason::kStop;
  } else {
    if (s.grammar && !s.grammar->accept(token)) reason = FinishReason::kError;  // cannot happen: masked
    if (s.decoder) ev.text = s.stop.push(s.decoder->push(token));
    if (s.stop.stopped()) {
      reason = FinishReason::kStop;
    } else if (s.grammar && s.grammar->done()) {
      reason = FinishReason::kStop;
    } else if (s.generated >= p.max_tokens || static_cast<int64_t>(s.tokens.size()) + 1 >= ctx_.kv().n_ctx()) {
      reason = FinishReason::kLength;
    }
  }
  if (reason == FinishReason::kNone) {
    s.tokens.push_back(token);
    if (s.job->req.on_event) s.job->req.on_event(ev);
    return true;
  }
  if (s.decoder && !s.stop.stopped()) {  // what the decoder and the stop matcher held back is final now
    ev.text += s.stop.push(s.decoder->flush());
    ev.text += s.stop.flush();
  }
  ev.finished = true;
  ev.reason = reason;
  s.done = true;
  if (s.job->req.on_event) s.job->req.on_event(ev);
  finish(s, reason);
  return false;
}

void Scheduler::finish(Seq& s, FinishReason reason, const std::string& error) {
  Job* j = s.job;
  const bool announced = s.done;  // emit_token already sent the final event
  s.done = true;
  if (s.slot >= 0) {
    ctx_.kv().clear(s.slot);
    if (drafter_) drafter_->reset(s.slot);
    slot_used_[static_cast<size_t>(s.slot)] = false;
    s.slot = -1;
  }
  running_.erase(std::remove(running_.begin(), running_.end(), &s), running_.end());
  waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), &s), waiting_.end());
  auto send_final = [&](int32_t choice) {
    if (!j->req.on_event) return;
    StreamEvent ev;
    ev.request = j->id;
    ev.choice = choice;
    ev.finished = true;
    ev.reason = reason;
    ev.error = error;
    j->req.on_event(ev);
  };
  if (!announced) send_final(s.choice);
  --j->live;
  if (!j->forked && j->req.params.n > 1) {
    // The other choices never started: they end with this one.
    for (int32_t r : j->reserved_slots) slot_used_[static_cast<size_t>(r)] = false;
    j->reserved_slots.clear();
    for (int32_t c = 1; c < j->req.params.n; ++c) send_final(c);
    j->live = 0;
  }
  if (j->live == 0) {
    j->usage.prompt_tokens = j->n_prompt;
    if (j->req.on_done) j->req.on_done(j->usage);
  }
}

void Scheduler::fail_all(const Error& e) {
  while (!running_.empty()) finish(*running_.front(), FinishReason::kError, e.message);
}

Status Scheduler::run_until_idle() {
  while (!idle()) KITE_TRY(step());
  return ok_status();
}

}  // namespace kite

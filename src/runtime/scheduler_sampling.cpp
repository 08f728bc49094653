// How a step's output rows become tokens: whether they come back as their top logits (and
// draws) from the device, sampling them on a team of threads, and emitting each sequence's token.
#include <algorithm>
#include <atomic>
#include <thread>

#include "src/runtime/scheduler.h"
#include "src/runtime/scheduler_internal.h"

namespace kite {

// Rows come back as their top logits when every row that samples can sample from them (the
// best one when all are greedy without logprobs, else top_k_outputs: two sizes, few graphs),
// and plain draws from whole rows are made there (draws_: one per output row, with uniforms
// taken from the rows' RNGs now, where the chain would take them after the step).
OutputTopK Scheduler::step_top_k() {
  draws_.clear();
  if (opts_.top_k_outputs <= 0) return {};
  OutputTopK top{1, false};
  const int32_t n_vocab = ctx_.model().hparams().n_vocab;
  bool draw = false;
  for (const Chunk& c : chunks_) {
    const Seq* s = c.seq;
    const SamplerParams& p = s->sampler.params();
    const bool last = s->computed + c.n == static_cast<int64_t>(s->tokens.size());
    if ((c.n_draft == 0 && !last) || s->done) continue;
    if (s->grammar || (c.n_draft > 0 && p.temperature > 0.f)) return {};  // (verify: whole rows)
    if (s->sampler.samples_from_top(opts_.top_k_outputs, n_vocab)) {
      if (p.temperature > 0.f || p.n_logprobs > 0) top.k = opts_.top_k_outputs;
      top.log_sum_exp |= p.n_logprobs > 0;
    } else if (draws_supported_ && s->sampler.draws_on_device(n_vocab) &&
               (s->job->req.params.n == 1 || s->job->forked)) {  // (a prompt about to fork: one row, n draws)
      draw = true;
    } else {
      return {};
    }
  }
  if (!draw) return top;
  for (const Chunk& c : chunks_) {  // one entry per output row, as step() walks them
    Seq* s = c.seq;
    if (c.n_draft > 0) {
      draws_.resize(draws_.size() + static_cast<size_t>(c.n_draft) + 1);
    } else if (s->computed + c.n == static_cast<int64_t>(s->tokens.size())) {
      const bool here = !s->done && s->sampler.draws_on_device(n_vocab);
      draws_.push_back(here ? RowDraw{s->sampler.params().temperature, s->sampler.uniform()} : RowDraw{});
    }
  }
  top.draws = draws_;
  return top;
}

void Scheduler::presample() {
  presampled_.clear();
  presampled_next_ = 0;
  size_t out = 0;  // the rows as step() walks them
  for (const Chunk& c : chunks_) {
    const Seq* s = c.seq;
    if (c.n_draft > 0) {
      out += static_cast<size_t>(c.n_draft) + 1;
      continue;
    }
    if (s->computed + c.n != static_cast<int64_t>(s->tokens.size())) continue;
    const size_t row = out++;
    // (Forking choices share the row, and a grammar's matcher is not for other threads.)
    if (s->done || s->grammar || (s->job->req.params.n > 1 && !s->job->forked)) continue;
    presampled_.push_back({c.seq, row, -1});
  }
  int threads = opts_.sampling_threads;
  if (threads <= 0) threads = static_cast<int>(std::min(8u, std::max(1u, std::thread::hardware_concurrency())));
  const int64_t floats = static_cast<int64_t>(presampled_.size()) * ctx_.model().hparams().n_vocab;
  // (Top-k rows are a few candidates each: nothing to share out.)
  if (threads <= 1 || presampled_.size() < 2 || floats < opts_.parallel_sampling_floats || top_k_.k > 0) {
    presampled_.clear();
    return;
  }
  if (!sampling_team_ || sampling_team_->size() != threads) sampling_team_ = std::make_unique<ThreadTeam>(threads);
  std::atomic<size_t> next{0};
  sampling_team_->run([&](int) {
    for (size_t i = next++; i < presampled_.size(); i = next++) {
      Presampled& p = presampled_[i];
      p.token = p.seq->sampler.sample(ctx_.logits(p.row));
    }
  });
}

void Scheduler::emit_token(Seq& s, size_t row) {
  int32_t token = -1;
  if (presampled_next_ < presampled_.size() && presampled_[presampled_next_].seq == &s) {
    token = presampled_[presampled_next_++].token;
  } else if (s.done) {
    return;
  } else if (top_k_.k > 0) {
    const TopLogits top = ctx_.top_logits(row);
    token = !draws_.empty() && draws_[row].temperature > 0.f ? top.drawn : s.sampler.sample_top(top);
  } else if (s.grammar) {  // the grammar masks a copy; otherwise the row is read where it is
    const std::span<const float> logits = ctx_.logits(row);
    logits_.assign(logits.begin(), logits.end());
    s.grammar->apply(logits_);
    token = s.sampler.sample_in_place(logits_);
  } else {
    token = s.sampler.sample(ctx_.logits(row));  // (copies only to apply penalties or a logit bias)
  }
  if (s.done) return;
  if (token < 0) {
    finish(s, FinishReason::kError, "no token is allowed (the grammar and the logit bias exclude them all)");
    return;
  }
  emit(s, token);
}

}  // namespace kite

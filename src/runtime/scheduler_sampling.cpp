// How a step's output rows become tokens: whether they come back as their top logits (and
// draws) from the device, sampling them on a team of threads, and emitting each sequence's token.
#include <algorithm>
#include <atomic>
#include <thread>

#include "src/runtime/scheduler.h"
#include "src/runtime/scheduler_internal.h"

namespace kite {

// Rows come back as their top logits when the rows that sample can sample from them (the best
// one when all are greedy without logprobs, else top_k_outputs: two sizes, few graphs), and
// plain draws from whole rows are made there (draws_: one per output row, with uniforms taken
// from the rows' RNGs now, where the chain would take them after the step); speculative
// proposals are verified from them too (certain ones, n-gram or a draft model's greedy ones, by
// the rows' own samples, so any way a row samples serves them). Rows whose sampler may find its
// candidates among them (Sampler::may_sample_from_top: top-p or min-p alone, a grammar,
// penalties that only lower logits) come back as their top logits as well, and the few whose
// candidates reach past them are fetched after the step (presample_top: together; verify rows:
// sample_output). Rows that need their whole logits (logprobs with a grammar or penalties, a
// draft model's sampled proposal beyond a top-k, a prompt about to fork whose choices draw) come
// back whole beside them (whole_rows_), unless they are most of the step: then every row does.
OutputTopK Scheduler::step_top_k() {
  draws_.clear();
  whole_rows_.clear();
  chunk_rows_.clear();
  if (opts_.top_k_outputs <= 0) return {};
  OutputTopK top;
  top.k = 1;
  const int32_t n_vocab = ctx_.model().hparams().n_vocab;
  bool draw = false;
  int32_t rows = 0;  // output rows, as step() walks them
  for (const Chunk& c : chunks_) {
    const Seq* s = c.seq;
    const SamplerParams& p = s->sampler.params();
    const bool last = s->computed + c.n == static_cast<int64_t>(s->tokens.size());
    const int32_t n_rows = c.n_draft > 0 ? c.n_draft + 1 : last ? 1 : 0;
    RowsFrom from = RowsFrom::kTop;  // (also for no row, or a finished sequence's)
    if (n_rows > 0 && !s->done) {
      const bool grammar = s->grammar.has_value();
      // Rows verified by their own sample (n-gram proposals: verify) sample like any row; a draft
      // model's proposals need the rows' distributions.
      const bool one_hot = c.n_draft == 0 || s->draft.q.empty();
      if (!grammar && s->sampler.samples_from_top(opts_.top_k_outputs, n_vocab)) {
        if (p.temperature > 0.f || p.n_logprobs > 0) top.k = opts_.top_k_outputs;
        top.log_sum_exp |= p.n_logprobs > 0;
      } else if (one_hot && s->sampler.may_sample_from_top(opts_.top_k_outputs, n_vocab, grammar)) {
        top.k = opts_.top_k_outputs;  // (the row is fetched if the top k are not enough)
        top.log_sum_exp |= p.n_logprobs > 0 || p.temperature > 0.f;
      } else if (!grammar && one_hot && draws_supported_ && s->sampler.draws_on_device(opts_.top_k_outputs, n_vocab) &&
                 (s->job->req.params.n == 1 || s->job->forked)) {  // (a prompt about to fork: one row, n draws)
        from = RowsFrom::kDraw;
        draw = true;
        if (p.n_logprobs > 0) top.k = opts_.top_k_outputs, top.log_sum_exp = true;
      } else {
        from = RowsFrom::kWhole;
      }
    }
    if (from == RowsFrom::kWhole)
      for (int32_t j = 0; j < n_rows; ++j) whole_rows_.push_back(rows + j);
    rows += n_rows;
    chunk_rows_.push_back(from);
  }
  if (2 * static_cast<int32_t>(whole_rows_.size()) > rows) {
    whole_rows_.clear();
    return {};
  }
  top.whole_rows = whole_rows_;
  if (!draw) return top;
  for (size_t i = 0; i < chunks_.size(); ++i) {  // one entry per output row, as step() walks them
    const Chunk& c = chunks_[i];
    Seq* s = c.seq;
    const bool here = chunk_rows_[i] == RowsFrom::kDraw;
    const int32_t n_rows = c.n_draft > 0 ? c.n_draft + 1 : s->computed + c.n == static_cast<int64_t>(s->tokens.size());
    for (int32_t j = 0; j < n_rows; ++j)  // (proposals: a uniform for every row, used or not: verify)
      draws_.push_back(here ? RowDraw{s->sampler.params().temperature, s->sampler.uniform()} : RowDraw{});
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
    // (Forking choices share the row, and a grammar's matcher is not for other threads: whole
    // rows with one are sampled in turn.)
    if (s->done || (s->job->req.params.n > 1 && !s->job->forked)) continue;
    const bool drawn = !draws_.empty() && draws_[row].temperature > 0.f;
    if (top_k_.k > 0 ? ctx_.has_logits(row) || drawn : s->grammar.has_value())
      continue;  // (top-k steps: rows drawn on the device or whole are taken in turn)
    presampled_.push_back({c.seq, row, -1});
  }
  int threads = opts_.sampling_threads;
  if (threads <= 0) threads = static_cast<int>(std::min(8u, std::max(1u, std::thread::hardware_concurrency())));
  if (top_k_.k > 0) {
    presample_top(threads);
    return;
  }
  const int64_t floats = static_cast<int64_t>(presampled_.size()) * ctx_.model().hparams().n_vocab;
  if (threads <= 1 || presampled_.size() < 2 || floats < opts_.parallel_sampling_floats) {
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

// A top-k step's rows sample from their top logits here, before any is emitted (one row per
// sequence: nothing emitted changes another's sample), so that the rows whose candidates reach
// past them are fetched with one download and sampled on the team, not one by one.
void Scheduler::presample_top(int threads) {
  fetch_rows_.clear();
  fetch_entries_.clear();
  for (size_t i = 0; i < presampled_.size(); ++i) {
    Presampled& p = presampled_[i];
    Seq& s = *p.seq;
    const TopLogits top = ctx_.top_logits(p.row);
    p.token = s.grammar ? s.sampler.sample_top(top, [&s](int32_t t) { return s.grammar->accepts(t); })
                        : s.sampler.sample_top(top);
    if (p.token != Sampler::kNeedsRow) continue;
    fetch_rows_.push_back(p.row);
    fetch_entries_.push_back(i);
  }
  if (fetch_rows_.empty()) return;
  if (!ctx_.fetch_logits(fetch_rows_)) {  // (emit_token fetches them again, and reports why)
    std::erase_if(presampled_, [](const Presampled& p) { return p.token == Sampler::kNeedsRow; });
    return;
  }
  fetched_rows_ += static_cast<int32_t>(fetch_rows_.size());
  auto sample = [this](Presampled& p) { p.token = sample_row(*p.seq, *ctx_.fetch_logits(p.row)); };
  // A grammar masks a shared copy: those rows here, in turn; the rest on the team.
  std::erase_if(fetch_entries_, [&](size_t i) {
    if (!presampled_[i].seq->grammar) return false;
    sample(presampled_[i]);
    return true;
  });
  const int64_t floats = static_cast<int64_t>(fetch_entries_.size()) * ctx_.model().hparams().n_vocab;
  if (threads <= 1 || fetch_entries_.size() < 2 || floats < opts_.parallel_sampling_floats) {
    for (size_t i : fetch_entries_) sample(presampled_[i]);
    return;
  }
  if (!sampling_team_ || sampling_team_->size() != threads) sampling_team_ = std::make_unique<ThreadTeam>(threads);
  std::atomic<size_t> next{0};
  sampling_team_->run([&](int) {
    for (size_t j = next++; j < fetch_entries_.size(); j = next++) sample(presampled_[fetch_entries_[j]]);
  });
}

void Scheduler::emit_token(Seq& s, size_t row) {
  int32_t token = -1;
  if (presampled_next_ < presampled_.size() && presampled_[presampled_next_].seq == &s) {
    token = presampled_[presampled_next_++].token;
  } else if (s.done) {
    return;
  } else {
    auto sampled = sample_output(s, row);
    if (!sampled) {
      finish(s, FinishReason::kError, sampled.error().message);
      return;
    }
    token = *sampled;
  }
  if (token < 0) {
    finish(s, FinishReason::kError, "no token is allowed (the grammar and the logit bias exclude them all)");
    return;
  }
  emit(s, token);
}

Result<int32_t> Scheduler::sample_output(Seq& s, size_t row) {
  if (top_k_.k == 0 || ctx_.has_logits(row)) return sample_row(s, ctx_.logits(row));
  const TopLogits top = ctx_.top_logits(row);
  if (!draws_.empty() && draws_[row].temperature > 0.f) return s.sampler.take_drawn(top);
  const int32_t token = s.grammar ? s.sampler.sample_top(top, [&s](int32_t t) { return s.grammar->accepts(t); })
                                  : s.sampler.sample_top(top);
  if (token != Sampler::kNeedsRow) return token;
  KITE_ASSIGN_OR_RETURN(const std::span<const float> logits, ctx_.fetch_logits(row));  // (past the top k)
  ++fetched_rows_;
  return sample_row(s, logits);
}

int32_t Scheduler::sample_row(Seq& s, std::span<const float> logits) {
  if (!s.grammar) return s.sampler.sample(logits);  // (copies only to apply penalties or a logit bias)
  logits_.assign(logits.begin(), logits.end());     // the grammar masks a copy
  s.grammar->apply(logits_);
  return s.sampler.sample_in_place(logits_);
}

}  // namespace kite

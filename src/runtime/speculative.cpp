#include "src/runtime/speculative.h"

#include <algorithm>
#include <chrono>
#include <cmath>

namespace kite {

const char* spec_mode_name(SpecMode m) {
  switch (m) {
    case SpecMode::kNone:
      return "none";
    case SpecMode::kDraft:
      return "draft";
    case SpecMode::kNgram:
      return "ngram";
  }
  return "none";
}

Result<SpecMode> parse_spec_mode(std::string_view name) {
  if (name == "none") return SpecMode::kNone;
  if (name == "draft") return SpecMode::kDraft;
  if (name == "ngram") return SpecMode::kNgram;
  return make_error_code(ErrorCode::kInvalidArgument, "speculative mode must be none, draft or ngram, got '",
                         std::string(name), "'");
}

Status SpeculativeOptions::validate() const {
  if (max_draft < 1 || max_draft > 64) return make_error("max_draft must be in [1, 64], got ", max_draft);
  if (!(p_min >= 0.f && p_min <= 1.f)) return make_error("p_min must be in [0, 1], got ", p_min);
  if (ngram_min < 1 || ngram_max < ngram_min || ngram_max > 16)
    return make_error("ngram sizes must satisfy 1 <= ngram_min <= ngram_max <= 16, got ", ngram_min, "..", ngram_max);
  if (max_step_drafts < 1) return make_error("max_step_drafts must be >= 1, got ", max_step_drafts);
  if (backoff_cap < 1) return make_error("backoff_cap must be >= 1, got ", backoff_cap);
  if (draft_window < 0) return make_error("draft_window must be >= 0, got ", draft_window);
  return ok_status();
}

// --- verification --------------------------------------------------------------------------------

Verdict verify_proposal(std::span<const TokenProb> p, int32_t x, std::span<const TokenProb> q, double u_accept,
                        double u_draw, std::vector<TokenProb>& scratch) {
  auto prob_in = [](std::span<const TokenProb> d, int32_t t) {
    for (const TokenProb& e : d)
      if (e.token == t) return static_cast<double>(e.prob);
    return 0.0;
  };
  const double px = prob_in(p, x);
  const double qx = q.empty() ? 1.0 : prob_in(q, x);
  // x was drawn from q, so qx > 0; a zero (a caller's rounding) accepts whatever p allows.
  if (qx > 0 ? u_accept * qx < px : px > 0) return {x, true};

  // normalize(max(0, p - q)): both sorted by token and merged.
  thread_local std::vector<TokenProb> qs;
  scratch.assign(p.begin(), p.end());
  auto by_token = [](const TokenProb& a, const TokenProb& b) { return a.token < b.token; };
  std::sort(scratch.begin(), scratch.end(), by_token);
  if (q.empty()) {
    qs.assign(1, TokenProb{x, 1.f});
  } else {
    qs.assign(q.begin(), q.end());
    std::sort(qs.begin(), qs.end(), by_token);
  }
  double total = 0;
  size_t j = 0;
  for (TokenProb& e : scratch) {
    while (j < qs.size() && qs[j].token < e.token) ++j;
    const float qy = j < qs.size() && qs[j].token == e.token ? qs[j].prob : 0.f;
    e.prob = std::max(0.f, e.prob - qy);
    total += e.prob;
  }
  if (!(total > 0)) return {draw_from(p, u_draw), false};
  const int32_t t = draw_from(scratch, u_draw);
  return {t, t == x};  // t == x cannot happen (its residual is 0) but is reported honestly
}

// --- n-gram lookup -------------------------------------------------------------------------------

NgramIndex::NgramIndex(int32_t n_min, int32_t n_max)
    : n_min_(n_min), n_max_(n_max), maps_(static_cast<size_t>(std::max(0, n_max - n_min + 1))) {}

uint64_t NgramIndex::hash(std::span<const int32_t> gram) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (int32_t t : gram) {
    h ^= static_cast<uint32_t>(t);
    h *= 0x100000001b3ull;
    h ^= h >> 29;
  }
  return h;
}

void NgramIndex::update(std::span<const int32_t> tokens) {
  if (tokens.size() < indexed_) reset();  // a different sequence: start over
  // An n-gram ending at e - 1 is indexed once its continuation tokens[e] exists.
  for (size_t e = std::max<size_t>(indexed_, 1); e < tokens.size(); ++e)
    for (int32_t n = n_min_; n <= n_max_; ++n) {
      const size_t un = static_cast<size_t>(n);
      if (e < un) break;
      auto [it, fresh] = maps_[static_cast<size_t>(n - n_min_)].try_emplace(hash(tokens.subspan(e - un, un)));
      Entry& entry = it->second;
      // A different continuation (or a hash collision, which only costs proposals) makes the
      // n-gram ambiguous for good.
      if (!fresh && tokens[static_cast<size_t>(entry.next)] != tokens[e]) entry.ambiguous = true;
      entry.next = static_cast<int32_t>(e);
    }
  indexed_ = std::max(indexed_, tokens.size());
}

int32_t NgramIndex::propose(std::span<const int32_t> tokens, int32_t max, std::vector<int32_t>& out) const {
  const size_t size = tokens.size();
  for (int32_t n = n_max_; n >= n_min_ && max > 0; --n) {
    const size_t un = static_cast<size_t>(n);
    if (size < un + 1) continue;
    const auto& map = maps_[static_cast<size_t>(n - n_min_)];
    const std::span<const int32_t> suffix = tokens.subspan(size - un, un);
    auto it = map.find(hash(suffix));
    if (it == map.end()) continue;
    const size_t e = static_cast<size_t>(it->second.next);
    if (e < un || e >= size ||
        !std::equal(suffix.begin(), suffix.end(), tokens.begin() + static_cast<ptrdiff_t>(e - un)))
      continue;  // a hash collision
    // The longest match decides: when it is ambiguous, so is every shorter one.
    if (it->second.ambiguous) return 0;
    const size_t limit = n == n_max_ ? static_cast<size_t>(max) : std::min(static_cast<size_t>(max), un);
    size_t j = 0;
    for (; j < limit && e + j < size; ++j) {
      if (j > 0) {  // the context of position e + j: the n-gram ending at e + j - 1
        auto c = map.find(hash(tokens.subspan(e + j - un, un)));
        if (c != map.end() && c->second.ambiguous) break;
      }
      out.push_back(tokens[e + j]);
    }
    return static_cast<int32_t>(j);
  }
  return 0;
}

void NgramIndex::reset() {
  for (auto& m : maps_) m.clear();
  indexed_ = 0;
}

// --- draft model ---------------------------------------------------------------------------------

std::vector<int32_t>& DraftModel::seen(int32_t slot) {
  const size_t n = static_cast<size_t>(ctx_.kv().n_seqs());
  if (seen_.size() < n) seen_.resize(n), offset_.resize(n, 0);
  return seen_[static_cast<size_t>(slot)];
}

int64_t DraftModel::catch_up(int32_t slot, size_t n_tokens) const {
  const auto i = static_cast<size_t>(slot);
  const size_t held = i < seen_.size() ? seen_[i].size() : 0, off = i < offset_.size() ? offset_[i] : 0;
  int64_t behind = static_cast<int64_t>(n_tokens) - static_cast<int64_t>(off + held);
  if (opts_.draft_window > 0 && (held > 0 || off > 0)) behind = std::min<int64_t>(behind, opts_.draft_window);
  return std::max<int64_t>(behind, 1);
}

void DraftModel::reset(int32_t slot) {
  ctx_.kv().clear(slot);
  seen(slot).clear();
  offset_[static_cast<size_t>(slot)] = 0;
}

void DraftModel::rollback(int32_t slot, std::span<const int32_t> tokens) {
  std::vector<int32_t>& held = seen(slot);
  const size_t off = offset_[static_cast<size_t>(slot)];
  if (off > 0 && tokens.size() <= off) {  // the window starts past the sequence's end
    reset(slot);
    return;
  }
  tokens = tokens.subspan(off);
  const size_t len = std::min(held.size(), tokens.size());
  size_t common = 0;
  while (common < len && held[common] == tokens[common]) ++common;
  if (common < held.size()) {
    ctx_.kv().truncate(slot, static_cast<int64_t>(common));
    held.resize(common);
  }
}

size_t DraftModel::sync(int32_t slot, std::span<const int32_t> tokens) {
  rollback(slot, tokens);
  std::vector<int32_t>& held = seen(slot);
  size_t& off = offset_[static_cast<size_t>(slot)];
  const size_t window = static_cast<size_t>(std::max(0, opts_.draft_window));
  // Far behind (after a back-off): restart from the last `window` tokens. A slot that holds
  // nothing yet (a new sequence) takes its whole prompt, as far as the prefix cache has it.
  const bool started = !held.empty() || off > 0;
  if (window > 0 && started && tokens.size() - off - held.size() > window) {
    ctx_.kv().clear(slot);
    held.clear();
    off = tokens.size() - window;
  }
  if (held.empty()) {
    const std::span<const int32_t> view = tokens.subspan(off);
    const int64_t m = ctx_.kv().match_prefix(slot, view);
    held.assign(view.begin(), view.begin() + m);
  }
  return off;
}

namespace {

// The probability of the most likely token at temperature 1: the draft's confidence.
float top_prob(std::span<const float> logits) {
  float m = -INFINITY;
  for (float v : logits) m = std::max(m, v);
  if (!(m > -INFINITY)) return 0.f;
  double z = 0;
  for (float v : logits) z += std::exp(static_cast<double>(v - m));
  return static_cast<float>(1.0 / z);
}

constexpr int64_t kDraftChunk = 512;  // catch-up tokens per draft step at most

}  // namespace

Status DraftModel::propose(std::span<Item> items, SpecStats& stats) {
  KvCache& kv = ctx_.kv();
  last_steps_.clear();
  // Per item: the next index of `tokens` to feed (catch-up), or tokens.size() when caught up.
  first_.assign(items.size(), 0);
  active_.clear();
  int32_t blocks_left = kv.pool().available();
  for (size_t i = 0; i < items.size(); ++i) {
    Item& it = items[i];
    it.out->clear();
    if (it.k <= 0 || it.tokens.empty()) continue;
    it.tokens = it.tokens.subspan(sync(it.slot, it.tokens));  // from here on, the draft's view
    std::vector<int32_t>& held = seen(it.slot);
    if (held.size() >= it.tokens.size()) {  // the last token is fed again for its logits
      kv.truncate(it.slot, static_cast<int64_t>(it.tokens.size()) - 1);
      held.resize(it.tokens.size() - 1);
    }
    const int64_t feed = static_cast<int64_t>(it.tokens.size()) - kv.seq_len(it.slot);
    it.k = static_cast<int32_t>(std::min<int64_t>(it.k, kv.n_ctx() - static_cast<int64_t>(it.tokens.size())));
    const int32_t need = kv.blocks_needed(it.slot, feed + it.k);
    if (it.k <= 0 || need > blocks_left) continue;  // no room: no proposals (never take others' blocks)
    blocks_left -= need;
    first_[i] = kv.seq_len(it.slot);
    active_.push_back(static_cast<int32_t>(i));
  }
  std::vector<int32_t> want_logits;
  while (!active_.empty()) {
    batch_.clear();
    want_logits.clear();
    int64_t room = kDraftChunk;
    for (int32_t i : active_) {
      Item& it = items[static_cast<size_t>(i)];
      int64_t& next = first_[static_cast<size_t>(i)];
      const int64_t size = static_cast<int64_t>(it.tokens.size());
      if (next < size) {
        const int64_t n = std::min(size - next, std::max<int64_t>(room, 1));
        for (int64_t j = 0; j < n; ++j)
          batch_.push_back({it.tokens[static_cast<size_t>(next + j)], it.slot, next + j + 1 == size});
        next += n;
        room -= n;
        if (next == size) want_logits.push_back(i);
      } else {
        batch_.push_back({it.out->tokens.back(), it.slot, true});
        want_logits.push_back(i);
      }
    }
    // Rows of greedy proposals come back as their best logit and log-sum-exp (the draft's
    // confidence), unless a logit bias moves the best; rows drawn from come back whole.
    if (top_k_ < 0) top_k_ = ctx_.supports_top_k() ? 1 : 0;
    whole_rows_.clear();
    for (size_t o = 0; o < want_logits.size(); ++o) {
      const SamplerParams& p = items[static_cast<size_t>(want_logits[o])].sampler->params();
      if (opts_.sample_drafts || !p.logit_bias.empty()) whole_rows_.push_back(static_cast<int32_t>(o));
    }
    OutputTopK top;
    if (top_k_ > 0 && 2 * whole_rows_.size() <= want_logits.size())
      top.k = 1, top.log_sum_exp = true, top.whole_rows = whole_rows_;
    const auto t0 = std::chrono::steady_clock::now();
    if (auto st = ctx_.decode(batch_, OutputKind::kLogits, top); !st) {
      for (const Item& it : items) reset(it.slot);
      return st;
    }
    // Every step counts, the first of a shape too: catch-ups come in many sizes, and leaving
    // out the steps that built a graph (0.03-0.16 ms here) left a draft that probes with new
    // sizes unmeasured, planned at the prior's cost, probing again and again.
    last_steps_.push_back({static_cast<int64_t>(batch_.size()),
                           std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()});
    for (const BatchToken& t : batch_) seen(t.seq).push_back(t.token);
    ++stats.draft_steps;
    for (size_t o = 0; o < want_logits.size(); ++o) {
      Item& it = items[static_cast<size_t>(want_logits[o])];
      int32_t x = -1;
      if (!ctx_.has_logits(o)) {  // (greedy, no bias)
        const TopLogits t = ctx_.top_logits(o);
        if (t.n_candidates() > 0 && std::exp(t.logits[0] - t.log_sum_exp) >= opts_.p_min) x = t.id(0);
      } else if (const std::span<const float> l = ctx_.logits(o); top_prob(l) >= opts_.p_min) {
        logits_.assign(l.begin(), l.end());
        if (opts_.sample_drafts) {
          std::vector<TokenProb> q;
          if (it.sampler->distribution_in_place(logits_, q)) x = it.sampler->draw(q);
          if (x >= 0) it.out->q.push_back(std::move(q));
        } else {  // the best token once the sequence's logit bias is applied
          for (const LogitBias& b : it.sampler->params().logit_bias)
            if (b.token >= 0 && static_cast<size_t>(b.token) < logits_.size())
              logits_[static_cast<size_t>(b.token)] += b.bias;
          x = Sampler::argmax(logits_);
        }
      }
      const bool stop = x < 0;
      if (!stop) it.out->tokens.push_back(x);
      if (stop || static_cast<int32_t>(it.out->tokens.size()) >= it.k) it.k = -1;  // finished
    }
    std::erase_if(active_, [&](int32_t i) { return items[static_cast<size_t>(i)].k < 0; });
  }
  return ok_status();
}

// --- policy ------------------------------------------------------------------------------------

namespace {
constexpr size_t kMaxSizes = 256;  // step sizes tracked apart; larger ones share the last slot
}  // namespace

double StepCostFit::Size::cost() const {
  std::array<float, kWindow> v = last;
  const int32_t c = count();
  std::nth_element(v.begin(), v.begin() + c / 4, v.begin() + c);
  return v[static_cast<size_t>(c / 4)];
}

void StepCostFit::add(double tokens, double seconds) {
  if (!(tokens >= 0) || !(seconds >= 0)) return;
  const size_t i = std::min(static_cast<size_t>(std::lround(tokens)), kMaxSizes - 1);
  if (i >= sizes_.size()) sizes_.resize(i + 1);
  Size& z = sizes_[i];
  z.last[static_cast<size_t>(z.n % kWindow)] = static_cast<float>(seconds);
  ++z.n;
  z.tokens += (tokens - z.tokens) / static_cast<double>(std::min<int64_t>(z.n, kWindow));
  ++n_;
}

bool StepCostFit::ready() const {
  int k = 0;
  for (const Size& z : sizes_) k += z.n >= kMinObs ? 1 : 0;
  return k >= 2;
}

void StepCostFit::fit(double* a, double* b) const {
  double s0 = 0, sn = 0, st = 0, snn = 0, snt = 0;
  for (const Size& z : sizes_) {
    if (z.n < kMinObs) continue;
    const double w = z.count(), t = z.cost();
    s0 += w, sn += w * z.tokens, st += w * t, snn += w * z.tokens * z.tokens, snt += w * z.tokens * t;
  }
  const double den = s0 * snn - sn * sn;
  *b = den > 1e-9 * s0 * s0 ? std::max(0.0, (s0 * snt - sn * st) / den) : 0.0;
  *a = s0 > 0 ? std::max(1e-7, (st - *b * sn) / s0) : 0.0;
}

double StepCostFit::a() const {
  double a = 0, b = 0;
  fit(&a, &b);
  return a;
}

double StepCostFit::b() const {
  double a = 0, b = 0;
  fit(&a, &b);
  return b;
}

double StepCostFit::mean_tokens() const {
  double s = 0, w = 0;
  for (const Size& z : sizes_) s += z.count() * z.tokens, w += z.count();
  return w > 0 ? s / w : 0;
}

double StepCostFit::mean_seconds() const {
  double s = 0, w = 0;
  for (const Size& z : sizes_)
    if (z.n > 0) s += z.count() * z.cost(), w += z.count();
  return w > 0 ? s / w : 0;
}

void AcceptanceEstimate::record(int32_t drafted, int32_t accepted) {
  // A run of k proposals is `accepted` successes, then one failure unless all were accepted.
  num_ = num_ * 0.8 + accepted;
  den_ = den_ * 0.8 + accepted + (accepted < drafted ? 1 : 0);
}

void AcceptanceEstimate::idle_step() {
  num_ *= 0.98;
  den_ *= 0.98;
}

void plan_draft_lengths(std::span<const double> rate, std::span<const int32_t> max_k, int64_t base_tokens,
                        const StepCost& cost, int32_t budget, std::span<int32_t> out_k,
                        std::span<const int64_t> catch_up) {
  std::fill(out_k.begin(), out_k.end(), 0);
  double tokens = static_cast<double>(rate.size());  // every decoding sequence emits one token
  double time = cost.target_fixed + cost.target_per_token * static_cast<double>(base_tokens);
  int32_t depth = 0, used = 0;
  // A row is never free (a fit can measure a slope of 0 on a noisy machine; then every
  // proposal would be a gain of infinity per nothing and none would be chosen).
  const double per_row = std::max(cost.target_per_token + cost.draft_per_token, 0.01 * cost.target_fixed);
  while (used < budget) {
    double best = 0, best_de = 0, best_dt = 0;
    int32_t best_i = -1, best_add = 0;
    for (size_t i = 0; i < rate.size(); ++i) {
      const double r = std::clamp(rate[i], 0.0, 0.999);
      double pw = std::pow(r, out_k[i]), de = 0, dt = 0;
      if (out_k[i] == 0 && !catch_up.empty())  // the draft's first step also feeds what it missed
        dt = static_cast<double>(std::max<int64_t>(catch_up[i] - 1, 0)) * cost.draft_per_token;
      for (int32_t add = 1; out_k[i] + add <= max_k[i] && used + add <= budget; ++add) {
        const int32_t j = out_k[i] + add;
        pw *= r;
        de += pw;
        dt += per_row + (j > depth ? cost.draft_fixed : 0.0);
        if (dt > 0 && de / dt > best)
          best = de / dt, best_i = static_cast<int32_t>(i), best_add = add, best_de = de, best_dt = dt;
      }
    }
    // Take it only if it raises tokens per second: de/dt above the current tokens/time.
    if (best_i < 0 || best_de * time <= tokens * best_dt) break;
    out_k[static_cast<size_t>(best_i)] += best_add;
    depth = std::max(depth, out_k[static_cast<size_t>(best_i)]);
    tokens += best_de;
    time += best_dt;
    used += best_add;
  }
}

}  // namespace kite

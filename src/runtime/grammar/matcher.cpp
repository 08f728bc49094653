// kite/src/runtime/grammar/matcher.cpp — the transition cache and GrammarMatcher.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "src/runtime/grammar/transition_cache.h"

namespace kite {
namespace grammar {
namespace {

constexpr size_t kMaxNodes = 1 << 18;  // bounds the cache to some tens of MB
constexpr size_t kMaxStates = 1 << 14;
constexpr size_t kMaxWide = 1 << 17;
constexpr size_t kExpandBudget = 200000;  // expansion steps per transition
constexpr int kMaxExpandDepth = 4000;

}  // namespace

void TransitionCache::maybe_reset() {
  if (nodes_.size() < kMaxNodes && states_.size() < kMaxStates && wide_.size() < kMaxWide) return;
  nodes_.clear();
  node_ids_.clear();
  states_.clear();
  state_ids_.clear();
  wide_.clear();
  ++generation_;
}

int32_t TransitionCache::node(uint32_t pos, int32_t parent) {
  const uint64_t key = (uint64_t{pos} << 32) | static_cast<uint32_t>(parent);
  auto [it, inserted] = node_ids_.emplace(key, static_cast<int32_t>(nodes_.size()));
  if (inserted) nodes_.push_back({pos, parent});
  return it->second;
}

// Pushes the normalized stacks for "match from element `pos`, then continue with `parent`".
bool TransitionCache::expand(uint32_t pos, int32_t parent, std::vector<int32_t>& out, size_t& budget, int depth) {
  const auto& elems = grammar_->elements();
  for (;;) {
    if (budget == 0 || depth > kMaxExpandDepth || out.size() > 4 * GrammarLimits::kMaxStacks) return false;
    --budget;
    const GrammarElement e = elems[pos];
    if (e.kind == GrammarElement::kEnd) {
      if (parent == kComplete) {
        out.push_back(kComplete);
        return true;
      }
      const Node p = nodes_[parent];
      pos = p.pos;
      parent = p.parent;
      continue;
    }
    if (e.kind == GrammarElement::kChars) {
      out.push_back(node(pos, parent));
      return true;
    }
    // A rule: its alternatives, then what follows it (dropped when nothing follows: tail call).
    const int32_t cont = elems[pos + 1].kind == GrammarElement::kEnd ? parent : node(pos + 1, parent);
    for (uint32_t alt : grammar_->alternatives(e.value))
      if (!expand(alt, cont, out, budget, depth + 1)) return false;
    return true;
  }
}

int32_t TransitionCache::intern(std::vector<int32_t>& stacks) {
  std::sort(stacks.begin(), stacks.end());
  stacks.erase(std::unique(stacks.begin(), stacks.end()), stacks.end());
  if (stacks.empty()) return kDead;
  if (stacks.size() > GrammarLimits::kMaxStacks) return kOverflow;
  std::string key(reinterpret_cast<const char*>(stacks.data()), stacks.size() * sizeof(int32_t));
  auto [it, inserted] = state_ids_.emplace(std::move(key), static_cast<int32_t>(states_.size()));
  if (inserted) {
    State s;
    s.stacks = stacks;
    s.can_end = stacks.front() == kComplete;
    for (int32_t id : stacks) {
      if (id == kComplete) continue;
      const CharClass& c = grammar_->char_class(grammar_->elements()[nodes_[id].pos].value);
      s.uniform_wide = s.uniform_wide && (c.all_wide || c.no_wide);
    }
    s.ascii.fill(kUnknown);
    states_.push_back(std::move(s));
  }
  return it->second;
}

int32_t TransitionCache::initial() {
  scratch_.clear();
  size_t budget = kExpandBudget;
  for (uint32_t alt : grammar_->alternatives(grammar_->root()))
    if (!expand(alt, kComplete, scratch_, budget, 0)) return kOverflow;
  return intern(scratch_);
}

int32_t TransitionCache::import(const std::vector<std::vector<uint32_t>>& stacks) {
  std::vector<int32_t> ids;
  ids.reserve(stacks.size());
  for (const auto& st : stacks) {
    int32_t parent = kComplete;
    for (uint32_t pos : st) parent = node(pos, parent);
    ids.push_back(parent);
  }
  return intern(ids);
}

void TransitionCache::export_state(int32_t state, std::vector<std::vector<uint32_t>>& out) const {
  out.clear();
  for (int32_t id : states_[state].stacks) {
    std::vector<uint32_t> st;
    for (int32_t n = id; n != kComplete; n = nodes_[n].parent) st.push_back(nodes_[n].pos);
    std::reverse(st.begin(), st.end());
    out.push_back(std::move(st));
  }
}

int32_t TransitionCache::transition(int32_t state, uint32_t cp) {
  std::vector<int32_t> out;
  size_t budget = kExpandBudget;
  const auto& elems = grammar_->elements();
  const size_t n = states_[state].stacks.size();
  for (size_t i = 0; i < n; ++i) {
    const int32_t id = states_[state].stacks[i];
    if (id == kComplete) continue;
    const Node nd = nodes_[id];
    if (!grammar_->char_class(elems[nd.pos].value).contains(cp)) continue;
    if (!expand(nd.pos + 1, nd.parent, out, budget, 0)) return kOverflow;
  }
  return intern(out);
}

int32_t TransitionCache::step_wide(int32_t state, uint32_t cp) {
  const uint64_t key = (uint64_t(uint32_t(state)) << 21) | cp;
  auto it = wide_.find(key);
  if (it != wide_.end()) return it->second;
  const int32_t t = transition(state, cp);
  wide_.emplace(key, t);
  return t;
}

const TransitionCache::Uniform& TransitionCache::uniform(int32_t state) {
  if (!states_[state].uniform_known) {
    int32_t next[128];
    for (uint8_t c = 0; c < 128; ++c) next[c] = step_ascii(state, c);
    Uniform u;
    int best = 0;
    for (uint8_t c = 0; c < 128; ++c) {  // the most frequent live successor
      if (next[c] < 0) continue;
      int n = 0;
      for (uint8_t d = 0; d < 128; ++d) n += next[d] == next[c];
      if (n > best) best = n, u.next = next[c];
    }
    if (u.next >= 0) {
      for (uint8_t c = 0; c < 128; ++c)
        if (next[c] == u.next) u.mask[c >> 6] |= uint64_t{1} << (c & 63);
      u.wide = uniform_wide(state) && step_any_wide(state) == u.next;
    }
    states_[state].uniform = u;
    states_[state].uniform_known = true;
  }
  return states_[state].uniform;
}

bool TransitionCache::range_possible(int32_t state, uint32_t lo, uint32_t hi) const {
  const auto& elems = grammar_->elements();
  for (int32_t id : states_[state].stacks)
    if (id != kComplete && grammar_->char_class(elems[nodes_[id].pos].value).intersects(lo, hi)) return true;
  return false;
}

namespace {

// Where a walk over bytes stands: a state plus the UTF-8 character being read.
struct Cursor {
  int32_t state;
  Utf8State u;
};

// Advances by one byte; false when the byte cannot come next (c.state < 0 tells overflow).
inline bool step(TransitionCache& cache, Cursor& c, uint8_t b) {
  int32_t t;
  switch (utf8_step(c.u, b)) {
    case Utf8Step::kInvalid:
      return false;
    case Utf8Step::kAscii:
      t = cache.step_ascii(c.state, b);
      break;
    case Utf8Step::kComplete:
      t = cache.uniform_wide(c.state) ? cache.step_any_wide(c.state) : cache.step_wide(c.state, c.u.cp);
      break;
    case Utf8Step::kPartial: {
      // Inside a character: possible only if some code point it can still become is accepted.
      if (cache.uniform_wide(c.state)) return cache.step_any_wide(c.state) >= 0;
      uint32_t lo, hi;
      utf8_partial_range(c.u, lo, hi);
      return cache.range_possible(c.state, lo, hi);
    }
  }
  if (t < 0) {
    c.state = t;
    return false;
  }
  c.state = t;
  return true;
}

std::string show_bytes(std::string_view s) {
  std::string out;
  for (unsigned char c : s) {
    if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') {
      out += static_cast<char>(c);
    } else {
      static const char* kHex = "0123456789abcdef";
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

}  // namespace
}  // namespace grammar

using grammar::Cursor;
constexpr size_t kMinBulk = 8;  // smallest subtree worth testing for bulk acceptance
using grammar::TransitionCache;

GrammarMatcher::GrammarMatcher(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenIndex> index)
    : grammar_(std::move(grammar)), index_(std::move(index)) {
  cache_ = std::make_shared<TransitionCache>(grammar_);
  reset();
}

void GrammarMatcher::reset() {
  std::lock_guard<std::mutex> lock(cache_->mu);
  const int32_t s = cache_->initial();
  stacks_.clear();
  if (s >= 0) cache_->export_state(s, stacks_);  // else: no stacks, nothing allowed
  overflow_ = s == grammar::kOverflow;
  partial_ = {};
  ended_ = false;
}

namespace {

// Whether every token in node i's subtree is allowed from `state`: along the chain of uniform
// successors, as long as the subtree is deep, each state takes all of the subtree's bytes.
bool bulk_ok(TransitionCache& cache, const TokenIndex& idx, size_t i, int32_t state) {
  const uint8_t f = idx.subtree_flags(i);
  if (!(f & TokenIndex::kAllValid) || !(f & TokenIndex::kFreshStart)) return false;
  const uint64_t* sub = idx.subtree_ascii(i);
  const bool wide = f & TokenIndex::kHasWide;
  int32_t s = state;
  for (uint32_t j = 0; j < idx.subtree_height(i); ++j) {
    const TransitionCache::Uniform& u = cache.uniform(s);
    if (u.next < 0 || (sub[0] & ~u.mask[0]) || (sub[1] & ~u.mask[1]) || (wide && !u.wide)) return false;
    if (u.next == s) return true;  // a loop: the rest of the chain is the same state
    s = u.next;
  }
  return true;
}

// The cache's id for the matcher's stacks (cache_->mu held).
int32_t current_state(TransitionCache& cache, const std::vector<std::vector<uint32_t>>& stacks) {
  cache.maybe_reset();
  if (stacks.empty()) return grammar::kDead;
  return cache.import(stacks);
}

}  // namespace

bool GrammarMatcher::accepts(TokenId token) const {
  if (ended_) return index_->is_eog(token);  // after the end, only the end again
  std::lock_guard<std::mutex> lock(cache_->mu);
  const int32_t s = current_state(*cache_, stacks_);
  if (s < 0) return index_->is_eog(token);  // stuck (too ambiguous from the start): only the end
  if (index_->is_eog(token)) return partial_.left == 0 && cache_->can_end(s);
  if (!index_->is_text(token)) return false;
  Cursor c{s, {partial_.cp, partial_.left, partial_.len}};
  for (char b : index_->bytes(token))
    if (!grammar::step(*cache_, c, static_cast<uint8_t>(b))) return false;
  return true;
}

void GrammarMatcher::fill_mask(std::vector<uint8_t>& allowed) const {
  const TokenIndex& idx = *index_;
  allowed.assign(static_cast<size_t>(idx.n_vocab()), 0);
  std::lock_guard<std::mutex> lock(cache_->mu);
  const int32_t s = ended_ ? grammar::kDead : current_state(*cache_, stacks_);
  if (s < 0) {  // finished (or stuck): only the end remains
    for (TokenId t : idx.eog_tokens()) allowed[t] = 1;
    return;
  }
  TransitionCache& cache = *cache_;
  std::vector<Cursor> at(idx.max_depth() + 1);
  at[0] = Cursor{s, {partial_.cp, partial_.left, partial_.len}};
  const size_t n = idx.n_nodes();
  for (size_t i = 1; i < n;) {
    Cursor c = at[idx.node_depth(i) - 1];
    // A subtree whose bytes all follow one chain of live states is accepted whole.
    if (c.u.left == 0 && idx.node_next(i) - i >= kMinBulk && bulk_ok(cache, idx, i, c.state)) {
      for (TokenId t : idx.subtree_tokens(i)) allowed[t] = 1;
      i = idx.node_next(i);
      continue;
    }
    if (!grammar::step(cache, c, idx.node_byte(i))) {
      i = idx.node_next(i);
      continue;
    }
    at[idx.node_depth(i)] = c;
    for (TokenId t : idx.node_tokens(i)) allowed[t] = 1;
    ++i;
  }
  if (partial_.left == 0 && cache.can_end(s))
    for (TokenId t : idx.eog_tokens()) allowed[t] = 1;
}

void GrammarMatcher::apply(std::span<float> logits) const {
  thread_local std::vector<uint8_t> allowed;
  fill_mask(allowed);
  for (size_t i = 0; i < logits.size(); ++i)
    if (i >= allowed.size() || !allowed[i]) logits[i] = -INFINITY;
}

Status GrammarMatcher::accept_text(std::string_view text) {
  if (ended_) return make_error("grammar: the grammar already ended (an end-of-generation token was accepted)");
  std::lock_guard<std::mutex> lock(cache_->mu);
  const int32_t s = current_state(*cache_, stacks_);
  if (s < 0) {
    if (overflow_)
      return make_error("grammar: too ambiguous (more than ", GrammarLimits::kMaxStacks,
                        " parallel parses at the start)");
    return make_error("grammar: no continuation is possible");
  }
  Cursor c{s, {partial_.cp, partial_.left, partial_.len}};
  for (size_t i = 0; i < text.size(); ++i) {
    if (!grammar::step(*cache_, c, static_cast<uint8_t>(text[i]))) {
      if (c.state == grammar::kOverflow)
        return make_error("grammar: too ambiguous (more than ", GrammarLimits::kMaxStacks,
                          " parallel parses, or too much work for one character)");
      return make_error("grammar: byte ", i, " of \"", grammar::show_bytes(text), "\" is not allowed here");
    }
  }
  cache_->export_state(c.state, stacks_);
  partial_ = {c.u.cp, c.u.left, c.u.len};
  return ok_status();
}

Status GrammarMatcher::accept(TokenId token) {
  if (ended_) {
    if (index_->is_eog(token)) return ok_status();
    return make_error("grammar: token ", token, " after the end of the grammar");
  }
  if (index_->is_eog(token)) {
    if (!can_end() && !stacks_.empty())
      return make_error("grammar: end-of-generation token ", token, " before the grammar is complete");
    ended_ = true;
    return ok_status();
  }
  if (!index_->is_text(token)) return make_error("grammar: token ", token, " is a control token or out of range");
  auto st = accept_text(index_->bytes(token));
  if (!st) return st.error().with_context("token " + std::to_string(token));
  return ok_status();
}

bool GrammarMatcher::can_end() const {
  if (ended_) return true;
  if (partial_.left != 0) return false;
  std::lock_guard<std::mutex> lock(cache_->mu);
  const int32_t s = current_state(*cache_, stacks_);
  return s >= 0 && cache_->can_end(s);
}

bool GrammarMatcher::done() const {
  if (ended_) return true;
  if (partial_.left != 0) return false;
  for (const auto& st : stacks_)
    if (!st.empty()) return false;
  return !stacks_.empty();
}

}  // namespace kite

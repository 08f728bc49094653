// kite/src/runtime/grammar/transition_cache.h — internal: a lazily built automaton over a grammar.
//
// A pushdown stack is a chain of interned nodes (element position, parent node); equal stacks are
// one id, so a matcher state (a set of stacks) is a sorted vector of ids, itself interned. The
// cache memoizes state × code point → state (an array per state for ASCII, a hash map above), so
// a mask pass costs about one array load per trie node once a state has been seen.
//
// Invariants: a node id in a state's stack list points at a character-class element (the next
// thing to match); kComplete stands for the empty stack. Expansion terminates because the grammar
// has no left recursion; it is also bounded (work, depth and the number of stacks) and reports
// kOverflow past the bounds. The cache is cleared when it grows past its limits; matchers keep
// their state as explicit stacks, so nothing they hold is lost. Callers hold `mu`.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "src/runtime/grammar/grammar.h"
#include "src/runtime/grammar/utf8_step.h"

namespace kite::grammar {

inline constexpr int32_t kComplete = -1;  // stack id: the empty stack
inline constexpr int32_t kDead = -1;      // state id: nothing can follow
inline constexpr int32_t kOverflow = -2;  // state id: too many parses or too much work
inline constexpr int32_t kUnknown = -3;   // transition not computed yet

class TransitionCache {
 public:
  explicit TransitionCache(std::shared_ptr<const Grammar> grammar) : grammar_(std::move(grammar)) {}

  std::mutex mu;

  uint64_t generation() const { return generation_; }
  // Clears everything when past the size limits (bumps generation()).
  void maybe_reset();

  int32_t initial();
  int32_t import(const std::vector<std::vector<uint32_t>>& stacks);
  void export_state(int32_t state, std::vector<std::vector<uint32_t>>& out) const;

  int32_t step_ascii(int32_t state, uint8_t c) {
    int32_t t = states_[state].ascii[c];
    if (t == kUnknown) {
      t = transition(state, c);
      states_[state].ascii[c] = t;
    }
    return t;
  }
  int32_t step_wide(int32_t state, uint32_t cp);
  // True when every stack's class accepts all code points >= 128 or none: then they all lead to
  // one successor, step_any_wide(), and no per-character work is needed (the usual case: JSON
  // strings, `.`, [^...]).
  bool uniform_wide(int32_t state) const { return states_[state].uniform_wide; }
  int32_t step_any_wide(int32_t state) {
    int32_t t = states_[state].wide_all;
    if (t == kUnknown) {
      t = transition(state, 0x80);
      states_[state].wide_all = t;
    }
    return t;
  }
  // Whether some stack of the state accepts a code point in [lo, hi].
  bool range_possible(int32_t state, uint32_t lo, uint32_t hi) const;

  // The successor most ASCII bytes lead to ("the next character of a string"), the mask of those
  // bytes, and whether every character >= 128 leads there too. A mask pass uses it to accept a
  // whole trie subtree whose bytes all follow this one chain of states without walking it.
  struct Uniform {
    uint64_t mask[2] = {0, 0};
    bool wide = false;
    int32_t next = kDead;
  };
  const Uniform& uniform(int32_t state);

  bool can_end(int32_t state) const { return states_[state].can_end; }
  bool only_end(int32_t state) const { return states_[state].stacks.size() == 1 && states_[state].can_end; }
  size_t n_stacks(int32_t state) const { return states_[state].stacks.size(); }

 private:
  struct Node {
    uint32_t pos;
    int32_t parent;
  };
  struct State {
    std::vector<int32_t> stacks;  // sorted; kComplete first when present
    bool can_end = false;
    bool uniform_wide = true;
    int32_t wide_all = kUnknown;
    bool uniform_known = false;
    Uniform uniform;
    std::array<int32_t, 128> ascii;
  };

  int32_t node(uint32_t pos, int32_t parent);
  bool expand(uint32_t pos, int32_t parent, std::vector<int32_t>& out, size_t& budget, int depth);
  int32_t intern(std::vector<int32_t>& stacks);
  int32_t transition(int32_t state, uint32_t cp);

  std::shared_ptr<const Grammar> grammar_;
  std::vector<Node> nodes_;
  std::unordered_map<uint64_t, int32_t> node_ids_;
  std::vector<State> states_;
  std::unordered_map<std::string, int32_t> state_ids_;
  std::unordered_map<uint64_t, int32_t> wide_;
  std::vector<int32_t> scratch_;
  uint64_t generation_ = 0;
};

}  // namespace kite::grammar

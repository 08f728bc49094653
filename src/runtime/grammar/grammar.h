// kite/src/runtime/grammar/grammar.h — constrained decoding: GBNF grammars, JSON Schema, token masks.
//
//   KITE_ASSIGN_OR_RETURN(auto grammar, Grammar::parse(R"(root ::= "yes" | "no")"));
//   // or Grammar::from_json_schema(schema_text), or Grammar::json_any() for any JSON value
//   auto index = TokenIndex::build(*tokenizer);     // once per tokenizer, shared by all matchers
//   GrammarMatcher m(grammar, index);               // one per sequence
//   for (;;) {
//     m.apply(logits);                              // -INFINITY for every token not allowed now
//     TokenId t = sampler.sample(logits);
//     KITE_TRY(m.accept(t));                        // advances; EOG is accepted only when can_end()
//     if (tokenizer->is_eog(t) || m.done()) break;
//   }
//
// Grammar syntax (llama.cpp's GBNF): `name ::= alternatives`, `|`, sequences, `( )`, postfix
// `*` `+` `?` `{m}` `{m,}` `{m,n}` `{,n}`, string literals "..." and char classes [a-z] / [^...]
// with escapes \n \r \t \\ \" \[ \] \- \^ \' \/ \. \xHH \uHHHH \UHHHHHHHH (others are errors),
// `.` (any character), `#` comments. Rule names are [a-zA-Z0-9_-]+. A rule ends at the end of its
// line unless inside parentheses or after `|` / `::=`. Not supported: llama.cpp's token
// references (<[id]>, <name>).
//
// Contracts:
//   - Grammar is immutable and may be shared by any number of threads and matchers. parse()
//     rejects (with line:column and what was expected) syntax errors, undefined rules, a missing
//     root, duplicate rules, left recursion (direct or through nullable prefixes, also a repetition
//     of something that can match nothing), rules that can never finish, and hostile sizes
//     (see GrammarLimits): the result is an error, never a hang or unbounded memory.
//   - The matcher works on Unicode code points decoded from token bytes; a token may end inside a
//     UTF-8 character (the partial character is carried to the next token). Invalid UTF-8 is never
//     allowed. Control tokens are never allowed; end-of-generation tokens only when the grammar can
//     end and no character is incomplete.
//   - A matcher's state is a set of pushdown stacks (at most GrammarLimits::kMaxStacks, else
//     accept() fails with "too ambiguous" and masks leave such tokens out). Masks come from one
//     pass over the TokenIndex byte trie (shared prefixes are walked once, and a subtree whose
//     bytes all follow one chain of states, e.g. text inside a JSON string, is accepted whole)
//     through a lazily built, bounded transition cache.
//   - GrammarMatcher is copyable (fork a sequence): copies share the transition cache, which is
//     guarded by a mutex, so copies may be used from different threads; one matcher object is used
//     by one thread at a time. Sequences under the same grammar should copy one prototype matcher
//     so that they share one warm cache (a new matcher starts with an empty cache).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "src/base/status.h"
#include "src/runtime/tokenizer.h"

namespace kite {

struct GrammarLimits {
  static constexpr size_t kMaxTextBytes = 4 << 20;  // grammar / schema source
  static constexpr size_t kMaxRules = 20000;        // including rules made for groups/repetitions
  static constexpr size_t kMaxElements = 500000;    // after repetitions are expanded
  static constexpr uint32_t kMaxRepeat = 10000;     // m and n in {m,n}
  static constexpr int kMaxNesting = 100;           // parentheses / schema depth
  static constexpr size_t kMaxStacks = 2048;        // parallel parses in a matcher state
};

// One element of an alternative. Alternatives are runs of elements ended by kEnd.
struct GrammarElement {
  enum Kind : uint8_t { kEnd, kChars, kRule };
  Kind kind;
  uint32_t value;  // kChars: char class index; kRule: rule index
};

// A set of code points as sorted, disjoint, non-adjacent ranges (surrogates never included).
struct CharClass {
  std::vector<std::pair<uint32_t, uint32_t>> ranges;
  uint64_t ascii[2] = {0, 0};  // bitmap of code points < 128
  bool all_wide = false;       // contains every code point >= 128
  bool no_wide = true;         // contains none

  bool contains(uint32_t cp) const {
    if (cp < 128) return (ascii[cp >> 6] >> (cp & 63)) & 1;
    return contains_slow(cp);
  }
  bool contains_slow(uint32_t cp) const;
  bool intersects(uint32_t lo, uint32_t hi) const;
};

class Grammar {
 public:
  // Parses GBNF text; `root` names the start rule.
  static Result<std::shared_ptr<const Grammar>> parse(std::string_view gbnf, std::string_view root = "root");
  // Compiles a JSON Schema (see json_schema_to_gbnf for the supported subset).
  static Result<std::shared_ptr<const Grammar>> from_json_schema(std::string_view schema_json);
  // Any JSON value (for response_format json_object); whitespace between tokens is bounded.
  static std::shared_ptr<const Grammar> json_any();

  // Read-only structure, used by the matcher.
  uint32_t root() const { return root_; }
  size_t n_rules() const { return rule_names_.size(); }
  const std::string& rule_name(uint32_t rule) const { return rule_names_[rule]; }
  // Start positions (into elements()) of the rule's alternatives.
  std::span<const uint32_t> alternatives(uint32_t rule) const {
    return {alt_starts_.data() + rule_alts_[rule], alt_starts_.data() + rule_alts_[rule + 1]};
  }
  const std::vector<GrammarElement>& elements() const { return elements_; }
  const CharClass& char_class(uint32_t index) const { return classes_[index]; }

  // The grammar back as GBNF (generated rules included), for debugging and error reports.
  std::string to_gbnf() const;

 private:
  Grammar() = default;

  std::vector<std::string> rule_names_;
  std::vector<uint32_t> rule_alts_;  // rule r's alternatives: alt_starts_[rule_alts_[r] .. rule_alts_[r+1])
  std::vector<uint32_t> alt_starts_;
  std::vector<GrammarElement> elements_;
  std::vector<CharClass> classes_;
  uint32_t root_ = 0;
};

// JSON Schema → GBNF. Supported: type (a name or a list), object (properties in schema order,
// required; optional properties may be left out; without `properties` any keys, with
// additionalProperties a schema for their values; with `properties`, other keys are not allowed,
// as if additionalProperties were false), array (items, minItems, maxItems), string (minLength,
// maxLength), number, integer, boolean, null, enum, const, anyOf / oneOf (oneOf is not checked
// for exclusivity), $ref to "#" or any JSON pointer inside the document (#/$defs/x,
// #/definitions/x; recursion allowed), `true` / `{}` (any value). Annotations (title,
// description, default, examples, format, $schema, $id, $comment, ...) are ignored. Anything
// else (pattern, minimum, allOf, ...) is an error naming the keyword's path.
// Numbers are bounded (at most 16 integer digits, 16 fraction digits, 2 exponent digits) and
// whitespace between tokens is at most one newline plus 20 spaces/tabs, so a model cannot
// loop forever outside strings.
Result<std::string> json_schema_to_gbnf(std::string_view schema_json);

// Every token's bytes in a byte trie, built once per tokenizer and shared by all matchers.
class TokenIndex {
 public:
  static std::shared_ptr<const TokenIndex> build(const Tokenizer& tokenizer);

  int32_t n_vocab() const { return n_vocab_; }
  bool is_eog(TokenId id) const { return id >= 0 && id < n_vocab_ && kind_[id] == kEog; }
  bool is_text(TokenId id) const { return id >= 0 && id < n_vocab_ && kind_[id] == kText; }
  // The token's bytes; `id` must be in [0, n_vocab()).
  std::string_view bytes(TokenId id) const { return {text_.data() + text_off_[id], text_off_[id + 1] - text_off_[id]}; }
  const std::vector<TokenId>& eog_tokens() const { return eog_; }

  // The trie in preorder; node 0 is the root (no byte). Node i's subtree is [i, next(i)).
  size_t n_nodes() const { return byte_.size(); }
  uint8_t node_byte(size_t i) const { return byte_[i]; }
  uint32_t node_depth(size_t i) const { return depth_[i]; }
  uint32_t node_next(size_t i) const { return next_[i]; }
  std::span<const TokenId> node_tokens(size_t i) const {
    return {tokens_.data() + tok_begin_[i], tokens_.data() + tok_begin_[i + 1]};
  }
  uint32_t max_depth() const { return max_depth_; }
  // The tokens of node i's whole subtree (tokens are stored in preorder).
  std::span<const TokenId> subtree_tokens(size_t i) const {
    return {tokens_.data() + tok_begin_[i], tokens_.data() + tok_begin_[next_[i]]};
  }
  // Summary of node i's subtree, for accepting it whole: the ASCII bytes on its nodes and flags.
  enum SubtreeFlags : uint8_t {
    kHasWide = 1,     // some byte >= 0x80
    kAllValid = 2,    // every path from the root into the subtree is valid (possibly cut) UTF-8
    kFreshStart = 4,  // node i's byte starts a character (the path above ends on a boundary)
  };
  const uint64_t* subtree_ascii(size_t i) const { return &sub_ascii_[2 * i]; }
  uint8_t subtree_flags(size_t i) const { return sub_flags_[i]; }
  uint32_t subtree_height(size_t i) const { return sub_height_[i]; }  // longest path below, in bytes, node i included

 private:
  enum Kind : uint8_t { kText, kEog, kExcluded };
  int32_t n_vocab_ = 0;
  std::vector<uint8_t> kind_;
  std::string text_;
  std::vector<size_t> text_off_;
  std::vector<TokenId> eog_;
  std::vector<uint8_t> byte_;
  std::vector<uint32_t> depth_, next_, tok_begin_;
  std::vector<TokenId> tokens_;
  std::vector<uint64_t> sub_ascii_;
  std::vector<uint8_t> sub_flags_;
  std::vector<uint32_t> sub_height_;
  uint32_t max_depth_ = 0;
};

namespace grammar {
class TransitionCache;
}

class GrammarMatcher {
 public:
  GrammarMatcher(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenIndex> index);

  // Whether `token` may come next.
  bool accepts(TokenId token) const;
  // Sets logits of tokens not allowed now to -INFINITY (ids past n_vocab of the index too).
  // After an EOG token was accepted (or when a grammar too ambiguous to start has no stack),
  // only EOG tokens stay allowed, so a sampler always has something to pick.
  void apply(std::span<float> logits) const;
  // allowed[id] = 1 for each token allowed now, else 0 (resized to n_vocab).
  void fill_mask(std::vector<uint8_t>& allowed) const;
  // Advances by one token; an error (naming the token) if the grammar does not allow it.
  Status accept(TokenId token);
  // Advances by raw text (bytes), e.g. a forced prefix.
  Status accept_text(std::string_view text);

  bool can_end() const;  // the text so far is a complete sentence of the grammar
  bool done() const;     // nothing but the end is possible (or an EOG token was accepted)
  void reset();

  const Grammar& grammar() const { return *grammar_; }

 private:
  struct Partial {
    uint32_t cp = 0;
    uint8_t left = 0;  // continuation bytes still expected
    uint8_t len = 0;   // total length of the character being read
  };

  std::shared_ptr<const Grammar> grammar_;
  std::shared_ptr<const TokenIndex> index_;
  std::shared_ptr<grammar::TransitionCache> cache_;
  // The state: each stack lists element positions bottom to top (top: a char class to match
  // next); an empty stack means the grammar is complete.
  std::vector<std::vector<uint32_t>> stacks_;
  Partial partial_;
  bool ended_ = false;
  bool overflow_ = false;  // the start state alone was too ambiguous
};

}  // namespace kite

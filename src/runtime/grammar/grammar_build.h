// kite/src/runtime/grammar/grammar_build.h — internal: the parser's output before checks.
//
// parse_gbnf() turns GBNF text into RawGrammar (groups and repetitions already lowered to
// generated rules, every referenced rule defined); Grammar::parse() checks the rest (root,
// nullable left recursion, rules that cannot finish) and freezes it into the flat form the
// matcher walks.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "src/base/status.h"
#include "src/runtime/grammar/grammar.h"

namespace kite::grammar {

struct RawElement {
  bool is_rule;
  uint32_t value;  // rule index or class index
};

struct RawClass {
  bool negated = false;
  std::vector<std::pair<uint32_t, uint32_t>> ranges;  // as written
};

struct RawRule {
  std::string name;
  std::vector<std::vector<RawElement>> alts;
  bool defined = false;
};

struct RawGrammar {
  std::vector<RawRule> rules;
  std::vector<RawClass> classes;
};

Result<RawGrammar> parse_gbnf(std::string_view text);

// Sorted, merged positive ranges without surrogates, with the ASCII bitmap filled in.
CharClass normalize_class(const RawClass& raw);

}  // namespace kite::grammar

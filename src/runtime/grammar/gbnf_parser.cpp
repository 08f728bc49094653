// kite/src/runtime/grammar/gbnf_parser.cpp — GBNF text → RawGrammar.
//
// A recursive-descent parser over llama.cpp's GBNF. Groups become generated rules, and a
// repeated item is first reduced to one element (a rule reference for literals and groups), so
// x{m,n} costs O(n) elements however deeply repetitions nest: sizes stay linear in the counts,
// which are capped, and every error carries "line L, column C".
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "src/base/utf8.h"
#include "src/runtime/grammar/grammar_build.h"

namespace kite::grammar {
namespace {

constexpr uint32_t kUnbounded = std::numeric_limits<uint32_t>::max();

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

std::string describe(std::string_view s, size_t pos) {
  if (pos >= s.size()) return "end of input";
  const unsigned char c = static_cast<unsigned char>(s[pos]);
  if (c == '\n') return "end of line";
  if (c < 0x20 || c >= 0x7f) {
    static const char* kHex = "0123456789abcdef";
    return std::string("byte 0x") + kHex[c >> 4] + kHex[c & 15];
  }
  return std::string("'") + static_cast<char>(c) + "'";
}

class Parser {
 public:
  explicit Parser(std::string_view text) : s_(text) {}

  Result<RawGrammar> run() {
    if (s_.size() > GrammarLimits::kMaxTextBytes)
      return make_error("grammar is ", s_.size(), " bytes, more than the limit of ", GrammarLimits::kMaxTextBytes);
    skip_space(true);
    while (pos_ < s_.size()) {
      KITE_TRY(parse_rule());
      skip_space(true);
    }
    for (size_t r = 0; r < g_.rules.size(); ++r)
      if (!g_.rules[r].defined) return fail(first_use_[r], "undefined rule '" + g_.rules[r].name + "'");
    return std::move(g_);
  }

 private:
  std::string where(size_t pos) const {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < pos && i < s_.size(); ++i) {
      if (s_[i] == '\n') {
        ++line, col = 1;
      } else if ((static_cast<unsigned char>(s_[i]) & 0xc0) != 0x80) {
        ++col;
      }
    }
    return "line " + std::to_string(line) + ", column " + std::to_string(col);
  }
  Error fail(size_t pos, std::string_view what) const { return make_error(where(pos), ": ", what); }
  Error expected(std::string_view what) const {
    return make_error(where(pos_), ": expected ", what, ", got ", describe(s_, pos_));
  }

  bool eof() const { return pos_ >= s_.size(); }
  char peek() const { return eof() ? '\0' : s_[pos_]; }

  // Spaces, tabs and comments; newlines too when `newlines` (inside groups, after | and ::=).
  void skip_space(bool newlines) {
    while (!eof()) {
      const char c = s_[pos_];
      if (c == ' ' || c == '\t') {
        ++pos_;
      } else if (c == '#') {
        while (!eof() && s_[pos_] != '\n') ++pos_;
      } else if (newlines && (c == '\n' || c == '\r')) {
        ++pos_;
      } else {
        break;
      }
    }
  }

  std::string_view parse_name() {
    const size_t start = pos_;
    while (!eof() && is_name_char(s_[pos_])) ++pos_;
    return s_.substr(start, pos_ - start);
  }

  Result<uint32_t> rule_id(std::string_view name, size_t use_pos) {
    auto it = ids_.find(std::string(name));
    if (it != ids_.end()) return it->second;
    if (g_.rules.size() >= GrammarLimits::kMaxRules)
      return fail(use_pos, "more than " + std::to_string(GrammarLimits::kMaxRules) + " rules");
    const auto id = static_cast<uint32_t>(g_.rules.size());
    g_.rules.push_back(RawRule{std::string(name), {}, false});
    first_use_.resize(g_.rules.size(), 0);
    first_use_[id] = use_pos;
    ids_.emplace(std::string(name), id);
    return id;
  }

  Result<uint32_t> new_rule(std::vector<std::vector<RawElement>> alts) {
    if (g_.rules.size() >= GrammarLimits::kMaxRules)
      return fail(pos_,
                  "more than " + std::to_string(GrammarLimits::kMaxRules) + " rules (groups and repetitions included)");
    const auto id = static_cast<uint32_t>(g_.rules.size());
    g_.rules.push_back(RawRule{current_ + "/" + std::to_string(++generated_), std::move(alts), true});
    return id;
  }

  Status count_elements(size_t n) {
    n_elements_ += n;
    if (n_elements_ > GrammarLimits::kMaxElements)
      return fail(pos_, "grammar too large: more than " + std::to_string(GrammarLimits::kMaxElements) +
                            " elements after expanding repetitions");
    return ok_status();
  }

  Status parse_rule() {
    const size_t name_pos = pos_;
    const std::string_view name = parse_name();
    if (name.empty()) return expected("a rule name");
    skip_space(false);
    if (s_.substr(pos_, 3) != "::=") return expected("'::=' after rule name '" + std::string(name) + "'");
    pos_ += 3;
    skip_space(true);
    KITE_ASSIGN_OR_RETURN(const uint32_t id, rule_id(name, name_pos));
    if (g_.rules[id].defined) return fail(name_pos, "rule '" + std::string(name) + "' is defined twice");
    g_.rules[id].defined = true;
    current_ = std::string(name);
    KITE_ASSIGN_OR_RETURN(auto alts, parse_alternates(false));
    g_.rules[id].alts = std::move(alts);
    skip_space(false);
    if (!eof() && peek() != '\n' && peek() != '\r') return expected("end of line after rule '" + current_ + "'");
    return ok_status();
  }

  Result<std::vector<std::vector<RawElement>>> parse_alternates(bool nested) {
    std::vector<std::vector<RawElement>> alts;
    KITE_ASSIGN_OR_RETURN(auto seq, parse_sequence(nested));
    alts.push_back(std::move(seq));
    while (peek() == '|') {
      ++pos_;
      skip_space(true);
      KITE_ASSIGN_OR_RETURN(auto next, parse_sequence(nested));
      alts.push_back(std::move(next));
    }
    return alts;
  }

  Result<uint32_t> single_char_class(uint32_t cp) {
    auto it = single_.find(cp);
    if (it != single_.end()) return it->second;
    const auto id = static_cast<uint32_t>(g_.classes.size());
    g_.classes.push_back(RawClass{false, {{cp, cp}}});
    single_.emplace(cp, id);
    return id;
  }

  Result<std::vector<RawElement>> parse_sequence(bool nested) {
    std::vector<RawElement> seq;
    size_t last_start = std::string::npos;  // first element of the last item (for repetitions)
    for (;;) {
      const char c = peek();
      const size_t item_pos = pos_;
      if (c == '"') {
        last_start = seq.size();
        ++pos_;
        while (peek() != '"') {
          if (eof() || peek() == '\n' || peek() == '\r') return expected("'\"' to end the string literal");
          KITE_ASSIGN_OR_RETURN(const uint32_t cp, parse_char());
          KITE_ASSIGN_OR_RETURN(const uint32_t cls, single_char_class(cp));
          seq.push_back({false, cls});
        }
        ++pos_;
        KITE_TRY(count_elements(seq.size() - last_start));
        if (seq.size() == last_start) last_start = std::string::npos;  // "" is nothing to repeat
      } else if (c == '[') {
        last_start = seq.size();
        KITE_ASSIGN_OR_RETURN(const uint32_t cls, parse_class());
        seq.push_back({false, cls});
        KITE_TRY(count_elements(1));
      } else if (c == '.') {
        ++pos_;
        last_start = seq.size();
        seq.push_back({false, any_class()});
        KITE_TRY(count_elements(1));
      } else if (is_name_char(c)) {
        const std::string_view name = parse_name();
        KITE_ASSIGN_OR_RETURN(const uint32_t id, rule_id(name, item_pos));
        last_start = seq.size();
        seq.push_back({true, id});
        KITE_TRY(count_elements(1));
      } else if (c == '(') {
        if (++depth_ > GrammarLimits::kMaxNesting)
          return fail(pos_, "parentheses nested deeper than " + std::to_string(GrammarLimits::kMaxNesting));
        ++pos_;
        skip_space(true);
        KITE_ASSIGN_OR_RETURN(auto alts, parse_alternates(true));
        if (peek() != ')') return expected("')' to close the group opened at " + where(item_pos));
        ++pos_;
        --depth_;
        KITE_ASSIGN_OR_RETURN(const uint32_t id, new_rule(std::move(alts)));
        last_start = seq.size();
        seq.push_back({true, id});
        KITE_TRY(count_elements(1));
      } else if (c == '*' || c == '+' || c == '?' || c == '{') {
        if (last_start == std::string::npos)
          return fail(pos_, std::string("'") + c + "' has nothing before it to repeat");
        uint32_t lo = 0, hi = kUnbounded;
        ++pos_;
        if (c == '+') lo = 1;
        if (c == '?') hi = 1;
        if (c == '{') KITE_TRY(parse_braces(lo, hi));
        KITE_TRY(repeat(seq, last_start, lo, hi));
        last_start = std::string::npos;
      } else {
        break;
      }
      skip_space(nested);
    }
    return seq;
  }

  Result<uint32_t> parse_count() {
    skip_space(true);
    if (peek() < '0' || peek() > '9') return expected("a repetition count");
    uint64_t v = 0;
    while (peek() >= '0' && peek() <= '9') {
      v = v * 10 + static_cast<uint64_t>(peek() - '0');
      if (v > GrammarLimits::kMaxRepeat)
        return fail(pos_, "repetition count above the limit of " + std::to_string(GrammarLimits::kMaxRepeat));
      ++pos_;
    }
    skip_space(true);
    return static_cast<uint32_t>(v);
  }

  // After '{': "m}", "m,}", "m,n}", ",n}".
  Status parse_braces(uint32_t& lo, uint32_t& hi) {
    skip_space(true);
    if (peek() == ',') {
      lo = 0;
    } else {
      KITE_ASSIGN_OR_RETURN(lo, parse_count());
    }
    if (peek() == '}') {
      ++pos_;
      hi = lo;
      return ok_status();
    }
    if (peek() != ',') return expected("',' or '}' in a repetition count");
    ++pos_;
    skip_space(true);
    if (peek() == '}') {
      ++pos_;
      hi = kUnbounded;
      return ok_status();
    }
    const size_t hi_pos = pos_;
    KITE_ASSIGN_OR_RETURN(hi, parse_count());
    if (peek() != '}') return expected("'}' to end the repetition count");
    ++pos_;
    if (hi < lo)
      return fail(hi_pos, "repetition maximum " + std::to_string(hi) + " is below the minimum " + std::to_string(lo));
    return ok_status();
  }

  // Replaces seq[start..] (one item) by `lo` copies plus the optional rest, as rules:
  // x* → r ::= x r | ;  x{0,k} → o_k ::= x o_{k-1} | (right-nested, so matching stays linear).
  Status repeat(std::vector<RawElement>& seq, size_t start, uint32_t lo, uint32_t hi) {
    RawElement item = seq[start];
    if (seq.size() - start > 1) {  // a literal of several characters
      std::vector<RawElement> body(seq.begin() + static_cast<std::ptrdiff_t>(start), seq.end());
      KITE_ASSIGN_OR_RETURN(const uint32_t id, new_rule({std::move(body)}));
      item = {true, id};
    }
    seq.resize(start);
    const size_t optional = hi == kUnbounded ? 1 : hi - lo;
    KITE_TRY(count_elements(lo + 3 * optional));
    for (uint32_t i = 0; i < lo; ++i) seq.push_back(item);
    if (hi == kUnbounded) {
      KITE_ASSIGN_OR_RETURN(const uint32_t rep, new_rule({}));
      g_.rules[rep].alts = {{item, {true, rep}}, {}};
      seq.push_back({true, rep});
    } else if (hi > lo) {
      uint32_t inner = 0;
      for (uint32_t k = 0; k < hi - lo; ++k) {
        std::vector<RawElement> alt{item};
        if (k > 0) alt.push_back({true, inner});
        KITE_ASSIGN_OR_RETURN(inner, new_rule({std::move(alt), {}}));
      }
      seq.push_back({true, inner});
    }
    return ok_status();
  }

  uint32_t any_class() {
    if (any_ == kUnbounded) {
      any_ = static_cast<uint32_t>(g_.classes.size());
      g_.classes.push_back(RawClass{true, {}});
    }
    return any_;
  }

  Result<uint32_t> parse_class() {
    const size_t open = pos_;
    ++pos_;  // '['
    RawClass cls;
    if (peek() == '^') {
      cls.negated = true;
      ++pos_;
    }
    while (peek() != ']') {
      if (eof() || peek() == '\n' || peek() == '\r') return expected("']' to close the class opened at " + where(open));
      KITE_ASSIGN_OR_RETURN(const uint32_t lo, parse_char());
      uint32_t hi = lo;
      if (peek() == '-' && pos_ + 1 < s_.size() && s_[pos_ + 1] != ']') {
        ++pos_;
        const size_t hi_pos = pos_;
        if (eof() || peek() == '\n') return expected("the end of a character range");
        KITE_ASSIGN_OR_RETURN(hi, parse_char());
        if (hi < lo) return fail(hi_pos, "character range ends below its start");
      }
      cls.ranges.emplace_back(lo, hi);
      if (cls.ranges.size() > 100000) return fail(pos_, "character class too large");
    }
    ++pos_;
    g_.classes.push_back(std::move(cls));
    return static_cast<uint32_t>(g_.classes.size() - 1);
  }

  Result<uint32_t> parse_hex(int digits) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      const char c = peek();
      uint32_t d;
      if (c >= '0' && c <= '9') {
        d = static_cast<uint32_t>(c - '0');
      } else if (c >= 'a' && c <= 'f') {
        d = static_cast<uint32_t>(c - 'a' + 10);
      } else if (c >= 'A' && c <= 'F') {
        d = static_cast<uint32_t>(c - 'A' + 10);
      } else {
        return expected(std::to_string(digits) + " hex digits");
      }
      v = (v << 4) | d;
      ++pos_;
    }
    return v;
  }

  // One character of a literal or class: an escape or one UTF-8 encoded code point.
  Result<uint32_t> parse_char() {
    const size_t start = pos_;
    if (peek() == '\\') {
      ++pos_;
      const char e = peek();
      ++pos_;
      uint32_t cp = 0;
      switch (e) {
        case 'n':
          return uint32_t{'\n'};
        case 'r':
          return uint32_t{'\r'};
        case 't':
          return uint32_t{'\t'};
        case '\\':
        case '"':
        case '[':
        case ']':
        case '-':
        case '^':
        case '\'':
        case '/':
        case '.':
          return static_cast<uint32_t>(e);
        case 'x':
        case 'u':
        case 'U': {
          KITE_ASSIGN_OR_RETURN(cp, parse_hex(e == 'x' ? 2 : e == 'u' ? 4 : 8));
          break;
        }
        default:
          return fail(start, "unknown escape '\\" + std::string(1, e) + "'");
      }
      if (cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
        return fail(start, "escape names an invalid code point (surrogate or above U+10FFFF)");
      return cp;
    }
    const size_t n = utf8_seq_len(s_, pos_);
    if (n == 0) return fail(pos_, "invalid UTF-8");
    uint32_t cp = static_cast<unsigned char>(s_[pos_]);
    if (n > 1) {
      cp &= 0x7fu >> n;
      for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s_[pos_ + k]) & 0x3f);
    }
    pos_ += n;
    return cp;
  }

  std::string_view s_;
  size_t pos_ = 0;
  RawGrammar g_;
  std::unordered_map<std::string, uint32_t> ids_;
  std::unordered_map<uint32_t, uint32_t> single_;
  uint32_t any_ = kUnbounded;
  std::string current_;
  size_t generated_ = 0;
  size_t n_elements_ = 0;
  int depth_ = 0;
  std::vector<size_t> first_use_;  // per rule: where it was first referenced (0 for generated)
};

}  // namespace

Result<RawGrammar> parse_gbnf(std::string_view text) {
  return Parser(text).run();
}

}  // namespace kite::grammar

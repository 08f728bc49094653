// kite/src/runtime/grammar/grammar.cpp — checking and freezing a parsed grammar.
//
// After parsing: every referenced rule must be defined, the root must exist, every rule reachable
// from the root must be able to finish, and no rule may reach itself without consuming input
// (left recursion, found through nullable prefixes). These are the conditions under which the
// matcher's stack expansion terminates.
#include <algorithm>
#include <string>
#include <vector>

#include "src/base/utf8.h"
#include "src/runtime/grammar/grammar_build.h"

namespace kite {

bool CharClass::contains_slow(uint32_t cp) const {
  auto it = std::upper_bound(ranges.begin(), ranges.end(), cp,
                             [](uint32_t v, const std::pair<uint32_t, uint32_t>& r) { return v < r.first; });
  return it != ranges.begin() && cp <= std::prev(it)->second;
}

bool CharClass::intersects(uint32_t lo, uint32_t hi) const {
  auto it = std::upper_bound(ranges.begin(), ranges.end(), hi,
                             [](uint32_t v, const std::pair<uint32_t, uint32_t>& r) { return v < r.first; });
  return it != ranges.begin() && std::prev(it)->second >= lo;
}

namespace grammar {

CharClass normalize_class(const RawClass& raw) {
  std::vector<std::pair<uint32_t, uint32_t>> r = raw.ranges;
  std::sort(r.begin(), r.end());
  std::vector<std::pair<uint32_t, uint32_t>> merged;
  for (const auto& x : r) {
    if (!merged.empty() && x.first <= merged.back().second + 1) {
      merged.back().second = std::max(merged.back().second, x.second);
    } else {
      merged.push_back(x);
    }
  }
  if (raw.negated) {
    std::vector<std::pair<uint32_t, uint32_t>> comp;
    uint32_t next = 0;
    for (const auto& x : merged) {
      if (x.first > next) comp.emplace_back(next, x.first - 1);
      next = x.second + 1;
    }
    if (next <= 0x10ffff) comp.emplace_back(next, 0x10ffff);
    merged = std::move(comp);
  }
  CharClass out;
  for (const auto& x : merged) {  // cut out the surrogates
    if (x.second < 0xd800 || x.first > 0xdfff) {
      out.ranges.push_back(x);
      continue;
    }
    if (x.first < 0xd800) out.ranges.emplace_back(x.first, 0xd7ff);
    if (x.second > 0xdfff) out.ranges.emplace_back(0xe000, x.second);
  }
  for (const auto& x : out.ranges) out.no_wide = out.no_wide && x.second < 0x80;
  bool low = false, high = false;  // [0x80, 0xd7ff] and [0xe000, 0x10ffff] covered
  for (const auto& x : out.ranges) {
    low = low || (x.first <= 0x80 && x.second >= 0xd7ff);
    high = high || (x.first <= 0xe000 && x.second == 0x10ffff);
  }
  out.all_wide = low && high;
  for (const auto& x : out.ranges)
    for (uint32_t c = x.first; c <= std::min<uint32_t>(x.second, 127); ++c)
      out.ascii[c >> 6] |= uint64_t{1} << (c & 63);
  return out;
}

namespace {

// Rules that can match the empty string, and rules that can finish at all (fixpoints).
void analyze(const RawGrammar& g, std::vector<char>& nullable, std::vector<char>& productive) {
  const size_t n = g.rules.size();
  nullable.assign(n, 0);
  productive.assign(n, 0);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < n; ++r) {
      for (const auto& alt : g.rules[r].alts) {
        bool all_null = true, all_prod = true;
        for (const auto& e : alt) {
          if (!e.is_rule) {
            all_null = false;
          } else {
            all_null = all_null && nullable[e.value];
            all_prod = all_prod && productive[e.value];
          }
        }
        if (all_null && !nullable[r]) nullable[r] = 1, changed = true;
        if (all_prod && !productive[r]) productive[r] = 1, changed = true;
      }
    }
  }
}

// Finds a cycle in "A starts with B" edges (B after only nullable elements); iterative DFS.
Status check_left_recursion(const RawGrammar& g, const std::vector<char>& nullable) {
  const size_t n = g.rules.size();
  std::vector<std::vector<uint32_t>> edges(n);
  for (size_t r = 0; r < n; ++r) {
    for (const auto& alt : g.rules[r].alts) {
      for (const auto& e : alt) {
        if (!e.is_rule) break;
        edges[r].push_back(e.value);
        if (!nullable[e.value]) break;
      }
    }
  }
  std::vector<uint8_t> color(n, 0);  // 0 new, 1 on the path, 2 done
  std::vector<std::pair<uint32_t, size_t>> path;
  for (uint32_t start = 0; start < n; ++start) {
    if (color[start]) continue;
    path.emplace_back(start, 0);
    color[start] = 1;
    while (!path.empty()) {
      auto& [r, next] = path.back();
      if (next == edges[r].size()) {
        color[r] = 2;
        path.pop_back();
        continue;
      }
      const uint32_t to = edges[r][next++];
      if (color[to] == 1) {
        std::string cycle;
        bool on = false;
        for (const auto& p : path) {
          if (p.first == to) on = true;
          if (on) cycle += "'" + g.rules[p.first].name + "' -> ";
        }
        cycle += "'" + g.rules[to].name + "'";
        return make_error("left recursion: ", cycle,
                          " (a rule reaches itself without consuming input; a repetition of something that can "
                          "match nothing does this too)");
      }
      if (color[to] == 0) {
        color[to] = 1;
        path.emplace_back(to, 0);
      }
    }
  }
  return ok_status();
}

// Rules reachable from the root that can never finish.
Status check_productive(const RawGrammar& g, uint32_t root, const std::vector<char>& productive) {
  std::vector<char> seen(g.rules.size(), 0);
  std::vector<uint32_t> todo{root};
  seen[root] = 1;
  std::string bad;
  size_t n_bad = 0;
  while (!todo.empty()) {
    const uint32_t r = todo.back();
    todo.pop_back();
    if (!productive[r] && ++n_bad <= 8) bad += (bad.empty() ? "'" : ", '") + g.rules[r].name + "'";
    for (const auto& alt : g.rules[r].alts)
      for (const auto& e : alt)
        if (e.is_rule && !seen[e.value]) seen[e.value] = 1, todo.push_back(e.value);
  }
  if (n_bad == 0) return ok_status();
  return make_error("rules that can never finish (every alternative recurses without end): ", bad,
                    n_bad > 8 ? ", ..." : "");
}

void append_escaped(std::string& out, uint32_t cp, bool in_class) {
  if (cp == '"' || cp == '\\' || (in_class && (cp == ']' || cp == '-' || cp == '^' || cp == '['))) {
    out += '\\';
    out += static_cast<char>(cp);
  } else if (cp == '\n') {
    out += "\\n";
  } else if (cp == '\t') {
    out += "\\t";
  } else if (cp == '\r') {
    out += "\\r";
  } else if (cp < 0x20 || cp == 0x7f) {
    static const char* kHex = "0123456789ABCDEF";
    out += "\\x";
    out += kHex[cp >> 4];
    out += kHex[cp & 15];
  } else {
    append_utf8(out, cp);
  }
}

}  // namespace
}  // namespace grammar

Result<std::shared_ptr<const Grammar>> Grammar::parse(std::string_view gbnf, std::string_view root) {
  KITE_ASSIGN_OR_RETURN(grammar::RawGrammar raw, grammar::parse_gbnf(gbnf));
  uint32_t root_id = 0;
  bool found = false;
  for (uint32_t r = 0; r < raw.rules.size(); ++r)
    if (raw.rules[r].name == root) root_id = r, found = true;
  if (!found) return make_error("missing root rule '", root, "'");
  std::vector<char> nullable, productive;
  grammar::analyze(raw, nullable, productive);
  KITE_TRY(grammar::check_left_recursion(raw, nullable));
  KITE_TRY(grammar::check_productive(raw, root_id, productive));

  std::shared_ptr<Grammar> g(new Grammar());
  g->root_ = root_id;
  g->rule_alts_.push_back(0);
  for (auto& r : raw.rules) {
    g->rule_names_.push_back(std::move(r.name));
    for (const auto& alt : r.alts) {
      g->alt_starts_.push_back(static_cast<uint32_t>(g->elements_.size()));
      for (const auto& e : alt)
        g->elements_.push_back({e.is_rule ? GrammarElement::kRule : GrammarElement::kChars, e.value});
      g->elements_.push_back({GrammarElement::kEnd, 0});
    }
    g->rule_alts_.push_back(static_cast<uint32_t>(g->alt_starts_.size()));
  }
  for (const auto& c : raw.classes) g->classes_.push_back(grammar::normalize_class(c));
  return std::shared_ptr<const Grammar>(std::move(g));
}

std::string Grammar::to_gbnf() const {
  std::string out;
  for (uint32_t r = 0; r < n_rules(); ++r) {
    out += rule_names_[r] + " ::=";
    bool first = true;
    for (uint32_t start : alternatives(r)) {
      out += first ? " " : " | ";
      first = false;
      for (uint32_t p = start; elements_[p].kind != GrammarElement::kEnd; ++p) {
        const GrammarElement& e = elements_[p];
        if (p != start) out += ' ';
        if (e.kind == GrammarElement::kRule) {
          out += rule_names_[e.value];
          continue;
        }
        const CharClass& c = classes_[e.value];
        out += '[';
        for (const auto& [lo, hi] : c.ranges) {
          grammar::append_escaped(out, lo, true);
          if (hi != lo) {
            out += '-';
            grammar::append_escaped(out, hi, true);
          }
        }
        out += ']';
      }
    }
    out += '\n';
  }
  return out;
}

std::shared_ptr<const Grammar> Grammar::json_any() {
  static const char* kJson = R"(root ::= value
value ::= object | array | string | number | "true" | "false" | "null"
object ::= "{" ws ( string ws ":" ws value ws ( "," ws string ws ":" ws value ws )* )? "}"
array ::= "[" ws ( value ws ( "," ws value ws )* )? "]"
string ::= "\"" ( [^"\\\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" hex4 ) )* "\""
hex4 ::= [0-9a-cA-Ce-fE-F] hex hex hex | [dD] [0-7] hex hex | [dD] [89abAB] hex hex "\\u" [dD] [c-fC-F] hex hex
hex ::= [0-9a-fA-F]
number ::= "-"? ( "0" | [1-9] [0-9]{0,15} ) ( "." [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,2} )?
ws ::= | " " | "\n" [ \t]{0,20}
)";
  static const std::shared_ptr<const Grammar> kGrammar = [] {
    auto g = parse(kJson);
    return g.ok() ? g.value() : nullptr;  // a fixed text that the tests parse
  }();
  return kGrammar;
}

Result<std::shared_ptr<const Grammar>> Grammar::from_json_schema(std::string_view schema_json) {
  KITE_ASSIGN_OR_RETURN(const std::string gbnf, json_schema_to_gbnf(schema_json));
  auto g = parse(gbnf);
  if (!g) return g.error().with_context("grammar made from the JSON schema");
  return g;
}

}  // namespace kite

// Constrained decoding: GBNF parsing and its errors, hostile grammars, matching strings, token
// masks on the real llama-target vocabulary (checked against brute force), JSON Schema
// compilation, and 1000 random walks under a schema whose outputs must parse and validate.
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "formats/weight_source.h"
#include "src/runtime/grammar/grammar.h"
#include "src/runtime/tokenizer.h"
#include "tests/testdata.h"

namespace {

using kite::Grammar;
using kite::GrammarMatcher;
using kite::TokenId;
using kite::TokenIndex;
using Json = nlohmann::json;

std::shared_ptr<const Grammar> must_parse(const std::string& text) {
  auto g = Grammar::parse(text);
  REQUIRE_MESSAGE(g.ok(), text, " -> ", (g.ok() ? "" : g.error().message));
  return g.value();
}

std::string parse_error(const std::string& text) {
  auto g = Grammar::parse(text);
  REQUIRE_MESSAGE(!g.ok(), "expected an error for: ", text);
  return g.error().message;
}

std::string schema_error(const std::string& schema) {
  auto g = Grammar::from_json_schema(schema);
  REQUIRE_MESSAGE(!g.ok(), "expected an error for: ", schema);
  return g.error().message;
}

// A matcher with no vocabulary: strings are fed as bytes.
std::shared_ptr<const TokenIndex> empty_index() {
  static auto idx = std::make_shared<const TokenIndex>();
  return idx;
}

bool matches(const std::shared_ptr<const Grammar>& g, const std::string& text) {
  GrammarMatcher m(g, empty_index());
  return m.accept_text(text).ok() && m.can_end();
}

std::shared_ptr<const kite::Tokenizer> llama_tokenizer() {
  static std::shared_ptr<const kite::Tokenizer> tok = [] {
    auto src = kite::WeightSource::open(kite::test::testdata("models/llama-target"));
    REQUIRE_MESSAGE(src.ok(), (src.ok() ? "" : src.error().message));
    auto t = kite::Tokenizer::load(src.value()->metadata());
    REQUIRE_MESSAGE(t.ok(), (t.ok() ? "" : t.error().message));
    return t.value();
  }();
  return tok;
}

std::shared_ptr<const TokenIndex> llama_index() {
  static auto idx = TokenIndex::build(*llama_tokenizer());
  return idx;
}

TEST_CASE("grammar: GBNF parse errors name line, column and what was expected") {
  CHECK(parse_error("root ::= \"a\"\nfoo ::= bar\n").find("line 2, column 9: undefined rule 'bar'") !=
        std::string::npos);
  CHECK(parse_error("root = \"a\"").find("line 1, column 6: expected '::='") != std::string::npos);
  CHECK(parse_error("root ::= \"abc").find("line 1, column 14: expected '\"' to end the string literal") !=
        std::string::npos);
  CHECK(parse_error("root ::= [a-z").find("expected ']' to close the class opened at line 1, column 10") !=
        std::string::npos);
  CHECK(parse_error("root ::= (\"a\" | \"b\"\n").find("expected ')' to close the group opened at line 1, column 10") !=
        std::string::npos);
  CHECK(parse_error("root ::= \"a\" )").find("line 1, column 14: expected end of line") != std::string::npos);
  CHECK(parse_error("root ::= \"\\q\"").find("line 1, column 11: unknown escape") != std::string::npos);
  CHECK(parse_error("root ::= [z-a]").find("range ends below its start") != std::string::npos);
  CHECK(parse_error("root ::= \"a\"{3,1}").find("maximum 1 is below the minimum 3") != std::string::npos);
  CHECK(parse_error("root ::= * \"a\"").find("line 1, column 10: '*' has nothing before it") != std::string::npos);
  CHECK(parse_error("root ::= \"a\"{2").find("expected ',' or '}'") != std::string::npos);
  CHECK(parse_error("root ::= \"\\xZZ\"").find("expected 2 hex digits") != std::string::npos);
  CHECK(parse_error("root ::= \"\\uD800\"").find("invalid code point") != std::string::npos);
  CHECK(parse_error("a ::= \"x\"").find("missing root rule 'root'") != std::string::npos);
  CHECK(parse_error("root ::= \"a\"\nroot ::= \"b\"").find("line 2, column 1: rule 'root' is defined twice") !=
        std::string::npos);
  CHECK(parse_error("root ::= a\na ::= \"x\" a")
            .find("can never finish (every alternative recurses without end): 'root', 'a'") != std::string::npos);
  CHECK(parse_error(std::string("root ::= \"\xff\"")).find("invalid UTF-8") != std::string::npos);
  // The root can be named.
  CHECK(Grammar::parse("start ::= \"x\"", "start").ok());
}

TEST_CASE("grammar: left recursion is rejected, direct, indirect and through nullable prefixes") {
  CHECK(parse_error("root ::= root \"a\" | \"b\"").find("left recursion: 'root' -> 'root'") != std::string::npos);
  const std::string indirect = parse_error("root ::= a\na ::= b \"x\" | \"y\"\nb ::= c\nc ::= a \"z\"");
  CHECK(indirect.find("left recursion: 'a' -> 'b' -> 'c' -> 'a'") != std::string::npos);
  CHECK(parse_error("root ::= opt root \"a\" | \"b\"\nopt ::= \"x\"?").find("left recursion") != std::string::npos);
  // A repetition of something that can match nothing would loop forever.
  CHECK(parse_error("root ::= (\"a\"?)*").find("left recursion") != std::string::npos);
  CHECK(parse_error("root ::= (\"a\" | \"\")+").find("left recursion") != std::string::npos);
  // Right recursion is fine.
  auto g = must_parse("root ::= \"a\" root | \"b\"");
  CHECK(matches(g, "aaab"));
  CHECK_FALSE(matches(g, "aaa"));
}

TEST_CASE("grammar: hostile sizes get a clear error quickly") {
  const auto start = std::chrono::steady_clock::now();
  CHECK(parse_error("root ::= \"a\"{100000}").find("repetition count above the limit") != std::string::npos);
  CHECK(parse_error("root ::= \"a\"{1,99999999999999999999}").find("above the limit") != std::string::npos);
  // Deep nesting.
  std::string deep = "root ::= " + std::string(500, '(') + "\"a\"" + std::string(500, ')');
  CHECK(parse_error(deep).find("nested deeper than") != std::string::npos);
  // A huge alternation (600k alternatives) runs into the element limit.
  std::string alts = "root ::= \"a\"";
  for (int i = 0; i < 600000; ++i) alts += "|\"b\"";
  CHECK(parse_error(alts).find("grammar too large") != std::string::npos);
  // Too many rules.
  std::string many = "root ::= r0\n";
  for (int i = 0; i < 30000; ++i) {
    many += 'r';  // (appended piece by piece: g++ 12 -O3 warns falsely, -Wrestrict, on "r" + string)
    many += std::to_string(i) + " ::= \"x\" r" + std::to_string(i + 1) + "?\n";
  }
  CHECK(parse_error(many).find("rules") != std::string::npos);
  // Nested repetitions that would be 10^12 elements if copied stay linear: they build and match.
  auto g = must_parse("root ::= (((\"a\"{1000}){1000}){1000}){1000}");
  GrammarMatcher m(g, empty_index());
  CHECK(m.accept_text(std::string(5000, 'a')).ok());
  CHECK_FALSE(m.can_end());
  CHECK_FALSE(m.accept_text("b").ok());
  // Many optional pieces in a row (each can be skipped): the matcher stays bounded and exact.
  auto opt = must_parse("root ::= " + [] {
    std::string s;
    for (int i = 0; i < 100; ++i) s += "\"a\"? ";
    return s;
  }());
  CHECK(matches(opt, std::string(100, 'a')));
  CHECK_FALSE(matches(opt, std::string(101, 'a')));
  // Too ambiguous: more parallel parses than the matcher keeps gives an error, not a blow-up.
  auto wide = must_parse("root ::= " + [] {
    std::string s;
    for (int i = 0; i < 3000; ++i) s += "\"a\"? ";
    return s;
  }());
  GrammarMatcher mw(wide, empty_index());
  auto st = mw.accept_text("a");
  REQUIRE_FALSE(st.ok());
  CHECK(st.error().message.find("too ambiguous") != std::string::npos);
  // Text over the size limit.
  CHECK(parse_error(std::string(5 << 20, ' ')).find("more than the limit") != std::string::npos);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(s < 5.0);
}

TEST_CASE("grammar: strings accepted and rejected") {
  auto g = must_parse(R"(# a comment line
root ::= greeting ( ", " name )? "!"{1,3}   # trailing comment
greeting ::= "hello" | "hi"
name ::= [A-Z] [a-z]*
)");
  CHECK(matches(g, "hello!"));
  CHECK(matches(g, "hi, Bob!!!"));
  CHECK_FALSE(matches(g, "hi, Bob!!!!"));
  CHECK_FALSE(matches(g, "hi, bob!"));
  CHECK_FALSE(matches(g, "hello"));

  auto esc = must_parse(R"(root ::= "\x41\u00e9\U0001F600\n\t\"\\" [^a-c\]] .)");
  CHECK(matches(esc, "A\xc3\xa9\xf0\x9f\x98\x80\n\t\"\\d\xe4\xb8\xad"));
  CHECK_FALSE(matches(esc, "A\xc3\xa9\xf0\x9f\x98\x80\n\t\"\\b\xe4\xb8\xad"));
  CHECK_FALSE(matches(esc, "A\xc3\xa9\xf0\x9f\x98\x80\n\t\"\\]x"));

  auto cls = must_parse("root ::= [α-ω0-9_]{2,4}");
  CHECK(matches(cls, "αβ"));
  CHECK(matches(cls, "ω9_"));
  CHECK_FALSE(matches(cls, "a"));
  CHECK_FALSE(matches(cls, "αβγδε"));

  auto counts = must_parse("root ::= \"a\"{3} \"b\"{2,} \"c\"{,2}");
  CHECK(matches(counts, "aaabb"));
  CHECK(matches(counts, "aaabbbbcc"));
  CHECK_FALSE(matches(counts, "aabb"));
  CHECK_FALSE(matches(counts, "aaab"));
  CHECK_FALSE(matches(counts, "aaabbccc"));

  // Invalid UTF-8 never matches, not even for `.`.
  auto any = must_parse("root ::= .+");
  CHECK(matches(any, "x\xe2\x82\xac"));
  CHECK_FALSE(matches(any, "\xc0\x80"));
  CHECK_FALSE(matches(any, "\xed\xa0\x80"));
  GrammarMatcher m(any, empty_index());
  CHECK(m.accept_text("\xe2\x82").ok());  // a character split across tokens
  CHECK_FALSE(m.can_end());
  CHECK(m.accept_text("\xac").ok());
  CHECK(m.can_end());

  auto json = Grammar::json_any();
  REQUIRE(json);
  CHECK(matches(json, R"({"a": [1, -2.5e3, true, null, "x\"\u00e9"], "b": {}})"));
  CHECK(matches(json, "{\n  \"a\": 1\n}"));
  CHECK_FALSE(matches(json, R"({"a": 01})"));
  CHECK_FALSE(matches(json, R"({"a" 1})"));
  CHECK_FALSE(matches(json, "{" + std::string(30, ' ') + "}"));  // whitespace is bounded
}

// For `root ::= "yes" | "no"`, the allowed tokens are exactly those whose bytes are a prefix.
TEST_CASE("grammar: masks on the llama-target vocabulary match brute force") {
  auto tok = llama_tokenizer();
  auto idx = llama_index();
  REQUIRE(idx->n_vocab() == tok->n_vocab());
  auto g = must_parse(R"(root ::= "yes" | "no" | "not " [a-z]+)");
  GrammarMatcher m(g, idx);
  std::vector<uint8_t> mask;
  for (const std::string& prefix : {std::string(), std::string("n"), std::string("no"), std::string("not ")}) {
    GrammarMatcher mm(g, idx);
    REQUIRE(mm.accept_text(prefix).ok());
    mm.fill_mask(mask);
    size_t n_allowed = 0;
    for (TokenId id = 0; id < tok->n_vocab(); ++id) {
      const std::string b = tok->token_bytes(id);
      const std::string text = prefix + b;
      bool expect = false;
      if (!tok->is_control(id) && !tok->is_eog(id) && !b.empty()) {
        auto is_prefix = [&](const std::string& w) {
          return text.size() <= w.size() && w.compare(0, text.size(), text) == 0;
        };
        expect = is_prefix("yes") || is_prefix("no") || is_prefix("not ");
        if (text.size() > 4 && text.compare(0, 4, "not ") == 0) {
          expect = true;
          for (size_t i = 4; i < text.size(); ++i) expect = expect && text[i] >= 'a' && text[i] <= 'z';
        }
      }
      if (tok->is_eog(id)) expect = prefix == "no";
      CHECK_MESSAGE(mask[id] == expect, "prefix '", prefix, "' token ", id, " '", b, "'");
      CHECK(mm.accepts(id) == expect);
      n_allowed += mask[id];
    }
    CHECK(n_allowed > 0);
  }
  // apply() leaves allowed logits alone and sets the rest to -inf; control tokens never pass.
  std::vector<float> logits(tok->n_vocab(), 1.0f);
  m.apply(logits);
  CHECK(std::isinf(logits[0]));  // <|begin_of_text|>
  CHECK(std::isinf(logits[2]));  // <|start_header_id|>
  CHECK(std::isinf(logits[1]));  // EOS: the grammar cannot end yet
  const auto yes = tok->find_token("yes");
  if (yes) CHECK(logits[*yes] == 1.0f);
  CHECK_FALSE(m.accept(0).ok());
  CHECK_FALSE(m.accept(1).ok());
  REQUIRE(m.accept_text("no").ok());
  CHECK(m.can_end());
  CHECK_FALSE(m.done());  // "not ..." may still follow
  CHECK(m.accept(1).ok());
  CHECK(m.done());
  // After the end only the end again.
  CHECK(m.accepts(1));
  CHECK_FALSE(m.accept_text("x").ok());
  m.fill_mask(mask);
  for (TokenId id = 0; id < tok->n_vocab(); ++id) CHECK((mask[id] != 0) == tok->is_eog(id));
}

// The mask pass (trie walk, whole subtrees accepted at once) agrees with checking every token
// byte by byte, along random paths through grammars with loops, bounded runs, non-ASCII classes
// and ambiguity.
TEST_CASE("grammar: trie masks equal per-token checks on varied grammars") {
  auto idx = llama_index();
  const std::vector<std::string> grammars = {
      R"(root ::= "\"" [a-z ]{0,5} "\"")",      R"(root ::= "\"" [^"]* "\"" [0-9]{2,3})",
      R"(root ::= ([α-ωa-c] | "\u00e9")+ "!")", R"(root ::= .{0,6} "end")",
      R"(root ::= ("ab" | "a" "b"?)* "c")",     R"(root ::= [^\x00-\x7F]* [a-z]+)",
  };
  std::mt19937 rng(7);
  std::vector<uint8_t> mask;
  for (const auto& text : grammars) {
    auto g = must_parse(text);
    for (int walk = 0; walk < 4; ++walk) {
      GrammarMatcher m(g, idx);
      for (int step = 0; step < 10; ++step) {
        m.fill_mask(mask);
        std::vector<TokenId> allowed;
        for (TokenId id = 0; id < idx->n_vocab(); ++id) {
          REQUIRE_MESSAGE(m.accepts(id) == (mask[id] != 0), text, " token ", id);
          if (mask[id] && idx->is_text(id)) allowed.push_back(id);
        }
        if (allowed.empty()) break;
        REQUIRE(m.accept(allowed[rng() % allowed.size()]).ok());
      }
    }
  }
}

TEST_CASE("grammar: a token may end inside a UTF-8 character") {
  auto tok = llama_tokenizer();
  auto idx = llama_index();
  TokenId lead = kite::kNoToken, cont = kite::kNoToken, whole = kite::kNoToken;
  for (TokenId id = 0; id < tok->n_vocab(); ++id) {
    const std::string b = tok->token_bytes(id);
    if (b == "\xc3") lead = id;
    if (b == "\xa9") cont = id;
    if (b == "\xc3\xa9") whole = id;
  }
  REQUIRE(lead != kite::kNoToken);
  REQUIRE(cont != kite::kNoToken);
  auto g = must_parse("root ::= \"\xc3\xa9!\"");
  GrammarMatcher m(g, idx);
  CHECK(m.accepts(lead));
  CHECK_FALSE(m.accepts(cont));
  if (whole != kite::kNoToken) CHECK(m.accepts(whole));
  REQUIRE(m.accept(lead).ok());
  std::vector<uint8_t> mask;
  m.fill_mask(mask);
  CHECK(mask[cont] == 1);
  CHECK(mask[lead] == 0);
  CHECK(mask[1] == 0);  // no EOS in the middle of a character
  REQUIRE(m.accept(cont).ok());
  CHECK_FALSE(m.can_end());
  REQUIRE(m.accept_text("!").ok());
  CHECK(m.done());
  // "é" only: a lone 0xC3 followed by a byte that makes another character is refused.
  auto g2 = must_parse("root ::= [a-z\xc3\xa9]+");
  GrammarMatcher m2(g2, idx);
  REQUIRE(m2.accept(lead).ok());
  for (TokenId id = 0; id < tok->n_vocab(); ++id) {
    const std::string b = tok->token_bytes(id);
    if (b.size() == 1 && static_cast<unsigned char>(b[0]) >= 0x80 && static_cast<unsigned char>(b[0]) < 0xc0)
      CHECK(m2.accepts(id) == (b == "\xa9"));
  }
}

TEST_CASE("grammar: JSON schema errors name the keyword and path") {
  CHECK(schema_error(R"({"type":"string","pattern":"^a"})").find("keyword 'pattern' at #/pattern is not supported") !=
        std::string::npos);
  CHECK(schema_error(R"({"properties":{"a":{"type":"integer","minimum":3}}})")
            .find("'minimum' at #/properties/a/minimum") != std::string::npos);
  CHECK(schema_error(R"({"$ref":"#/$defs/missing"})").find("points at nothing") != std::string::npos);
  CHECK(schema_error(R"({"properties":{"a":{}},"required":["b"]})").find("names 'b', which is not in") !=
        std::string::npos);
  CHECK(schema_error(R"({"type":"strin"})").find("unknown type 'strin'") != std::string::npos);
  CHECK(schema_error(R"({"type":"array","minItems":3,"maxItems":2})").find("maxItems 2 is below minItems 3") !=
        std::string::npos);
  CHECK(schema_error(R"({"type": )").find("not valid JSON") != std::string::npos);
  CHECK(schema_error(R"({"$ref":"#"})").find("left recursion") != std::string::npos);
  CHECK(schema_error(R"({"allOf":[{"type":"string"}]})").find("'allOf'") != std::string::npos);
  std::string deep = "{}";
  for (int i = 0; i < 200; ++i) deep = R"({"type":"array","items":)" + deep + "}";
  CHECK(schema_error(deep).find("nested deeper than") != std::string::npos);
  // Recursion through $ref is fine when something is consumed first.
  auto g =
      Grammar::from_json_schema(R"({"$defs":{"t":{"type":"array","items":{"$ref":"#/$defs/t"}}},"$ref":"#/$defs/t"})");
  REQUIRE_MESSAGE(g.ok(), (g.ok() ? "" : g.error().message));
  CHECK(matches(g.value(), "[[], [[]]]"));
  CHECK_FALSE(matches(g.value(), "[1]"));
}

// ---- random walks under a schema --------------------------------------------------------------

const char* kSchema = R"({
  "$defs": {
    "tag": {"type": "object",
            "properties": {"name": {"type": "string", "maxLength": 8}, "weight": {"type": "number"}},
            "required": ["name"]},
    "node": {"type": "object",
             "properties": {"id": {"type": "integer"},
                            "children": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}},
             "required": ["id"]}
  },
  "definitions": {"color": {"enum": ["red", "green", "blue", 7, null]}},
  "type": "object",
  "properties": {
    "id": {"type": "integer"},
    "name": {"type": "string", "minLength": 1, "maxLength": 12, "description": "a name"},
    "color": {"$ref": "#/definitions/color"},
    "active": {"type": "boolean"},
    "score": {"type": ["number", "null"]},
    "tags": {"type": "array", "items": {"$ref": "#/$defs/tag"}, "minItems": 1, "maxItems": 3},
    "kind": {"const": "widget"},
    "extra": {"anyOf": [{"type": "null"}, {"type": "integer"},
                        {"type": "array", "items": {"type": "boolean"}, "maxItems": 4}]},
    "tree": {"$ref": "#/$defs/node"},
    "map": {"type": "object", "additionalProperties": {"type": "integer"}}
  },
  "required": ["id", "name", "tags", "kind"]
})";

size_t utf8_length(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xc0) != 0x80;
  return n;
}

// Validates the subset of JSON Schema the compiler supports; returns "" or what is wrong.
std::string validate(const Json& v, const Json& s, const Json& root, const std::string& at) {
  if (s.is_boolean()) return s.get<bool>() ? "" : at + ": false schema";
  if (s.contains("$ref")) {
    const std::string ref = s["$ref"];
    return validate(v, root.at(Json::json_pointer(ref.substr(1))), root, at);
  }
  for (const char* k : {"anyOf", "oneOf"}) {
    if (!s.contains(k)) continue;
    int n = 0;
    for (const auto& sub : s[k]) n += validate(v, sub, root, at).empty();
    if (n == 0 || (std::string(k) == "oneOf" && n != 1)) return at + ": " + k + " matched " + std::to_string(n);
  }
  if (s.contains("const") && v != s["const"]) return at + ": const";
  if (s.contains("enum")) {
    bool found = false;
    for (const auto& e : s["enum"]) found = found || e == v;
    if (!found) return at + ": not in enum";
  }
  if (s.contains("type")) {
    std::vector<std::string> types;
    if (s["type"].is_string())
      types.push_back(s["type"]);
    else
      for (const auto& t : s["type"]) types.push_back(t);
    bool ok = false;
    for (const auto& t : types) {
      ok = ok || (t == "object" && v.is_object()) || (t == "array" && v.is_array()) ||
           (t == "string" && v.is_string()) || (t == "integer" && v.is_number_integer()) ||
           (t == "number" && v.is_number()) || (t == "boolean" && v.is_boolean()) || (t == "null" && v.is_null());
    }
    if (!ok) return at + ": wrong type " + v.type_name();
  }
  if (v.is_object()) {
    if (s.contains("required"))
      for (const auto& r : s["required"])
        if (!v.contains(r.get<std::string>())) return at + ": missing " + r.get<std::string>();
    for (const auto& [k, x] : v.items()) {
      if (s.contains("properties") && s["properties"].contains(k)) {
        auto e = validate(x, s["properties"][k], root, at + "/" + k);
        if (!e.empty()) return e;
      } else if (s.contains("additionalProperties")) {
        auto e = validate(x, s["additionalProperties"], root, at + "/" + k);
        if (!e.empty()) return e;
      } else if (s.contains("properties")) {
        return at + ": unexpected property " + k;
      }
    }
  }
  if (v.is_array()) {
    if (s.contains("minItems") && v.size() < s["minItems"].get<size_t>()) return at + ": too few items";
    if (s.contains("maxItems") && v.size() > s["maxItems"].get<size_t>()) return at + ": too many items";
    if (s.contains("items"))
      for (size_t i = 0; i < v.size(); ++i) {
        auto e = validate(v[i], s["items"], root, at + "/" + std::to_string(i));
        if (!e.empty()) return e;
      }
  }
  if (v.is_string()) {
    const size_t n = utf8_length(v.get<std::string>());
    if (s.contains("minLength") && n < s["minLength"].get<size_t>()) return at + ": too short";
    if (s.contains("maxLength") && n > s["maxLength"].get<size_t>()) return at + ": too long";
  }
  return "";
}

TEST_CASE("grammar: 1000 random walks under a JSON schema parse and validate") {
  auto tok = llama_tokenizer();
  auto idx = llama_index();
  auto g = Grammar::from_json_schema(kSchema);
  REQUIRE_MESSAGE(g.ok(), (g.ok() ? "" : g.error().message));
  const Json schema = Json::parse(kSchema);
  const GrammarMatcher fresh(g.value(), idx);  // copies share its transition cache
  std::mt19937 rng(1234);
  std::vector<uint8_t> mask;
  std::vector<TokenId> allowed, closing;
  size_t total_tokens = 0, checked_masks = 0, with_optional = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int sample = 0; sample < 1000; ++sample) {
    GrammarMatcher m = fresh;
    std::string text;
    const int free_steps = static_cast<int>(rng() % 24);
    bool ended = false;
    for (int step = 0; step < 400 && !ended; ++step) {
      m.fill_mask(mask);
      if (sample < 3) {  // the trie walk agrees with checking each token on its own
        for (TokenId id = 0; id < idx->n_vocab(); ++id) REQUIRE(m.accepts(id) == (mask[id] != 0));
        ++checked_masks;
      }
      allowed.clear();
      closing.clear();
      bool eog_ok = false;
      for (TokenId id = 0; id < idx->n_vocab(); ++id) {
        if (!mask[id]) continue;
        const bool is_control_only = tok->is_control(id) && !tok->is_eog(id);
        REQUIRE_FALSE(is_control_only);
        if (tok->is_eog(id)) {
          eog_ok = true;
          continue;
        }
        allowed.push_back(id);
        const std::string_view b = idx->bytes(id);
        if (b.find_first_of("\"}]") != std::string_view::npos) closing.push_back(id);
      }
      REQUIRE_MESSAGE((!allowed.empty() || eog_ok), "stuck after: ", text);
      CHECK(eog_ok == m.can_end());
      const bool finishing = step >= free_steps;
      if (eog_ok && (finishing || rng() % 8 == 0 || allowed.empty())) {
        REQUIRE(m.accept(tok->eos()).ok());
        ended = true;
        break;
      }
      const auto& pool = (finishing && !closing.empty() && rng() % 8 != 0) ? closing : allowed;
      const TokenId t = pool[rng() % pool.size()];
      auto st = m.accept(t);
      REQUIRE_MESSAGE(st.ok(), (st.ok() ? "" : st.error().message));
      text += idx->bytes(t);
      ++total_tokens;
    }
    REQUIRE_MESSAGE(ended, "sample ", sample, " did not finish: ", text);
    Json v = Json::parse(text, nullptr, false);
    REQUIRE_MESSAGE(!v.is_discarded(), "sample ", sample, " is not JSON: ", text);
    with_optional += v.size() > 4;  // more than the 4 required properties
    const std::string err = validate(v, schema, schema, "#");
    CHECK_MESSAGE(err.empty(), "sample ", sample, ": ", err, "\n", text);
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  MESSAGE("1000 samples, ", total_tokens, " tokens, ", with_optional, " with optional properties, ", checked_masks,
          " masks checked by brute force, ", s, " s");
  CHECK(total_tokens > 5000);
  CHECK(with_optional > 100);  // the walks explore optional properties, not just the minimum
}

}  // namespace

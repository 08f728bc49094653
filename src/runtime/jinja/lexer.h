// kite/src/runtime/jinja/lexer.h — template source to tokens, with jinja2's whitespace rules.
//
// Follows jinja2's lexer as configured by transformers: newlines normalized to "\n", one trailing
// newline dropped (keep_trailing_newline=False), trim_blocks and lstrip_blocks on, `-`/`+`
// whitespace control on every tag, comments dropped, raw blocks passed through as text.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "src/base/status.h"

namespace kite::jinja {

enum class Tok : uint8_t {
  kText,        // template data between tags
  kVarBegin,    // {{
  kVarEnd,      // }}
  kBlockBegin,  // {%
  kBlockEnd,    // %}
  kName,
  kString,
  kInt,
  kFloat,
  kOp,  // operators and punctuation: + - * / // % ** ~ == != < <= > >= = . , : | ( ) [ ] { }
  kEnd,
};

struct Token {
  Tok type = Tok::kEnd;
  std::string text;  // name, decoded string literal, operator or data
  int64_t int_value = 0;
  double float_value = 0;
  int line = 1;
  int column = 1;
};

struct LexOptions {
  bool trim_blocks = true;
  bool lstrip_blocks = true;
  bool keep_trailing_newline = false;
};

// Tokenizes `source`. Errors (unterminated tag, comment or string, unbalanced brackets) name the
// line and column.
Result<std::vector<Token>> tokenize(std::string_view source, const LexOptions& options = {});

}  // namespace kite::jinja

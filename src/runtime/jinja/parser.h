// kite/src/runtime/jinja/parser.h — tokens to a statement tree, with jinja2's grammar and
// operator precedence (or < and < not < comparisons < + - < ~ < * / // % < ** < unary < filters,
// tests, attribute access, subscripts and calls).
#pragma once

#include <string_view>

#include "src/base/status.h"
#include "src/runtime/jinja/ast.h"
#include "src/runtime/jinja/lexer.h"

namespace kite::jinja {

struct ParseOptions {
  LexOptions lex;
  // Nesting bound for expressions and blocks, so hostile sources cannot exhaust the stack.
  int max_depth = 128;
};

Result<Body> parse_template(std::string_view source, const ParseOptions& options = {});

}  // namespace kite::jinja

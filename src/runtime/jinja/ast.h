// kite/src/runtime/jinja/ast.h — the parsed template: expression and statement nodes.
//
// Nodes are immutable after parsing; the interpreter walks them. Every node keeps the line and
// column of its first token for error messages.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "src/runtime/jinja/value.h"

namespace kite::jinja {

struct Expr;
struct Stmt;
using ExprPtr = std::unique_ptr<Expr>;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

enum class ExprKind {
  kLiteral,   // value
  kName,      // name
  kList,      // items
  kTuple,     // items
  kDict,      // items as key, value, key, value...
  kGetAttr,   // a.name
  kGetItem,   // a[b]
  kSlice,     // a[b:c:d]; absent parts are null
  kCall,      // a(args)
  kFilter,    // a | name(args); `a` null inside {% filter %} blocks
  kTest,      // a is [not] name(args)
  kUnary,     // op: not, -, +
  kBinary,    // op: + - * / // % ** ~ and or
  kCompare,   // a op b op c ... (chained like Python)
  kCondition, // a if cond else b
};

struct CallArgsExpr {
  std::vector<ExprPtr> positional;
  std::vector<std::pair<std::string, ExprPtr>> keyword;
};

struct Expr {
  ExprKind kind;
  int line = 0;
  int column = 0;
  Value value;                          // kLiteral
  std::string name;                     // kName, kGetAttr, kFilter, kTest, kUnary/kBinary op
  ExprPtr a, b, c, d;                   // operands (see ExprKind)
  std::vector<ExprPtr> items;           // kList, kTuple, kDict, kCompare (operands after a)
  std::vector<std::string> ops;         // kCompare operators
  CallArgsExpr args;                    // kCall, kFilter, kTest
  bool negated = false;                 // kTest

  Expr(ExprKind k, int l, int c) : kind(k), line(l), column(c) {}
};

enum class StmtKind {
  kText,      // text
  kOutput,    // {{ expr }}
  kIf,        // conditions[i] -> bodies[i]; else_body
  kFor,       // targets in expr [if filter] body [else else_body]
  kSet,       // targets = expr, or ns.attr = expr (attr set), or block set (body, filters)
  kMacro,     // name(params) body
  kCallBlock, // {% call(params) expr %} body
  kFilterBlock,
  kBreak,
  kContinue,
  kWith,      // assignments then body
};

struct MacroParam {
  std::string name;
  ExprPtr default_value;  // null: required
};

struct Stmt {
  StmtKind kind;
  int line = 0;
  int column = 0;
  std::string text;                  // kText; kSet: namespace attribute name (when non-empty)
  ExprPtr expr;                      // kOutput, kFor iterable, kSet value, kCallBlock call
  ExprPtr filter;                    // kFor condition; kSet/kFilterBlock filter chain
  std::vector<std::string> targets;  // kFor/kSet names (more than one: tuple unpacking)
  std::vector<ExprPtr> conditions;   // kIf
  std::vector<Body> bodies;          // kIf branches
  Body body;                         // kFor, kMacro, kCallBlock, kFilterBlock, block kSet, kWith
  Body else_body;                    // kIf, kFor
  std::string name;                  // kMacro
  std::vector<MacroParam> params;    // kMacro, kCallBlock
  std::vector<std::pair<std::string, ExprPtr>> assignments;  // kWith
  bool recursive = false;            // kFor
  bool block_set = false;            // kSet

  Stmt(StmtKind k, int l, int c) : kind(k), line(l), column(c) {}
};

}  // namespace kite::jinja

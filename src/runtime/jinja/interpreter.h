// kite/src/runtime/jinja/interpreter.h — renders a parsed template against a context.
//
// Semantics follow jinja2 3.1 in transformers' ImmutableSandboxedEnvironment: Python-like
// values, jinja2's default Undefined, the sandbox's refusal to mutate lists and dicts, for-loop
// and macro scoping. Untrusted templates are bounded by Limits: every loop iteration and macro
// call costs one step of a per-render budget, macro recursion has a depth cap, and strings,
// collections and the output have size caps. Exceeding any of them fails the render with a
// message naming the limit.
#pragma once

#include <ctime>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>

#include "src/runtime/jinja/ast.h"
#include "src/runtime/jinja/value.h"

namespace kite::jinja {

struct Limits {
  size_t max_output_bytes = size_t{32} << 20;  // rendered text, and any one string value
  uint64_t max_steps = 1'000'000;              // loop iterations + macro calls per render
  size_t max_collection_size = 1'000'000;      // range(), list repetition
  int max_call_depth = 256;                    // nested macro calls
  int max_parse_depth = 128;                   // nested expressions / blocks in the source
  // Bytes of strings built in one render (output, concatenations, filters): bounds the work a
  // loop that keeps rebuilding large strings can cause.
  size_t max_total_bytes = size_t{256} << 20;
};

struct RenderOptions {
  Limits limits;
  // The local time strftime_now() formats; unset: the real local time at the call.
  std::function<std::tm()> clock;
};

struct Scope {
  std::unordered_map<std::string, Value> vars;
  std::shared_ptr<Scope> parent;

  const Value* find(const std::string& name) const;
};

class Interpreter {
 public:
  explicit Interpreter(const RenderOptions& options);

  // Renders `body` with `context` (a dict of top-level names). Throws TemplateError.
  std::string render(const Body& body, const Value& context);

  // Services for filters, tests, methods and globals.
  Value call(const Value& callee, CallArgs& args);
  Value apply_filter(const std::string& name, const Value& value, CallArgs& args);
  bool apply_test(const std::string& name, const Value& value, CallArgs& args);
  Value get_attr(const Value& obj, const std::string& name);
  Value get_item(const Value& obj, const Value& key);
  // Python iteration: list items, dict keys, string characters; undefined is empty.
  std::vector<Value> iterate(const Value& v);
  void check_string_size(size_t bytes) const;
  // Adds `bytes` to the render's total of built string bytes; throws past max_total_bytes.
  void count_bytes(size_t bytes);
  void check_collection_size(size_t n) const;
  void count_steps(uint64_t n);
  const RenderOptions& options() const { return options_; }
  std::tm now() const;
  // Namespaces are the one mutable object and can end up containing themselves; the interpreter
  // empties them after a render so no reference cycle outlives it.
  void track_namespace(const Value& ns) { namespaces_.push_back(ns); }
  // Runs a macro (or a call block's caller) defined by `s` in a child of `closure`.
  Value call_macro(const Stmt& s, const std::shared_ptr<Scope>& closure, CallArgs& args);

 private:
  enum class Flow { kNormal, kBreak, kContinue };

  void release();
  Flow exec(const Body& body, std::string& out);
  Flow exec_stmt(const Stmt& s, std::string& out);
  Flow exec_for(const Stmt& s, std::string& out);
  void exec_set(const Stmt& s);
  void exec_macro(const Stmt& s);
  void exec_call_block(const Stmt& s, std::string& out);
  Value make_macro(const Stmt& s, const std::shared_ptr<Scope>& closure);
  void assign(const std::vector<std::string>& targets, const Value& v);
  void append_output(std::string& out, std::string_view text);

  Value eval(const Expr& e);
  Value eval_name(const Expr& e);
  Value eval_call(const Expr& e);
  Value eval_filter(const Expr& e, const Value* operand);
  Value eval_test(const Expr& e);
  Value eval_compare(const Expr& e);
  Value eval_slice(const Expr& e);
  CallArgs eval_args(const CallArgsExpr& a);

  RenderOptions options_;
  std::shared_ptr<Scope> scope_;
  // Scopes that macros close over; cleared after a render to break reference cycles.
  std::vector<std::shared_ptr<Scope>> closures_;
  std::vector<Value> namespaces_;
  uint64_t steps_ = 0;
  size_t bytes_ = 0;
  int call_depth_ = 0;
  const Expr* where_ = nullptr;  // innermost expression being evaluated, for error locations
  int stmt_line_ = 0;
  int stmt_column_ = 0;
};

// Builtins (builtins.cpp, methods.cpp, operators.cpp).
using FilterFn = Value (*)(Interpreter&, const Value&, CallArgs&);
using TestFn = bool (*)(Interpreter&, const Value&, CallArgs&);
FilterFn find_filter(const std::string& name);
TestFn find_test(const std::string& name);
void add_globals(Scope& scope);

// The bound method or attribute `name` of a str, list, dict or namespace value; an undefined
// (carrying jinja2's message) when there is none; an unsafe undefined for mutating methods.
Value get_method(Interpreter& in, const Value& obj, const std::string& name);
// Python's str.format and printf-style `%`.
std::string python_format(const std::string& fmt, const CallArgs& args);
std::string percent_format(const std::string& fmt, const Value& args);

Value binary_op(Interpreter& in, const std::string& op, const Value& a, const Value& b);
Value unary_op(const std::string& op, const Value& a);
bool contains(const Value& container, const Value& item);
// jinja2's "'dict object'" style description used in undefined-attribute messages.
std::string object_description(const Value& v);

}  // namespace kite::jinja

// kite/src/runtime/jinja/interpreter.cpp — statement execution and expression evaluation.
// Filters, tests, globals, methods and operators live in builtins.cpp, methods.cpp and
// operators.cpp.
#include "src/runtime/jinja/interpreter.h"

#include <algorithm>
#include <utility>

#include "src/runtime/jinja/utf8.h"

namespace kite::jinja {

const Value* Scope::find(const std::string& name) const {
  for (const Scope* s = this; s; s = s->parent.get()) {
    auto it = s->vars.find(name);
    if (it != s->vars.end()) return &it->second;
  }
  return nullptr;
}

namespace {

// Swaps the interpreter's current scope for the lifetime of the guard.
class ScopeGuard {
 public:
  ScopeGuard(std::shared_ptr<Scope>& slot, std::shared_ptr<Scope> next) : slot_(slot), saved_(std::move(slot)) {
    slot_ = std::move(next);
  }
  ~ScopeGuard() { slot_ = std::move(saved_); }

 private:
  std::shared_ptr<Scope>& slot_;
  std::shared_ptr<Scope> saved_;
};

std::shared_ptr<Scope> child_of(const std::shared_ptr<Scope>& parent) {
  auto s = std::make_shared<Scope>();
  s->parent = parent;
  return s;
}

}  // namespace

Interpreter::Interpreter(const RenderOptions& options) : options_(options) {}

std::tm Interpreter::now() const {
  if (options_.clock) return options_.clock();
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  return tm;
}

void Interpreter::check_string_size(size_t bytes) const {
  if (bytes > options_.limits.max_output_bytes)
    throw_error("LimitError: string of " + std::to_string(bytes) + " bytes exceeds the limit of " +
                std::to_string(options_.limits.max_output_bytes) + " bytes");
}

void Interpreter::check_collection_size(size_t n) const {
  if (n > options_.limits.max_collection_size)
    throw_error("LimitError: collection of " + std::to_string(n) + " items exceeds the limit of " +
                std::to_string(options_.limits.max_collection_size));
}

void Interpreter::count_steps(uint64_t n) {
  steps_ += n;
  if (steps_ > options_.limits.max_steps)
    throw_error("LimitError: more than " + std::to_string(options_.limits.max_steps) +
                " loop iterations and macro calls in one render");
}

void Interpreter::count_bytes(size_t bytes) {
  bytes_ += bytes;
  if (bytes_ > options_.limits.max_total_bytes)
    throw_error("LimitError: more than " + std::to_string(options_.limits.max_total_bytes) +
                " bytes of strings built in one render");
}

void Interpreter::append_output(std::string& out, std::string_view text) {
  check_string_size(out.size() + text.size());
  count_bytes(text.size());
  out.append(text);
}

std::string Interpreter::render(const Body& body, const Value& context) {
  auto globals = std::make_shared<Scope>();
  add_globals(*globals);
  auto top = child_of(globals);
  if (context.is_dict())
    for (const auto& [k, v] : context.dict_data().entries)
      if (k.is_string()) top->vars[k.as_string()] = v;
  scope_ = top;
  steps_ = 0;
  bytes_ = 0;
  call_depth_ = 0;
  std::string out;
  try {
    exec(body, out);
  } catch (const TemplateError& e) {
    const int line = where_ ? where_->line : stmt_line_;
    const int column = where_ ? where_->column : stmt_column_;
    release();
    if (line > 0)
      throw TemplateError(e.message() + " (at line " + std::to_string(line) + ", column " + std::to_string(column) + ")");
    throw;
  } catch (...) {
    release();
    throw;
  }
  release();
  return out;
}

void Interpreter::release() {
  for (auto& s : closures_) s->vars.clear();
  closures_.clear();
  for (auto& ns : namespaces_) ns.mutable_dict_data().entries.clear();
  namespaces_.clear();
  scope_.reset();
}

Interpreter::Flow Interpreter::exec(const Body& body, std::string& out) {
  for (const auto& s : body) {
    Flow f = exec_stmt(*s, out);
    if (f != Flow::kNormal) return f;
  }
  return Flow::kNormal;
}

Interpreter::Flow Interpreter::exec_stmt(const Stmt& s, std::string& out) {
  stmt_line_ = s.line;
  stmt_column_ = s.column;
  where_ = nullptr;
  switch (s.kind) {
    case StmtKind::kText:
      append_output(out, s.text);
      return Flow::kNormal;
    case StmtKind::kOutput: {
      Value v = eval(*s.expr);
      append_output(out, v.str());
      return Flow::kNormal;
    }
    case StmtKind::kIf:
      for (size_t i = 0; i < s.conditions.size(); ++i)
        if (eval(*s.conditions[i]).truthy()) return exec(s.bodies[i], out);
      return exec(s.else_body, out);
    case StmtKind::kFor:
      return exec_for(s, out);
    case StmtKind::kSet:
      exec_set(s);
      return Flow::kNormal;
    case StmtKind::kMacro:
      exec_macro(s);
      return Flow::kNormal;
    case StmtKind::kCallBlock:
      exec_call_block(s, out);
      return Flow::kNormal;
    case StmtKind::kFilterBlock: {
      std::string inner;
      {
        ScopeGuard g(scope_, child_of(scope_));
        exec(s.body, inner);
      }
      Value v = Value::string(std::move(inner));
      append_output(out, eval_filter(*s.filter, &v).str());
      return Flow::kNormal;
    }
    case StmtKind::kBreak:
      return Flow::kBreak;
    case StmtKind::kContinue:
      return Flow::kContinue;
    case StmtKind::kWith: {
      auto inner = child_of(scope_);
      for (const auto& [name, expr] : s.assignments) inner->vars[name] = eval(*expr);
      ScopeGuard g(scope_, inner);
      return exec(s.body, out);
    }
  }
  return Flow::kNormal;
}

void Interpreter::assign(const std::vector<std::string>& targets, const Value& v) {
  if (targets.size() == 1) {
    scope_->vars[targets[0]] = v;
    return;
  }
  std::vector<Value> items;
  if (v.is_list() && !v.is_generator()) {
    items = v.items();
  } else {
    items = iterate(v);
  }
  if (items.size() != targets.size())
    throw_error(std::string("ValueError: ") + (items.size() > targets.size() ? "too many" : "not enough") +
                " values to unpack (expected " + std::to_string(targets.size()) + ", got " +
                std::to_string(items.size()) + ")");
  for (size_t i = 0; i < targets.size(); ++i) scope_->vars[targets[i]] = items[i];
}

Interpreter::Flow Interpreter::exec_for(const Stmt& s, std::string& out) {
  const Value iterable = eval(*s.expr);
  std::vector<Value> owned;
  const bool shared = iterable.is_list() && !s.filter;  // lists are immutable: iterate in place
  if (!shared) owned = iterate(iterable);
  const std::vector<Value>& items = shared ? iterable.items() : owned;
  auto loop_scope = child_of(scope_);
  ScopeGuard g(scope_, loop_scope);
  if (s.filter) {
    std::vector<Value> kept;
    for (auto& item : owned) {
      count_steps(1);
      assign(s.targets, item);
      if (eval(*s.filter).truthy()) kept.push_back(std::move(item));
    }
    owned = std::move(kept);
  }
  const size_t n = items.size();
  // loop.cycle reads the current index through a shared counter: one function per loop.
  auto index = std::make_shared<size_t>(0);
  const Value cycle = Value::function("cycle", [index](Interpreter&, CallArgs& a) -> Value {
    if (a.positional.empty()) throw_error("TypeError: no items for cycling given");
    return a.positional[*index % a.positional.size()];
  });
  static const Value kKeys[] = {Value::string("index"),    Value::string("index0"), Value::string("revindex"),
                                Value::string("revindex0"), Value::string("first"),  Value::string("last"),
                                Value::string("length"),   Value::string("depth"),  Value::string("depth0"),
                                Value::string("cycle"),    Value::string("previtem"), Value::string("nextitem")};
  for (size_t i = 0; i < n; ++i) {
    count_steps(1);
    *index = i;
    const auto ii = static_cast<int64_t>(i);
    const auto nn = static_cast<int64_t>(n);
    Value loop = Value::dict();
    auto& e = loop.mutable_dict_data().entries;
    e.reserve(12);
    e.emplace_back(kKeys[0], Value::integer(ii + 1));
    e.emplace_back(kKeys[1], Value::integer(ii));
    e.emplace_back(kKeys[2], Value::integer(nn - ii));
    e.emplace_back(kKeys[3], Value::integer(nn - ii - 1));
    e.emplace_back(kKeys[4], Value::boolean(i == 0));
    e.emplace_back(kKeys[5], Value::boolean(i + 1 == n));
    e.emplace_back(kKeys[6], Value::integer(nn));
    e.emplace_back(kKeys[7], Value::integer(1));
    e.emplace_back(kKeys[8], Value::integer(0));
    e.emplace_back(kKeys[9], cycle);
    if (i > 0) e.emplace_back(kKeys[10], items[i - 1]);
    if (i + 1 < n) e.emplace_back(kKeys[11], items[i + 1]);
    // jinja2 gives every iteration fresh locals: a `set` in one iteration is gone in the next.
    auto iteration = child_of(loop_scope);
    iteration->vars["loop"] = loop;
    ScopeGuard ig(scope_, iteration);
    assign(s.targets, items[i]);
    Flow f = exec(s.body, out);
    if (f == Flow::kBreak) break;
  }
  if (n == 0) return exec(s.else_body, out);
  return Flow::kNormal;
}

void Interpreter::exec_set(const Stmt& s) {
  Value v;
  if (s.block_set) {
    std::string inner;
    {
      ScopeGuard g(scope_, child_of(scope_));
      exec(s.body, inner);
    }
    v = Value::string(std::move(inner));
    if (s.filter) v = eval_filter(*s.filter, &v);
  } else {
    v = eval(*s.expr);
  }
  if (!s.text.empty()) {
    const Value* ns = scope_->find(s.targets[0]);
    if (!ns || !ns->is_namespace())
      throw_error("TemplateRuntimeError: cannot assign attribute on non-namespace object");
    ns->mutable_dict_data().set(Value::string(s.text), std::move(v));
    return;
  }
  assign(s.targets, v);
}

Value Interpreter::make_macro(const Stmt& s, const std::shared_ptr<Scope>& closure) {
  closures_.push_back(closure);
  const Stmt* stmt = &s;
  std::weak_ptr<Scope> weak = closure;
  return Value::function(s.name.empty() ? "caller" : s.name, [stmt, weak](Interpreter& in, CallArgs& args) -> Value {
    auto scope = weak.lock();
    if (!scope) throw_error("TemplateRuntimeError: macro called after its scope ended");
    return in.call_macro(*stmt, scope, args);
  });
}

void Interpreter::exec_macro(const Stmt& s) { scope_->vars[s.name] = make_macro(s, scope_); }

void Interpreter::exec_call_block(const Stmt& s, std::string& out) {
  const Expr& call = *s.expr;
  Value callee = eval(*call.a);
  CallArgs args = eval_args(call.args);
  args.keyword.emplace_back("caller", make_macro(s, scope_));
  where_ = &call;
  append_output(out, this->call(callee, args).str());
}

Value Interpreter::call_macro(const Stmt& s, const std::shared_ptr<Scope>& closure, CallArgs& args) {
  if (call_depth_ >= options_.limits.max_call_depth)
    throw_error("LimitError: macro calls nested deeper than " + std::to_string(options_.limits.max_call_depth) +
                " (recursive macro?)");
  count_steps(1);
  struct DepthGuard {
    int& d;
    explicit DepthGuard(int& x) : d(x) { ++d; }
    ~DepthGuard() { --d; }
  } depth(call_depth_);
  auto scope = child_of(closure);
  ScopeGuard g(scope_, scope);
  std::vector<bool> used(args.keyword.size(), false);
  for (size_t i = 0; i < s.params.size(); ++i) {
    const MacroParam& p = s.params[i];
    Value v;
    bool found = false;
    if (i < args.positional.size()) {
      v = args.positional[i];
      found = true;
    }
    for (size_t k = 0; k < args.keyword.size(); ++k) {
      if (args.keyword[k].first != p.name) continue;
      if (found) throw_error("TypeError: macro '" + s.name + "' got multiple values for argument '" + p.name + "'");
      v = args.keyword[k].second;
      used[k] = true;
      found = true;
    }
    if (!found) v = p.default_value ? eval(*p.default_value) : Value::undefined("'" + p.name + "' is undefined");
    scope->vars[p.name] = std::move(v);
  }
  std::vector<Value> varargs;
  for (size_t i = s.params.size(); i < args.positional.size(); ++i) varargs.push_back(args.positional[i]);
  scope->vars["varargs"] = Value::tuple(std::move(varargs));
  Value kwargs = Value::dict();
  for (size_t k = 0; k < args.keyword.size(); ++k) {
    if (used[k]) continue;
    if (args.keyword[k].first == "caller") {
      scope->vars["caller"] = args.keyword[k].second;
      continue;
    }
    kwargs.mutable_dict_data().set(Value::string(args.keyword[k].first), args.keyword[k].second);
  }
  scope->vars["kwargs"] = kwargs;
  std::string out;
  exec(s.body, out);
  return Value::string(std::move(out));
}

// ---------------------------------------------------------------------------------------------
// Expressions

CallArgs Interpreter::eval_args(const CallArgsExpr& a) {
  CallArgs args;
  args.positional.reserve(a.positional.size());
  for (const auto& e : a.positional) args.positional.push_back(eval(*e));
  for (const auto& [k, e] : a.keyword) args.keyword.emplace_back(k, eval(*e));
  return args;
}

Value Interpreter::eval(const Expr& e) {
  where_ = &e;
  switch (e.kind) {
    case ExprKind::kLiteral:
      return e.value;
    case ExprKind::kName:
      return eval_name(e);
    case ExprKind::kList:
    case ExprKind::kTuple: {
      std::vector<Value> items;
      items.reserve(e.items.size());
      for (const auto& i : e.items) items.push_back(eval(*i));
      return e.kind == ExprKind::kList ? Value::list(std::move(items)) : Value::tuple(std::move(items));
    }
    case ExprKind::kDict: {
      Value d = Value::dict();
      for (size_t i = 0; i + 1 < e.items.size(); i += 2) {
        Value k = eval(*e.items[i]);
        Value v = eval(*e.items[i + 1]);
        if (k.is_list() && !k.is_tuple()) throw_error("TypeError: unhashable type: 'list'");
        if (k.is_dict()) throw_error("TypeError: unhashable type: 'dict'");
        d.mutable_dict_data().set(k, std::move(v));
      }
      return d;
    }
    case ExprKind::kGetAttr: {
      Value obj = eval(*e.a);
      where_ = &e;
      return get_attr(obj, e.name);
    }
    case ExprKind::kGetItem: {
      Value obj = eval(*e.a);
      Value key = eval(*e.b);
      where_ = &e;
      return get_item(obj, key);
    }
    case ExprKind::kSlice:
      return eval_slice(e);
    case ExprKind::kCall:
      return eval_call(e);
    case ExprKind::kFilter:
      return eval_filter(e, nullptr);
    case ExprKind::kTest:
      return eval_test(e);
    case ExprKind::kUnary: {
      Value v = eval(*e.a);
      where_ = &e;
      if (e.name == "not") return Value::boolean(!v.truthy());
      return unary_op(e.name, v);
    }
    case ExprKind::kBinary: {
      if (e.name == "and" || e.name == "or") {
        Value l = eval(*e.a);
        const bool t = l.truthy();
        if ((e.name == "and") ? !t : t) return l;
        return eval(*e.b);
      }
      Value l = eval(*e.a);
      Value r = eval(*e.b);
      where_ = &e;
      return binary_op(*this, e.name, l, r);
    }
    case ExprKind::kCompare:
      return eval_compare(e);
    case ExprKind::kCondition:
      if (eval(*e.b).truthy()) return eval(*e.a);
      if (e.c) return eval(*e.c);
      return Value::undefined("the inline if-expression on line " + std::to_string(e.line) +
                              " evaluated to false and no else section was defined.");
  }
  return Value();
}

Value Interpreter::eval_name(const Expr& e) {
  if (const Value* v = scope_->find(e.name)) return *v;
  return Value::undefined("'" + e.name + "' is undefined");
}

Value Interpreter::eval_call(const Expr& e) {
  Value callee = eval(*e.a);
  CallArgs args = eval_args(e.args);
  where_ = &e;
  return call(callee, args);
}

Value Interpreter::call(const Value& callee, CallArgs& args) {
  if (callee.is_function()) return callee.function_data().fn(*this, args);
  if (callee.is_undefined()) callee.fail_undefined();
  throw_error("TypeError: '" + callee.type_name() + "' object is not callable");
}

Value Interpreter::eval_filter(const Expr& e, const Value* operand) {
  Value v;
  if (!e.a) {
    v = *operand;
  } else if (e.a->kind == ExprKind::kFilter) {
    v = eval_filter(*e.a, operand);
  } else {
    v = eval(*e.a);
  }
  CallArgs args = eval_args(e.args);
  where_ = &e;
  return apply_filter(e.name, v, args);
}

Value Interpreter::apply_filter(const std::string& name, const Value& value, CallArgs& args) {
  FilterFn fn = find_filter(name);
  if (!fn) throw_error("TemplateAssertionError: no filter named '" + name + "'");
  return fn(*this, value, args);
}

bool Interpreter::apply_test(const std::string& name, const Value& value, CallArgs& args) {
  TestFn fn = find_test(name);
  if (!fn) throw_error("TemplateAssertionError: no test named '" + name + "'");
  return fn(*this, value, args);
}

Value Interpreter::eval_test(const Expr& e) {
  Value v = eval(*e.a);
  CallArgs args = eval_args(e.args);
  where_ = &e;
  const bool r = apply_test(e.name, v, args);
  return Value::boolean(e.negated ? !r : r);
}

Value Interpreter::eval_compare(const Expr& e) {
  Value left = eval(*e.a);
  for (size_t i = 0; i < e.ops.size(); ++i) {
    Value right = eval(*e.items[i]);
    where_ = &e;
    const std::string& op = e.ops[i];
    bool r;
    if (op == "==") {
      r = values_equal(left, right);
    } else if (op == "!=") {
      r = !values_equal(left, right);
    } else if (op == "in") {
      r = contains(right, left);
    } else if (op == "not in") {
      r = !contains(right, left);
    } else {
      const int c = compare_values(left, right, op);
      r = op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0;
    }
    if (!r) return Value::boolean(false);
    left = std::move(right);
  }
  return Value::boolean(true);
}

namespace {

// Python's slice.indices(): resolves optional start/stop/step against a length.
void slice_indices(const Value* start, const Value* stop, const Value* step, int64_t len, int64_t& b, int64_t& e,
                   int64_t& st) {
  auto given = [](const Value* v) { return v && !v->is_none() && !v->is_undefined(); };
  auto as_index = [](const Value* v) {
    if (!v->is_int() && !v->is_bool())
      throw_error("TypeError: slice indices must be integers or None or have an __index__ method");
    return v->as_int();
  };
  st = given(step) ? as_index(step) : 1;
  if (st == 0) throw_error("ValueError: slice step cannot be zero");
  auto clamp = [&](const Value* v, int64_t dflt) {
    if (!given(v)) return dflt;
    int64_t i = as_index(v);
    if (i < 0) i += len;
    if (st > 0) return std::clamp<int64_t>(i, 0, len);
    return std::clamp<int64_t>(i, -1, len - 1);
  };
  b = clamp(start, st > 0 ? 0 : len - 1);
  e = clamp(stop, st > 0 ? len : -1);
}

template <class Seq>
Seq slice_seq(const Seq& s, int64_t b, int64_t e, int64_t st) {
  Seq out;
  if (st > 0)
    for (int64_t i = b; i < e; i += st) out.push_back(s[static_cast<size_t>(i)]);
  else
    for (int64_t i = b; i > e; i += st) out.push_back(s[static_cast<size_t>(i)]);
  return out;
}

}  // namespace

Value Interpreter::eval_slice(const Expr& e) {
  Value obj = eval(*e.a);
  Value start = e.b ? eval(*e.b) : Value::none();
  Value stop = e.c ? eval(*e.c) : Value::none();
  Value step = e.d ? eval(*e.d) : Value::none();
  where_ = &e;
  int64_t b, en, st;
  if (obj.is_string()) {
    std::u32string cps = utf8::decode(obj.as_string());
    slice_indices(&start, &stop, &step, static_cast<int64_t>(cps.size()), b, en, st);
    return Value::string(utf8::encode(slice_seq(cps, b, en, st)));
  }
  if (obj.is_list()) {
    const auto& items = obj.items();
    slice_indices(&start, &stop, &step, static_cast<int64_t>(items.size()), b, en, st);
    std::vector<Value> out = slice_seq(items, b, en, st);
    return obj.is_tuple() ? Value::tuple(std::move(out)) : Value::list(std::move(out));
  }
  if (obj.is_undefined()) obj.fail_undefined();
  throw_error("TypeError: '" + obj.type_name() + "' object is not subscriptable");
}

// ---------------------------------------------------------------------------------------------
// Attribute and item access (jinja2's sandboxed getattr/getitem)

std::string object_description(const Value& v) {
  if (v.is_none()) return "None";
  if (v.is_namespace()) return "jinja2.utils.Namespace object";
  return v.type_name() + " object";
}

Value Interpreter::get_attr(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) obj.fail_undefined();
  if (obj.is_namespace()) {
    if (const Value* v = obj.dict_data().find(name)) return *v;
    return Value::undefined("'" + object_description(obj) + "' has no attribute '" + name + "'");
  }
  Value m = get_method(*this, obj, name);
  if (!m.is_undefined() || m.is_unsafe()) return m;
  if (obj.is_dict())
    if (const Value* v = obj.dict_data().find(name)) return *v;
  return Value::undefined("'" + object_description(obj) + "' has no attribute '" + name + "'");
}

Value Interpreter::get_item(const Value& obj, const Value& key) {
  if (obj.is_undefined()) obj.fail_undefined();
  if (obj.is_dict() && !obj.is_namespace()) {
    if (const Value* v = obj.dict_data().find(key)) return *v;
  } else if ((obj.is_list() && !obj.is_generator()) || obj.is_string()) {
    if (key.is_int() || key.is_bool()) {
      int64_t i = key.as_int();
      if (obj.is_list()) {
        const auto n = static_cast<int64_t>(obj.items().size());
        if (i < 0) i += n;
        if (i >= 0 && i < n) return obj.items()[static_cast<size_t>(i)];
      } else {
        std::u32string cps = utf8::decode(obj.as_string());
        const auto n = static_cast<int64_t>(cps.size());
        if (i < 0) i += n;
        if (i >= 0 && i < n) return Value::string(utf8::encode(cps.substr(static_cast<size_t>(i), 1)));
      }
      return Value::undefined("'" + object_description(obj) + "' has no element " + key.repr());
    }
  }
  if (key.is_string()) return get_attr(obj, key.as_string());
  return Value::undefined("'" + object_description(obj) + "' has no element " + key.repr());
}

std::vector<Value> Interpreter::iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return {};
    case Value::Kind::kList:
      return v.items();
    case Value::Kind::kDict: {
      if (v.is_namespace()) break;
      std::vector<Value> keys;
      keys.reserve(v.dict_data().entries.size());
      for (const auto& [k, _] : v.dict_data().entries) keys.push_back(k);
      return keys;
    }
    case Value::Kind::kString: {
      std::vector<Value> chars;
      for (char32_t c : utf8::decode(v.as_string())) chars.push_back(Value::string(utf8::encode(std::u32string(1, c))));
      return chars;
    }
    default:
      break;
  }
  throw_error("TypeError: '" + v.type_name() + "' object is not iterable");
}

}  // namespace kite::jinja

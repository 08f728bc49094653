// kite/src/runtime/jinja/value.h — the values a chat template computes with.
//
// A Value models the Python objects jinja2 hands to templates: undefined, None, bool, int, float,
// str, list/tuple, dict (insertion-ordered, like Python's), and callables (macros, bound methods,
// globals such as range). Lists and dicts are shared by reference and never mutated after they are
// built (the sandbox forbids mutation); namespaces are the one mutable object, as in jinja2.
//
// Printing follows Python: str() of a list is its repr ("[1, 'a']"), True/False/None are
// capitalized and floats print as Python's shortest round-trip repr.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace kite::jinja {

// Errors inside the engine are thrown as TemplateError and turned into kite::Error at the API
// boundary (Template::render); they never leave the jinja module.
class TemplateError : public std::exception {
 public:
  explicit TemplateError(std::string message) : message_(std::move(message)) {}
  const char* what() const noexcept override { return message_.c_str(); }
  const std::string& message() const { return message_; }

 private:
  std::string message_;
};

[[noreturn]] void throw_error(std::string message);

class Value;
class Interpreter;

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;

  // The argument at `index` or named `name`; nullptr if absent. Marks nothing: callers check
  // arity themselves where jinja2 would complain.
  const Value* get(size_t index, std::string_view name) const;
};

using NativeFn = std::function<Value(Interpreter&, CallArgs&)>;

struct ListData;
struct DictData;
struct FunctionData {
  std::string name;
  NativeFn fn;
};

class Value {
 public:
  enum class Kind : uint8_t { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kFunction };

  Value() = default;  // undefined
  static Value undefined(std::string hint = {}) {
    Value v;
    if (!hint.empty()) v.ptr_ = std::make_shared<const std::string>(std::move(hint));
    return v;
  }
  // An undefined whose use raises SecurityError (an unsafe attribute in the sandbox).
  static Value unsafe(std::string message) {
    Value v = undefined(std::move(message));
    v.unsafe_ = true;
    return v;
  }
  static Value none() { return make(Kind::kNone); }
  static Value boolean(bool b) {
    Value v = make(Kind::kBool);
    v.n_.i = b;
    return v;
  }
  static Value integer(int64_t i) {
    Value v = make(Kind::kInt);
    v.n_.i = i;
    return v;
  }
  static Value number(double f) {
    Value v = make(Kind::kFloat);
    v.n_.f = f;
    return v;
  }
  static Value string(std::string s) {
    Value v = make(Kind::kString);
    v.ptr_ = std::make_shared<const std::string>(std::move(s));
    return v;
  }
  // A jinja2 Markup string (from |safe or |escape): `+` with a plain string escapes the plain side.
  static Value markup(std::string s) {
    Value v = string(std::move(s));
    v.unsafe_ = true;  // for strings the flag means "Markup"
    return v;
  }
  static Value list(std::vector<Value> items);
  static Value tuple(std::vector<Value> items);
  // A one-shot iterable (what jinja2's map/select return): iterable, but not JSON-serializable
  // and without a length.
  static Value generator(std::vector<Value> items);
  static Value dict();
  static Value make_namespace();
  static Value function(std::string name, NativeFn fn);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat || kind_ == Kind::kBool; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_tuple() const;
  bool is_generator() const;
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_namespace() const;
  bool is_function() const { return kind_ == Kind::kFunction; }
  bool is_unsafe() const { return unsafe_ && kind_ == Kind::kUndefined; }
  bool is_markup() const { return unsafe_ && kind_ == Kind::kString; }

  bool as_bool() const { return n_.i != 0; }
  int64_t as_int() const { return n_.i; }  // bool and int
  double as_double() const { return kind_ == Kind::kFloat ? n_.f : static_cast<double>(n_.i); }
  const std::string& as_string() const;  // string (and an undefined's hint)
  const std::string& undefined_hint() const { return as_string(); }
  const std::vector<Value>& items() const;  // list/tuple/generator
  const DictData& dict_data() const;
  DictData& mutable_dict_data() const;  // namespaces only
  const FunctionData& function_data() const;

  // Python's bool(x).
  bool truthy() const;
  // Python's str(x) / repr(x).
  std::string str() const;
  std::string repr() const { return repr_at(0); }
  // Python's type name, for error messages ("dict", "str", "NoneType", ...).
  std::string type_name() const;

  // The Undefined error: "'x' is undefined" or the attribute message it carries.
  [[noreturn]] void fail_undefined() const;

  // Throws TemplateError for JSON nested deeper than kMaxDepth.
  static Value from_json(const nlohmann::ordered_json& j, int depth = 0);

  // Nesting bound for printing and JSON conversion (a namespace can contain itself).
  static constexpr int kMaxDepth = 512;
  // Bound on the text of one printed or JSON-dumped value, so printing a list that repeats a
  // large string cannot run away; renders have their own, smaller output limit on top.
  static constexpr size_t kMaxPrintedBytes = size_t{64} << 20;

 private:
  std::string repr_at(int depth) const;

  static Value make(Kind k) {
    Value v;
    v.kind_ = k;
    return v;
  }

  // 32 bytes: scalars inline, everything else shared (values are immutable once built, so
  // copies share strings, lists and dicts).
  Kind kind_ = Kind::kUndefined;
  bool unsafe_ = false;  // undefined: raises SecurityError when used; string: Markup
  union {
    int64_t i;
    double f;
  } n_{0};
  // kString/kUndefined: const std::string; kList: ListData; kDict: DictData; kFunction: FunctionData.
  std::shared_ptr<const void> ptr_;
};

struct ListData {
  std::vector<Value> items;
  bool tuple = false;
  bool generator = false;
};

// An insertion-ordered dict. Keys are hashable Values (strings, numbers, None, tuples); lookup is
// linear, which is fine for the small dicts chat templates see.
struct DictData {
  std::vector<std::pair<Value, Value>> entries;
  bool is_namespace = false;

  const Value* find(const Value& key) const;
  const Value* find(std::string_view key) const;
  void set(const Value& key, Value value);
};

// Python equality (1 == 1.0 == True, deep for lists and dicts).
bool values_equal(const Value& a, const Value& b);
// Python ordering for <, <=, >, >=: numbers with numbers, strings with strings, lists
// lexicographically; anything else throws TypeError. Returns <0, 0, >0.
int compare_values(const Value& a, const Value& b, std::string_view op);

// HTML escaping as markupsafe.escape does it (& < > " ').
std::string html_escape(std::string_view s);

// Python's repr of a float (shortest round trip: 1.0, 0.1, 1e+20, 1e-05, inf, nan).
std::string format_float(double d);
// Python's repr of a str: quotes chosen as Python does, escapes for control characters.
std::string repr_string(std::string_view s);

struct JsonOptions {
  int indent = -1;  // -1: None (one line)
  std::string indent_string;  // used when indent_is_string
  bool indent_is_string = false;
  bool ensure_ascii = false;
  bool sort_keys = false;
  std::string item_separator;  // empty: Python's default for the indent
  std::string key_separator;
  bool separators_given = false;
};
// Python's json.dumps(value, ...) text; throws TypeError for values JSON cannot hold.
std::string to_json(const Value& v, const JsonOptions& options);

}  // namespace kite::jinja

// kite/src/runtime/jinja/builtins.cpp — jinja2's filters and tests, and the globals transformers
// provides (range, dict, namespace, raise_exception, strftime_now, joiner, cycler).
#include <algorithm>
#include <cfenv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <unordered_map>

#include "src/runtime/jinja/interpreter.h"
#include "src/runtime/jinja/utf8.h"

namespace kite::jinja {
namespace {

const Value kNone = Value::none();
const Value kFalse = Value::boolean(false);

Value arg(const CallArgs& a, size_t i, std::string_view name, const Value& dflt) {
  const Value* v = a.get(i, name);
  return v ? *v : dflt;
}

int64_t int_arg(const CallArgs& a, size_t i, std::string_view name, int64_t dflt) {
  const Value* v = a.get(i, name);
  if (!v || v->is_none()) return dflt;
  if (!v->is_int() && !v->is_bool()) throw_error("TypeError: '" + std::string(name) + "' must be an integer");
  return v->as_int();
}

std::string call_method_string(Interpreter& in, const Value& s, const std::string& method, CallArgs& args) {
  Value m = get_method(in, Value::string(s.str()), method);
  std::string r = in.call(m, args).as_string();
  in.count_bytes(r.size());
  return r;
}

// An attribute path "a.b" or integer index of jinja2's make_attrgetter.
Value attr_path(Interpreter& in, const Value& v, const Value& attribute) {
  if (attribute.is_int()) return in.get_item(v, attribute);
  Value cur = v;
  const std::string& path = attribute.as_string();
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    const bool digits = !part.empty() && part.size() < 18 &&
                        std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    cur = in.get_item(cur, digits ? Value::integer(std::strtoll(part.c_str(), nullptr, 10)) : Value::string(part));
    if (dot == std::string::npos) return cur;
    start = dot + 1;
  }
}

// ---------------------------------------------------------------------------------------------
// Filters

Value f_tojson(Interpreter& in, const Value& v, CallArgs& a) {
  JsonOptions o;
  const Value& indent = arg(a, 0, "indent", kNone);
  if (indent.is_int()) {
    o.indent = static_cast<int>(std::max<int64_t>(0, indent.as_int()));
  } else if (indent.is_string()) {
    o.indent_is_string = true;
    o.indent_string = indent.as_string();
  }
  o.ensure_ascii = arg(a, 1, "ensure_ascii", kFalse).truthy();
  const Value& seps = arg(a, 2, "separators", kNone);
  if (seps.is_list() && seps.items().size() == 2) {
    o.separators_given = true;
    o.item_separator = seps.items()[0].str();
    o.key_separator = seps.items()[1].str();
  }
  o.sort_keys = arg(a, 3, "sort_keys", kFalse).truthy();
  std::string s = to_json(v, o);
  in.check_string_size(s.size());
  in.count_bytes(s.size());
  return Value::string(std::move(s));
}

Value f_length(Interpreter&, const Value& v, CallArgs&) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return Value::integer(0);
    case Value::Kind::kString: return Value::integer(static_cast<int64_t>(utf8::length(v.as_string())));
    case Value::Kind::kList:
      if (v.is_generator()) break;
      return Value::integer(static_cast<int64_t>(v.items().size()));
    case Value::Kind::kDict:
      if (v.is_namespace()) break;
      return Value::integer(static_cast<int64_t>(v.dict_data().entries.size()));
    default: break;
  }
  throw_error("TypeError: object of type '" + v.type_name() + "' has no len()");
}

Value f_trim(Interpreter& in, const Value& v, CallArgs& a) {
  CallArgs m;
  if (const Value* c = a.get(0, "chars")) m.positional.push_back(*c);
  return Value::string(call_method_string(in, v, "strip", m));
}

Value case_filter(Interpreter& in, const Value& v, const char* method) {
  CallArgs none;
  return Value::string(call_method_string(in, v, method, none));
}
Value f_upper(Interpreter& in, const Value& v, CallArgs&) { return case_filter(in, v, "upper"); }
Value f_lower(Interpreter& in, const Value& v, CallArgs&) { return case_filter(in, v, "lower"); }
Value f_capitalize(Interpreter& in, const Value& v, CallArgs&) { return case_filter(in, v, "capitalize"); }

Value f_title(Interpreter&, const Value& v, CallArgs&) {
  // jinja2: capitalize each word, words split before runs of [-\s({[<].
  std::u32string cps = utf8::decode(v.str());
  bool start = true;
  for (char32_t& c : cps) {
    const bool sep = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || utf8::is_space(c);
    if (sep) {
      start = true;
      continue;
    }
    c = start ? utf8::to_upper(c) : utf8::to_lower(c);
    start = false;
  }
  return Value::string(utf8::encode(cps));
}

Value f_replace(Interpreter& in, const Value& v, CallArgs& a) {
  CallArgs m;
  m.positional.push_back(arg(a, 0, "old", kNone));
  m.positional.push_back(arg(a, 1, "new", kNone));
  if (const Value* c = a.get(2, "count"); c && !c->is_none()) m.positional.push_back(*c);
  return Value::string(call_method_string(in, v, "replace", m));
}

Value f_join(Interpreter& in, const Value& v, CallArgs& a) {
  const std::string sep = arg(a, 0, "d", Value::string("")).str();
  const Value& attribute = arg(a, 1, "attribute", kNone);
  std::string out;
  bool first = true;
  for (const Value& item : in.iterate(v)) {
    if (!first) out += sep;
    first = false;
    out += attribute.is_none() ? item.str() : attr_path(in, item, attribute).str();
    in.check_string_size(out.size());
  }
  in.count_bytes(out.size());
  return Value::string(std::move(out));
}

Value f_items(Interpreter&, const Value& v, CallArgs&) {
  if (v.is_undefined()) return Value::generator({});
  if (!v.is_dict() || v.is_namespace()) throw_error("TypeError: Can only get item pairs from a mapping.");
  std::vector<Value> out;
  for (const auto& [k, val] : v.dict_data().entries) out.push_back(Value::tuple({k, val}));
  return Value::generator(std::move(out));
}

// select / reject / selectattr / rejectattr.
Value select_impl(Interpreter& in, const Value& v, CallArgs& a, bool by_attr, bool keep_if) {
  size_t first_arg = 0;
  Value attribute;
  if (by_attr) {
    if (a.positional.empty()) throw_error("TypeError: selectattr needs an attribute");
    attribute = a.positional[0];
    first_arg = 1;
  }
  std::string test;
  CallArgs test_args;
  if (a.positional.size() > first_arg) {
    test = a.positional[first_arg].str();
    test_args.positional.assign(a.positional.begin() + static_cast<long>(first_arg) + 1, a.positional.end());
  }
  test_args.keyword = a.keyword;
  std::vector<Value> out;
  if (!v.truthy()) return Value::generator({});  // jinja2: `if seq:` before iterating
  for (const Value& item : in.iterate(v)) {
    const Value x = by_attr ? attr_path(in, item, attribute) : item;
    const bool r = test.empty() ? x.truthy() : in.apply_test(test, x, test_args);
    if (r == keep_if) out.push_back(item);
  }
  return Value::generator(std::move(out));
}
Value f_select(Interpreter& in, const Value& v, CallArgs& a) { return select_impl(in, v, a, false, true); }
Value f_reject(Interpreter& in, const Value& v, CallArgs& a) { return select_impl(in, v, a, false, false); }
Value f_selectattr(Interpreter& in, const Value& v, CallArgs& a) { return select_impl(in, v, a, true, true); }
Value f_rejectattr(Interpreter& in, const Value& v, CallArgs& a) { return select_impl(in, v, a, true, false); }

Value f_map(Interpreter& in, const Value& v, CallArgs& a) {
  std::vector<Value> out;
  if (!v.truthy()) return Value::generator({});  // jinja2: `if value:` before iterating
  const Value* attribute = a.get(99, "attribute");
  if (attribute) {
    const Value& dflt = arg(a, 99, "default", Value());
    for (const Value& item : in.iterate(v)) {
      Value x = attr_path(in, item, *attribute);
      out.push_back(x.is_undefined() && a.get(99, "default") ? dflt : x);
    }
    return Value::generator(std::move(out));
  }
  if (a.positional.empty()) throw_error("FilterArgumentError: map requires a filter argument");
  const std::string filter = a.positional[0].str();
  CallArgs fargs;
  fargs.positional.assign(a.positional.begin() + 1, a.positional.end());
  fargs.keyword = a.keyword;
  for (const Value& item : in.iterate(v)) {
    CallArgs copy = fargs;
    out.push_back(in.apply_filter(filter, item, copy));
  }
  return Value::generator(std::move(out));
}

Value f_first(Interpreter& in, const Value& v, CallArgs&) {
  std::vector<Value> items = in.iterate(v);
  if (items.empty()) return Value::undefined("No first item, sequence was empty.");
  return items.front();
}

Value f_last(Interpreter& in, const Value& v, CallArgs&) {
  if (v.is_generator()) throw_error("TypeError: 'generator' object is not reversible");
  std::vector<Value> items = in.iterate(v);
  if (items.empty()) return Value::undefined("No last item, sequence was empty.");
  return items.back();
}

Value f_default(Interpreter&, const Value& v, CallArgs& a) {
  const Value& dflt = arg(a, 0, "default_value", Value::string(""));
  const bool boolean = arg(a, 1, "boolean", kFalse).truthy();
  if (v.is_undefined() || (boolean && !v.truthy())) return dflt;
  return v;
}

Value f_string(Interpreter& in, const Value& v, CallArgs&) {
  std::string s = v.str();
  in.count_bytes(s.size());
  return Value::string(std::move(s));
}

bool parse_float(const std::string& s, double& out) {
  std::string t;
  for (char c : s)
    if (c != '_') t.push_back(c);
  size_t b = 0, e = t.size();
  while (b < e && std::isspace(static_cast<unsigned char>(t[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(t[e - 1]))) --e;
  t = t.substr(b, e - b);
  if (t.empty()) return false;
  char* end = nullptr;
  out = std::strtod(t.c_str(), &end);
  return end == t.c_str() + t.size();
}

Value f_int(Interpreter&, const Value& v, CallArgs& a) {
  const Value& dflt = arg(a, 0, "default", Value::integer(0));
  const int64_t base = int_arg(a, 1, "base", 10);
  if (v.is_int() || v.is_bool()) return Value::integer(v.as_int());
  if (v.is_float()) return std::isfinite(v.as_double()) ? Value::integer(static_cast<int64_t>(v.as_double())) : dflt;
  if (v.is_string()) {
    std::string t;
    for (char c : v.as_string())
      if (c != '_' && !std::isspace(static_cast<unsigned char>(c))) t.push_back(c);
    if (!t.empty()) {
      char* end = nullptr;
      errno = 0;
      const long long i = std::strtoll(t.c_str(), &end, static_cast<int>(base));
      if (end == t.c_str() + t.size() && errno == 0) return Value::integer(i);
    }
    double d;
    if (parse_float(v.as_string(), d) && std::isfinite(d)) return Value::integer(static_cast<int64_t>(d));
  }
  return dflt;
}

Value f_float(Interpreter&, const Value& v, CallArgs& a) {
  const Value& dflt = arg(a, 0, "default", Value::number(0.0));
  if (v.is_number()) return Value::number(v.as_double());
  double d;
  if (v.is_string() && parse_float(v.as_string(), d)) return Value::number(d);
  return dflt;
}

Value f_list(Interpreter& in, const Value& v, CallArgs&) { return Value::list(in.iterate(v)); }

// Sort key comparison with jinja2's case_sensitive=False lower-casing of strings.
Value sort_key(Interpreter& in, const Value& v, const Value& attribute, bool case_sensitive) {
  Value k = attribute.is_none() ? v : attr_path(in, v, attribute);
  if (!case_sensitive && k.is_string()) {
    CallArgs none;
    return Value::string(call_method_string(in, k, "lower", none));
  }
  return k;
}

Value f_sort(Interpreter& in, const Value& v, CallArgs& a) {
  const bool reverse = arg(a, 0, "reverse", kFalse).truthy();
  const bool cs = arg(a, 1, "case_sensitive", kFalse).truthy();
  const Value& attribute = arg(a, 2, "attribute", kNone);
  std::vector<std::pair<Value, Value>> keyed;
  for (const Value& item : in.iterate(v)) keyed.emplace_back(sort_key(in, item, attribute, cs), item);
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
    return reverse ? compare_values(y.first, x.first, "<") < 0 : compare_values(x.first, y.first, "<") < 0;
  });
  std::vector<Value> out;
  for (auto& [k, item] : keyed) out.push_back(std::move(item));
  return Value::list(std::move(out));
}

Value f_dictsort(Interpreter& in, const Value& v, CallArgs& a) {
  if (!v.is_dict()) throw_error("TypeError: dictsort requires a mapping");
  const bool cs = arg(a, 0, "case_sensitive", kFalse).truthy();
  const std::string by = arg(a, 1, "by", Value::string("key")).str();
  const bool reverse = arg(a, 2, "reverse", kFalse).truthy();
  const size_t pos = by == "key" ? 0 : by == "value" ? 1 : 2;
  if (pos == 2) throw_error("FilterArgumentError: You can only sort by either \"key\" or \"value\"");
  std::vector<Value> items;
  for (const auto& [k, val] : v.dict_data().entries) items.push_back(Value::tuple({k, val}));
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
    Value kx = sort_key(in, x.items()[pos], kNone, cs), ky = sort_key(in, y.items()[pos], kNone, cs);
    return reverse ? compare_values(ky, kx, "<") < 0 : compare_values(kx, ky, "<") < 0;
  });
  return Value::list(std::move(items));
}

Value f_unique(Interpreter& in, const Value& v, CallArgs& a) {
  const bool cs = arg(a, 0, "case_sensitive", kFalse).truthy();
  const Value& attribute = arg(a, 1, "attribute", kNone);
  std::vector<Value> seen, out;
  for (const Value& item : in.iterate(v)) {
    Value k = sort_key(in, item, attribute, cs);
    if (std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return values_equal(s, k); })) continue;
    seen.push_back(k);
    out.push_back(item);
  }
  return Value::generator(std::move(out));
}

Value minmax(Interpreter& in, const Value& v, CallArgs& a, bool want_max) {
  const bool cs = arg(a, 0, "case_sensitive", kFalse).truthy();
  const Value& attribute = arg(a, 1, "attribute", kNone);
  std::vector<Value> items = in.iterate(v);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  size_t best = 0;
  Value best_key = sort_key(in, items[0], attribute, cs);
  for (size_t i = 1; i < items.size(); ++i) {
    Value k = sort_key(in, items[i], attribute, cs);
    const int c = compare_values(k, best_key, "<");
    if (want_max ? c > 0 : c < 0) {
      best = i;
      best_key = k;
    }
  }
  return items[best];
}
Value f_min(Interpreter& in, const Value& v, CallArgs& a) { return minmax(in, v, a, false); }
Value f_max(Interpreter& in, const Value& v, CallArgs& a) { return minmax(in, v, a, true); }

Value f_sum(Interpreter& in, const Value& v, CallArgs& a) {
  const Value& attribute = arg(a, 0, "attribute", kNone);
  Value total = arg(a, 1, "start", Value::integer(0));
  for (const Value& item : in.iterate(v))
    total = binary_op(in, "+", total, attribute.is_none() ? item : attr_path(in, item, attribute));
  return total;
}

Value f_reverse(Interpreter& in, const Value& v, CallArgs&) {
  if (v.is_string()) {
    std::u32string cps = utf8::decode(v.as_string());
    std::reverse(cps.begin(), cps.end());
    return Value::string(utf8::encode(cps));
  }
  std::vector<Value> items = in.iterate(v);
  std::reverse(items.begin(), items.end());
  return Value::generator(std::move(items));
}

std::vector<std::u32string> split_lines(const std::u32string& s) {
  std::vector<std::u32string> lines;
  std::u32string cur;
  for (size_t i = 0; i < s.size(); ++i) {
    const char32_t c = s[i];
    if (c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || (c >= 0x1C && c <= 0x1E) || c == 0x85 || c == 0x2028 ||
        c == 0x2029) {
      if (c == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
      lines.push_back(std::move(cur));
      cur.clear();
    } else {
      cur.push_back(c);
    }
  }
  if (!cur.empty()) lines.push_back(std::move(cur));
  return lines;
}

Value f_indent(Interpreter& in, const Value& v, CallArgs& a) {
  const Value width = arg(a, 0, "width", Value::integer(4));
  if (width.is_int()) in.check_string_size(static_cast<size_t>(std::max<int64_t>(0, width.as_int())));
  const bool first = arg(a, 1, "first", kFalse).truthy();
  const bool blank = arg(a, 2, "blank", kFalse).truthy();
  const std::u32string ind = utf8::decode(width.is_string() ? width.as_string() : std::string(static_cast<size_t>(std::max<int64_t>(0, width.as_int())), ' '));
  std::vector<std::u32string> lines = split_lines(utf8::decode(v.str() + "\n"));
  std::u32string rv;
  if (blank) {
    for (size_t i = 0; i < lines.size(); ++i) rv += (i ? U"\n" + ind : U"") + lines[i];
  } else {
    rv = lines.empty() ? U"" : lines[0];
    for (size_t i = 1; i < lines.size(); ++i) rv += U"\n" + (lines[i].empty() ? U"" : ind + lines[i]);
  }
  if (first) rv = ind + rv;
  std::string out = utf8::encode(rv);
  in.check_string_size(out.size());
  in.count_bytes(out.size());
  return Value::string(std::move(out));
}

Value f_safe(Interpreter&, const Value& v, CallArgs&) { return Value::markup(v.str()); }

Value f_escape(Interpreter&, const Value& v, CallArgs&) {
  return Value::markup(v.is_markup() ? v.as_string() : html_escape(v.str()));
}

Value f_forceescape(Interpreter&, const Value& v, CallArgs&) { return Value::markup(html_escape(v.str())); }

Value f_wordcount(Interpreter&, const Value& v, CallArgs&) {
  int64_t n = 0;
  bool in_word = false;
  for (char32_t c : utf8::decode(v.str())) {
    const bool w = c == '_' || (c >= '0' && c <= '9') || ((c | 32) >= 'a' && (c | 32) <= 'z') ||
                   (c >= 0x80 && !utf8::is_space(c) && !(c >= 0x2000 && c <= 0x206F) && !(c >= 0x3000 && c <= 0x303F));
    if (w && !in_word) ++n;
    in_word = w;
  }
  return Value::integer(n);
}

Value f_abs(Interpreter&, const Value& v, CallArgs&) {
  if (v.is_float()) return Value::number(std::fabs(v.as_double()));
  if (v.is_number()) return Value::integer(std::llabs(v.as_int()));
  if (v.is_undefined()) v.fail_undefined();
  throw_error("TypeError: bad operand type for abs(): '" + v.type_name() + "'");
}

Value f_round(Interpreter&, const Value& v, CallArgs& a) {
  const int64_t precision = int_arg(a, 0, "precision", 0);
  const std::string method = arg(a, 1, "method", Value::string("common")).str();
  if (!v.is_number()) throw_error("TypeError: type " + v.type_name() + " doesn't define __round__ method");
  if (method == "common" && (v.is_int() || v.is_bool()) && precision >= 0) return Value::integer(v.as_int());
  if (precision > 300) return Value::number(v.as_double());
  if (precision < -300) return Value::number(std::copysign(0.0, v.as_double()));
  const double scale = std::pow(10.0, static_cast<double>(precision));
  const double x = v.as_double() * scale;
  double r;
  if (method == "ceil") {
    r = std::ceil(x);
  } else if (method == "floor") {
    r = std::floor(x);
  } else if (method == "common") {
    if (precision > 0 && precision < 300) {
      // Python rounds the exact binary value half-to-even in decimal; printf does the same.
      char buf[512];
      std::snprintf(buf, sizeof(buf), "%.*f", static_cast<int>(precision), v.as_double());
      return Value::number(std::strtod(buf, nullptr));
    }
    r = std::nearbyint(x);
  } else {
    throw_error("FilterArgumentError: method must be common, ceil or floor");
  }
  return Value::number(r / scale);
}

Value f_batch(Interpreter& in, const Value& v, CallArgs& a) {
  const int64_t n = int_arg(a, 0, "linecount", 1);
  if (n <= 0) throw_error("ValueError: batch size must be positive");
  const Value* fill = a.get(1, "fill_with");
  std::vector<Value> out, cur;
  for (const Value& item : in.iterate(v)) {
    cur.push_back(item);
    if (static_cast<int64_t>(cur.size()) == n) {
      out.push_back(Value::list(std::move(cur)));
      cur.clear();
    }
  }
  if (!cur.empty()) {
    if (fill && !fill->is_none())
      while (static_cast<int64_t>(cur.size()) < n) cur.push_back(*fill);
    out.push_back(Value::list(std::move(cur)));
  }
  return Value::generator(std::move(out));
}

Value f_attr(Interpreter& in, const Value& v, CallArgs& a) { return in.get_attr(v, arg(a, 0, "name", kNone).str()); }

Value f_format(Interpreter&, const Value& v, CallArgs& a) {
  if (!a.keyword.empty()) throw_error("FilterArgumentError: can't handle positional and keyword arguments at the same time");
  return Value::string(percent_format(v.str(), Value::tuple(a.positional)));
}

Value f_center(Interpreter& in, const Value& v, CallArgs& a) {
  const std::string s = v.str();
  const auto width = static_cast<size_t>(std::max<int64_t>(0, int_arg(a, 0, "width", 80)));
  in.check_string_size(width);
  const size_t len = utf8::length(s);
  if (len >= width) return Value::string(s);
  const size_t pad = width - len, left = pad / 2 + (pad & width & 1);
  return Value::string(std::string(left, ' ') + s + std::string(pad - left, ' '));
}

const std::unordered_map<std::string, FilterFn>& filters() {
  static const std::unordered_map<std::string, FilterFn> k = {
      {"tojson", f_tojson}, {"length", f_length}, {"count", f_length}, {"trim", f_trim}, {"upper", f_upper},
      {"lower", f_lower}, {"title", f_title}, {"capitalize", f_capitalize}, {"replace", f_replace},
      {"join", f_join}, {"items", f_items}, {"select", f_select}, {"reject", f_reject},
      {"selectattr", f_selectattr}, {"rejectattr", f_rejectattr}, {"map", f_map}, {"first", f_first},
      {"last", f_last}, {"default", f_default}, {"d", f_default}, {"string", f_string}, {"int", f_int},
      {"float", f_float}, {"list", f_list}, {"unique", f_unique}, {"sort", f_sort}, {"reverse", f_reverse},
      {"indent", f_indent}, {"safe", f_safe}, {"escape", f_escape}, {"e", f_escape}, {"forceescape", f_forceescape},
      {"wordcount", f_wordcount}, {"abs", f_abs}, {"round", f_round}, {"batch", f_batch},
      {"dictsort", f_dictsort}, {"sum", f_sum}, {"min", f_min}, {"max", f_max}, {"attr", f_attr},
      {"format", f_format}, {"center", f_center},
  };
  return k;
}

// ---------------------------------------------------------------------------------------------
// Tests

bool t_defined(Interpreter&, const Value& v, CallArgs&) { return !v.is_undefined(); }
bool t_undefined(Interpreter&, const Value& v, CallArgs&) { return v.is_undefined(); }
bool t_none(Interpreter&, const Value& v, CallArgs&) { return v.is_none(); }
bool t_boolean(Interpreter&, const Value& v, CallArgs&) { return v.is_bool(); }
bool t_true(Interpreter&, const Value& v, CallArgs&) { return v.is_bool() && v.as_bool(); }
bool t_false(Interpreter&, const Value& v, CallArgs&) { return v.is_bool() && !v.as_bool(); }
bool t_integer(Interpreter&, const Value& v, CallArgs&) { return v.is_int(); }
bool t_float(Interpreter&, const Value& v, CallArgs&) { return v.is_float(); }
bool t_number(Interpreter&, const Value& v, CallArgs&) { return v.is_number(); }
bool t_string(Interpreter&, const Value& v, CallArgs&) { return v.is_string(); }
bool t_mapping(Interpreter&, const Value& v, CallArgs&) { return v.is_dict() && !v.is_namespace(); }
bool t_iterable(Interpreter&, const Value& v, CallArgs&) {
  return v.is_undefined() || v.is_string() || v.is_list() || (v.is_dict() && !v.is_namespace());
}
bool t_sequence(Interpreter&, const Value& v, CallArgs&) {
  return v.is_string() || (v.is_list() && !v.is_generator()) || (v.is_dict() && !v.is_namespace());
}
bool t_callable(Interpreter&, const Value& v, CallArgs&) { return v.is_function(); }

const Value& test_operand(const CallArgs& a) {
  if (a.positional.empty() && a.keyword.empty()) throw_error("TypeError: test requires an argument");
  return a.positional.empty() ? a.keyword[0].second : a.positional[0];
}
bool t_eq(Interpreter&, const Value& v, CallArgs& a) { return values_equal(v, test_operand(a)); }
bool t_ne(Interpreter&, const Value& v, CallArgs& a) { return !values_equal(v, test_operand(a)); }
bool t_lt(Interpreter&, const Value& v, CallArgs& a) { return compare_values(v, test_operand(a), "<") < 0; }
bool t_le(Interpreter&, const Value& v, CallArgs& a) { return compare_values(v, test_operand(a), "<=") <= 0; }
bool t_gt(Interpreter&, const Value& v, CallArgs& a) { return compare_values(v, test_operand(a), ">") > 0; }
bool t_ge(Interpreter&, const Value& v, CallArgs& a) { return compare_values(v, test_operand(a), ">=") >= 0; }
bool t_in(Interpreter&, const Value& v, CallArgs& a) { return contains(test_operand(a), v); }
bool t_sameas(Interpreter&, const Value& v, CallArgs& a) {
  const Value& o = test_operand(a);
  if (v.kind() != o.kind()) return false;
  return values_equal(v, o);
}

int64_t int_operand(const Value& v) {
  if (v.is_undefined()) v.fail_undefined();
  if (!v.is_int() && !v.is_bool()) throw_error("TypeError: expected an integer, got " + v.type_name());
  return v.as_int();
}
bool t_odd(Interpreter&, const Value& v, CallArgs&) { return (int_operand(v) % 2) != 0; }
bool t_even(Interpreter&, const Value& v, CallArgs&) { return (int_operand(v) % 2) == 0; }
bool t_divisibleby(Interpreter&, const Value& v, CallArgs& a) {
  const int64_t d = int_operand(test_operand(a));
  if (d == 0) throw_error("ZeroDivisionError: integer division or modulo by zero");
  return (int_operand(v) % d) == 0;
}

bool case_test(Interpreter& in, const Value& v, const char* method) {
  CallArgs none;
  return in.call(get_method(in, Value::string(v.str()), method), none).truthy();
}
bool t_lower(Interpreter& in, const Value& v, CallArgs&) { return case_test(in, v, "islower"); }
bool t_upper(Interpreter& in, const Value& v, CallArgs&) { return case_test(in, v, "isupper"); }
bool t_filter(Interpreter&, const Value& v, CallArgs&) { return v.is_string() && find_filter(v.as_string()); }
bool t_test(Interpreter&, const Value& v, CallArgs&) { return v.is_string() && find_test(v.as_string()); }
bool t_escaped(Interpreter&, const Value& v, CallArgs&) { return v.is_markup(); }

const std::unordered_map<std::string, TestFn>& tests() {
  static const std::unordered_map<std::string, TestFn> k = {
      {"defined", t_defined}, {"undefined", t_undefined}, {"none", t_none}, {"boolean", t_boolean},
      {"true", t_true}, {"false", t_false}, {"integer", t_integer}, {"float", t_float}, {"number", t_number},
      {"string", t_string}, {"mapping", t_mapping}, {"iterable", t_iterable}, {"sequence", t_sequence},
      {"callable", t_callable}, {"equalto", t_eq}, {"eq", t_eq}, {"==", t_eq}, {"ne", t_ne}, {"!=", t_ne},
      {"lt", t_lt}, {"lessthan", t_lt}, {"<", t_lt}, {"le", t_le}, {"<=", t_le}, {"gt", t_gt},
      {"greaterthan", t_gt}, {">", t_gt}, {"ge", t_ge}, {">=", t_ge}, {"in", t_in}, {"sameas", t_sameas},
      {"odd", t_odd}, {"even", t_even}, {"divisibleby", t_divisibleby}, {"lower", t_lower}, {"upper", t_upper},
      {"filter", t_filter}, {"test", t_test}, {"escaped", t_escaped},
  };
  return k;
}

// ---------------------------------------------------------------------------------------------
// Globals

Value g_range(Interpreter& in, CallArgs& a) {
  std::vector<int64_t> p;
  for (const Value& v : a.positional) {
    if (!v.is_int() && !v.is_bool()) throw_error("TypeError: '" + v.type_name() + "' object cannot be interpreted as an integer");
    p.push_back(v.as_int());
  }
  if (p.empty() || p.size() > 3) throw_error("TypeError: range expected 1 to 3 arguments");
  const int64_t start = p.size() == 1 ? 0 : p[0], stop = p.size() == 1 ? p[0] : p[1], step = p.size() == 3 ? p[2] : 1;
  if (step == 0) throw_error("ValueError: range() arg 3 must not be zero");
  const double count = std::ceil((static_cast<double>(stop) - static_cast<double>(start)) / static_cast<double>(step));
  if (count > static_cast<double>(in.options().limits.max_collection_size))
    throw_error("LimitError: range of " + format_float(count).substr(0, format_float(count).size() - 2) +
                " items exceeds the limit of " + std::to_string(in.options().limits.max_collection_size));
  const __int128 span = static_cast<__int128>(stop) - start;
  const __int128 n = step > 0 ? (span > 0 ? (span + step - 1) / step : 0) : (span < 0 ? (span + step + 1) / step : 0);
  std::vector<Value> out;
  out.reserve(static_cast<size_t>(n));
  for (__int128 k = 0; k < n; ++k) out.push_back(Value::integer(static_cast<int64_t>(start + k * step)));
  return Value::list(std::move(out));
}

Value g_dict(Interpreter& in, CallArgs& a) {
  Value d = Value::dict();
  if (!a.positional.empty()) {
    const Value& src = a.positional[0];
    if (src.is_dict()) {
      for (const auto& [k, v] : src.dict_data().entries) d.mutable_dict_data().set(k, v);
    } else {
      for (const Value& pair : in.iterate(src)) {
        if (!pair.is_list() || pair.items().size() != 2) throw_error("ValueError: dictionary update sequence element has wrong length");
        d.mutable_dict_data().set(pair.items()[0], pair.items()[1]);
      }
    }
  }
  for (const auto& [k, v] : a.keyword) d.mutable_dict_data().set(Value::string(k), v);
  return d;
}

Value g_namespace(Interpreter& in, CallArgs& a) {
  Value ns = Value::make_namespace();
  in.track_namespace(ns);
  Value init = g_dict(in, a);
  for (const auto& [k, v] : init.dict_data().entries) ns.mutable_dict_data().set(k, v);
  return ns;
}

Value g_raise_exception(Interpreter&, CallArgs& a) {
  throw_error("TemplateError: " + (a.positional.empty() ? std::string() : a.positional[0].str()));
}

Value g_strftime_now(Interpreter& in, CallArgs& a) {
  if (a.positional.empty() || !a.positional[0].is_string()) throw_error("TypeError: strftime_now() needs a format string");
  const std::string& fmt = a.positional[0].as_string();
  if (fmt.size() > 1024) throw_error("ValueError: strftime_now() format longer than 1024 bytes");
  std::tm tm = in.now();
  std::string buf(fmt.size() * 16 + 64, '\0');
  const size_t n = std::strftime(buf.data(), buf.size(), fmt.c_str(), &tm);
  buf.resize(n);
  return Value::string(std::move(buf));
}

Value g_joiner(Interpreter&, CallArgs& a) {
  const std::string sep = arg(a, 0, "sep", Value::string(", ")).str();
  auto used = std::make_shared<bool>(false);
  return Value::function("joiner", [sep, used](Interpreter&, CallArgs&) {
    if (!*used) {
      *used = true;
      return Value::string("");
    }
    return Value::string(sep);
  });
}

Value g_cycler(Interpreter& in, CallArgs& a) {
  auto items = std::make_shared<std::vector<Value>>(a.positional);
  auto pos = std::make_shared<size_t>(0);
  Value c = Value::make_namespace();
  in.track_namespace(c);
  c.mutable_dict_data().set(Value::string("next"), Value::function("next", [items, pos](Interpreter&, CallArgs&) {
    if (items->empty()) return Value::none();
    Value v = (*items)[*pos % items->size()];
    ++*pos;
    return v;
  }));
  return c;
}

}  // namespace

FilterFn find_filter(const std::string& name) {
  auto it = filters().find(name);
  return it == filters().end() ? nullptr : it->second;
}

TestFn find_test(const std::string& name) {
  auto it = tests().find(name);
  return it == tests().end() ? nullptr : it->second;
}

void add_globals(Scope& scope) {
  scope.vars["range"] = Value::function("range", g_range);
  scope.vars["dict"] = Value::function("dict", g_dict);
  scope.vars["namespace"] = Value::function("namespace", g_namespace);
  scope.vars["raise_exception"] = Value::function("raise_exception", g_raise_exception);
  scope.vars["strftime_now"] = Value::function("strftime_now", g_strftime_now);
  scope.vars["joiner"] = Value::function("joiner", g_joiner);
  scope.vars["cycler"] = Value::function("cycler", g_cycler);
}

}  // namespace kite::jinja

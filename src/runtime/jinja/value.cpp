// kite/src/runtime/jinja/value.cpp — Value construction, Python-style printing, equality and
// ordering, JSON in (ordered) and out (Python's json.dumps formatting).
#include "src/runtime/jinja/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "src/runtime/jinja/utf8.h"

namespace kite::jinja {

void throw_error(std::string message) { throw TemplateError(std::move(message)); }

const Value* CallArgs::get(size_t index, std::string_view name) const {
  for (const auto& [k, v] : keyword)
    if (k == name) return &v;
  if (index < positional.size()) return &positional[index];
  return nullptr;
}

namespace {
const std::vector<Value> kEmptyItems;
const std::string kEmptyString;
}

const std::string& Value::as_string() const {
  if ((kind_ == Kind::kString || kind_ == Kind::kUndefined) && ptr_) return *static_cast<const std::string*>(ptr_.get());
  return kEmptyString;
}

Value Value::list(std::vector<Value> items) {
  Value v = make(Kind::kList);
  auto data = std::make_shared<ListData>();
  data->items = std::move(items);
  v.ptr_ = std::move(data);
  return v;
}

Value Value::tuple(std::vector<Value> items) {
  Value v = list(std::move(items));
  const_cast<ListData*>(static_cast<const ListData*>(v.ptr_.get()))->tuple = true;
  return v;
}

Value Value::generator(std::vector<Value> items) {
  Value v = list(std::move(items));
  const_cast<ListData*>(static_cast<const ListData*>(v.ptr_.get()))->generator = true;
  return v;
}

Value Value::dict() {
  Value v = make(Kind::kDict);
  v.ptr_ = std::make_shared<DictData>();
  return v;
}

Value Value::make_namespace() {
  Value v = dict();
  v.mutable_dict_data().is_namespace = true;
  return v;
}

Value Value::function(std::string name, NativeFn fn) {
  Value v = make(Kind::kFunction);
  v.ptr_ = std::make_shared<const FunctionData>(FunctionData{std::move(name), std::move(fn)});
  return v;
}

namespace {
const ListData& list_of(const std::shared_ptr<const void>& p) { return *static_cast<const ListData*>(p.get()); }
}  // namespace

bool Value::is_tuple() const { return kind_ == Kind::kList && list_of(ptr_).tuple; }
bool Value::is_generator() const { return kind_ == Kind::kList && list_of(ptr_).generator; }
bool Value::is_namespace() const { return kind_ == Kind::kDict && dict_data().is_namespace; }

const std::vector<Value>& Value::items() const { return kind_ == Kind::kList ? list_of(ptr_).items : kEmptyItems; }
const DictData& Value::dict_data() const { return *static_cast<const DictData*>(ptr_.get()); }
// Dicts are built in place before they are shared; namespaces stay mutable (jinja2 semantics).
DictData& Value::mutable_dict_data() const { return *const_cast<DictData*>(static_cast<const DictData*>(ptr_.get())); }
const FunctionData& Value::function_data() const { return *static_cast<const FunctionData*>(ptr_.get()); }

bool Value::truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
    case Kind::kInt:
      return n_.i != 0;
    case Kind::kFloat:
      return n_.f != 0.0;
    case Kind::kString:
      return !as_string().empty();
    case Kind::kList:
      return list_of(ptr_).generator || !list_of(ptr_).items.empty();
    case Kind::kDict:
      return dict_data().is_namespace || !dict_data().entries.empty();
    case Kind::kFunction:
      return true;
  }
  return false;
}

std::string Value::type_name() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kList:
      return is_generator() ? "generator" : is_tuple() ? "tuple" : "list";
    case Kind::kDict:
      return is_namespace() ? "Namespace" : "dict";
    case Kind::kFunction:
      return "function";
  }
  return "object";
}

std::string html_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

void Value::fail_undefined() const {
  if (unsafe_) throw_error("SecurityError: " + as_string());
  if (as_string().empty()) throw_error("UndefinedError: value is undefined");
  throw_error("UndefinedError: " + as_string());
}

std::string Value::str() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "";
    case Kind::kString:
      return as_string();
    case Kind::kFunction:
      return "<function " + function_data().name + ">";
    case Kind::kList:
      if (is_generator()) return "<generator object>";
      return repr();
    default:
      return repr();
  }
}

std::string Value::repr_at(int depth) const {
  if (depth > kMaxDepth) throw_error("RecursionError: maximum recursion depth exceeded while getting the repr of an object");
  switch (kind_) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return n_.i ? "True" : "False";
    case Kind::kInt:
      return std::to_string(n_.i);
    case Kind::kFloat:
      return format_float(n_.f);
    case Kind::kString:
      return repr_string(as_string());
    case Kind::kFunction:
      return "<function " + function_data().name + ">";
    case Kind::kList: {
      const ListData& l = list_of(ptr_);
      if (l.generator) return "<generator object>";
      std::string s = l.tuple ? "(" : "[";
      for (size_t i = 0; i < l.items.size(); ++i) {
        if (i) s += ", ";
        s += l.items[i].repr_at(depth + 1);
        if (s.size() > kMaxPrintedBytes) throw_error("LimitError: printed value larger than " + std::to_string(kMaxPrintedBytes) + " bytes");
      }
      if (l.tuple && l.items.size() == 1) s += ",";
      return s + (l.tuple ? ")" : "]");
    }
    case Kind::kDict: {
      std::string s = "{";
      bool first = true;
      for (const auto& [k, v] : dict_data().entries) {
        if (!first) s += ", ";
        first = false;
        s += k.repr_at(depth + 1) + ": " + v.repr_at(depth + 1);
        if (s.size() > kMaxPrintedBytes) throw_error("LimitError: printed value larger than " + std::to_string(kMaxPrintedBytes) + " bytes");
      }
      s += "}";
      return is_namespace() ? "<Namespace " + s + ">" : s;
    }
  }
  return "";
}

std::string format_float(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  std::string sign;
  if (sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  const size_t epos = sci.find('e');
  const int exp = std::atoi(sci.c_str() + epos + 1);
  std::string digits;
  for (size_t i = 0; i < epos; ++i)
    if (sci[i] != '.') digits.push_back(sci[i]);
  const int ndigits = static_cast<int>(digits.size());
  if (exp < -4 || exp >= 16) {
    std::string s = sign + digits.substr(0, 1);
    if (ndigits > 1) s += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof(eb), "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    return s + eb;
  }
  const int decpt = exp + 1;
  if (decpt <= 0) return sign + "0." + std::string(-decpt, '0') + digits;
  if (decpt >= ndigits) return sign + digits + std::string(decpt - ndigits, '0') + ".0";
  return sign + digits.substr(0, decpt) + "." + digits.substr(decpt);
}

std::string repr_string(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, quote);
  for (char32_t c : utf8::decode(s)) {
    char buf[16];
    if (c == '\\') {
      out += "\\\\";
    } else if (c == static_cast<char32_t>(quote)) {
      out += '\\';
      out += quote;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7F || (c >= 0x80 && c <= 0xA0) || c == 0xAD) {
      std::snprintf(buf, sizeof(buf), "\\x%02x", static_cast<unsigned>(c));
      out += buf;
    } else if (c == 0x2028 || c == 0x2029 || (c >= 0xD800 && c <= 0xDFFF)) {
      std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(c));
      out += buf;
    } else {
      utf8::append(out, c);
    }
  }
  out += quote;
  return out;
}

const Value* DictData::find(const Value& key) const {
  for (const auto& [k, v] : entries)
    if (values_equal(k, key)) return &v;
  return nullptr;
}

const Value* DictData::find(std::string_view key) const {
  for (const auto& [k, v] : entries)
    if (k.is_string() && k.as_string() == key) return &v;
  return nullptr;
}

void DictData::set(const Value& key, Value value) {
  for (auto& [k, v] : entries) {
    if (values_equal(k, key)) {
      v = std::move(value);
      return;
    }
  }
  entries.emplace_back(key, std::move(value));
}

bool values_equal(const Value& a, const Value& b) {
  using K = Value::Kind;
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case K::kUndefined:
    case K::kNone:
      return true;
    case K::kString:
      return a.as_string() == b.as_string();
    case K::kList: {
      if (a.is_tuple() != b.is_tuple() || a.is_generator() || b.is_generator()) return false;
      const auto& x = a.items();
      const auto& y = b.items();
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i)
        if (!values_equal(x[i], y[i])) return false;
      return true;
    }
    case K::kDict: {
      if (a.is_namespace() || b.is_namespace()) return &a.dict_data() == &b.dict_data();
      const auto& x = a.dict_data().entries;
      const auto& y = b.dict_data();
      if (x.size() != y.entries.size()) return false;
      for (const auto& [k, v] : x) {
        const Value* o = y.find(k);
        if (!o || !values_equal(v, *o)) return false;
      }
      return true;
    }
    case K::kFunction:
      return &a.function_data() == &b.function_data();
    default:
      return false;
  }
}

int compare_values(const Value& a, const Value& b, std::string_view op) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) {
      const double x = a.as_double(), y = b.as_double();
      return x < y ? -1 : x > y ? 1 : 0;
    }
    return a.as_int() < b.as_int() ? -1 : a.as_int() > b.as_int() ? 1 : 0;
  }
  if (a.is_undefined() || b.is_undefined()) (a.is_undefined() ? a : b).fail_undefined();
  if (a.is_string() && b.is_string()) {
    const int c = a.as_string().compare(b.as_string());
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
    const auto& x = a.items();
    const auto& y = b.items();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (values_equal(x[i], y[i])) continue;
      return compare_values(x[i], y[i], op);
    }
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  throw_error("TypeError: '" + std::string(op) + "' not supported between instances of '" + a.type_name() +
              "' and '" + b.type_name() + "'");
}

Value Value::from_json(const nlohmann::ordered_json& j, int depth) {
  if (depth > kMaxDepth) throw_error("context JSON nested deeper than " + std::to_string(kMaxDepth) + " levels");
  using J = nlohmann::ordered_json::value_t;
  switch (j.type()) {
    case J::null:
      return none();
    case J::boolean:
      return boolean(j.get<bool>());
    case J::number_integer:
      return integer(j.get<int64_t>());
    case J::number_unsigned: {
      const auto u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return number(static_cast<double>(u));
      return integer(static_cast<int64_t>(u));
    }
    case J::number_float:
      return number(j.get<double>());
    case J::string:
      return string(j.get<std::string>());
    case J::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(from_json(e, depth + 1));
      return list(std::move(items));
    }
    case J::object: {
      Value d = dict();
      auto& entries = d.mutable_dict_data().entries;
      entries.reserve(j.size());
      for (const auto& [k, v] : j.items()) entries.emplace_back(string(k), from_json(v, depth + 1));
      return d;
    }
    default:
      return none();
  }
}

// ---------------------------------------------------------------------------------------------
// json.dumps

namespace {

void json_string(std::string& out, std::string_view s, bool ensure_ascii) {
  out += '"';
  char buf[16];
  for (char32_t c : utf8::decode(s)) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20 || (ensure_ascii && c >= 0x7F)) {
          if (c >= 0x10000) {
            const char32_t v = c - 0x10000;
            std::snprintf(buf, sizeof(buf), "\\u%04x\\u%04x", static_cast<unsigned>(0xD800 + (v >> 10)),
                          static_cast<unsigned>(0xDC00 + (v & 0x3FF)));
          } else {
            std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(c));
          }
          out += buf;
        } else {
          utf8::append(out, c);
        }
    }
  }
  out += '"';
}

std::string json_float(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d < 0 ? "-Infinity" : "Infinity";
  return format_float(d);
}

std::string json_key(const Value& k) {
  switch (k.kind()) {
    case Value::Kind::kString:
      return k.as_string();
    case Value::Kind::kInt:
      return std::to_string(k.as_int());
    case Value::Kind::kBool:
      return k.as_bool() ? "true" : "false";
    case Value::Kind::kFloat:
      return json_float(k.as_double());
    case Value::Kind::kNone:
      return "null";
    default:
      throw_error("TypeError: keys must be str, int, float, bool or None, not " + k.type_name());
  }
}

class JsonWriter {
 public:
  explicit JsonWriter(const JsonOptions& o) : o_(o) {
    if (o.indent_is_string) {
      unit_ = o.indent_string;
      pretty_ = true;
    } else if (o.indent >= 0) {
      unit_ = std::string(static_cast<size_t>(o.indent), ' ');
      pretty_ = true;
    }
    item_sep_ = o.separators_given ? o.item_separator : (pretty_ ? "," : ", ");
    key_sep_ = o.separators_given ? o.key_separator : ": ";
  }

  void write(std::string& out, const Value& v, int depth) {
    if (out.size() > Value::kMaxPrintedBytes)
      throw_error("LimitError: JSON text larger than " + std::to_string(Value::kMaxPrintedBytes) + " bytes");
    if (depth > 512) throw_error("RecursionError: maximum recursion depth exceeded in json.dumps");
    switch (v.kind()) {
      case Value::Kind::kNone:
        out += "null";
        return;
      case Value::Kind::kBool:
        out += v.as_bool() ? "true" : "false";
        return;
      case Value::Kind::kInt:
        out += std::to_string(v.as_int());
        return;
      case Value::Kind::kFloat:
        out += json_float(v.as_double());
        return;
      case Value::Kind::kString:
        json_string(out, v.as_string(), o_.ensure_ascii);
        return;
      case Value::Kind::kList:
        if (v.is_generator()) break;
        write_list(out, v.items(), depth);
        return;
      case Value::Kind::kDict:
        if (v.is_namespace()) break;
        write_dict(out, v.dict_data(), depth);
        return;
      default:
        break;
    }
    throw_error("TypeError: Object of type " + v.type_name() + " is not JSON serializable");
  }

 private:
  void newline(std::string& out, int depth) {
    out += '\n';
    for (int i = 0; i < depth; ++i) out += unit_;
  }

  void write_list(std::string& out, const std::vector<Value>& items, int depth) {
    if (items.empty()) {
      out += "[]";
      return;
    }
    out += '[';
    for (size_t i = 0; i < items.size(); ++i) {
      if (i) out += item_sep_;
      if (pretty_) newline(out, depth + 1);
      write(out, items[i], depth + 1);
    }
    if (pretty_) newline(out, depth);
    out += ']';
  }

  void write_dict(std::string& out, const DictData& d, int depth) {
    if (d.entries.empty()) {
      out += "{}";
      return;
    }
    std::vector<std::pair<std::string, const Value*>> entries;
    entries.reserve(d.entries.size());
    for (const auto& [k, v] : d.entries) entries.emplace_back(json_key(k), &v);
    if (o_.sort_keys)
      std::stable_sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    out += '{';
    for (size_t i = 0; i < entries.size(); ++i) {
      if (i) out += item_sep_;
      if (pretty_) newline(out, depth + 1);
      json_string(out, entries[i].first, o_.ensure_ascii);
      out += key_sep_;
      write(out, *entries[i].second, depth + 1);
    }
    if (pretty_) newline(out, depth);
    out += '}';
  }

  const JsonOptions& o_;
  std::string unit_;
  bool pretty_ = false;
  std::string item_sep_, key_sep_;
};

}  // namespace

std::string to_json(const Value& v, const JsonOptions& options) {
  std::string out;
  JsonWriter(options).write(out, v, 0);
  return out;
}

}  // namespace kite::jinja

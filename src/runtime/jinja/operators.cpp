// kite/src/runtime/jinja/operators.cpp — Python semantics of + - * / // % ** ~, unary - +, `in`,
// and printf-style string formatting. TypeErrors carry Python's messages.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "src/runtime/jinja/interpreter.h"
#include "src/runtime/jinja/utf8.h"

namespace kite::jinja {
namespace {

[[noreturn]] void unsupported(const std::string& op, const Value& a, const Value& b) {
  throw_error("TypeError: unsupported operand type(s) for " + op + ": '" + a.type_name() + "' and '" + b.type_name() +
              "'");
}

Value repeat(Interpreter& in, const Value& seq, int64_t n) {
  if (n <= 0) return seq.is_string() ? Value::string("") : Value::list({});
  const size_t len = seq.is_string() ? seq.as_string().size() : seq.items().size();
  const auto times = static_cast<uint64_t>(n);
  if (seq.is_string()) {
    const size_t limit = in.options().limits.max_output_bytes;
    if (len && times > limit / len)
      throw_error("LimitError: repeating a string of " + std::to_string(len) + " bytes " + std::to_string(n) +
                  " times exceeds the limit of " + std::to_string(limit) + " bytes");
    in.count_bytes(len * times);
    std::string out;
    out.reserve(len * times);
    for (int64_t i = 0; i < n; ++i) out += seq.as_string();
    return Value::string(std::move(out));
  }
  const size_t limit = in.options().limits.max_collection_size;
  if (len && times > limit / len)
    throw_error("LimitError: repeating a list of " + std::to_string(len) + " items " + std::to_string(n) +
                " times exceeds the limit of " + std::to_string(limit) + " items");
  std::vector<Value> out;
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), seq.items().begin(), seq.items().end());
  return seq.is_tuple() ? Value::tuple(std::move(out)) : Value::list(std::move(out));
}

template <class Op>
Value checked(Op op, int64_t x, int64_t y) {
  int64_t r = 0;
  if (op(x, y, &r)) throw_error("OverflowError: integer result out of the 64-bit range");
  return Value::integer(r);
}

int64_t floor_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

Value arithmetic(const std::string& op, const Value& a, const Value& b) {
  const bool as_float = a.is_float() || b.is_float();
  if (op == "/") {
    if (b.as_double() == 0) throw_error("ZeroDivisionError: division by zero");
    return Value::number(a.as_double() / b.as_double());
  }
  if (as_float) {
    const double x = a.as_double(), y = b.as_double();
    if (op == "+") return Value::number(x + y);
    if (op == "-") return Value::number(x - y);
    if (op == "*") return Value::number(x * y);
    if (op == "//" || op == "%") {
      if (y == 0) throw_error(std::string("ZeroDivisionError: float ") + (op == "%" ? "modulo" : "floor division by zero"));
      if (op == "//") return Value::number(std::floor(x / y));
      double m = std::fmod(x, y);
      if (m != 0 && ((m < 0) != (y < 0))) m += y;
      return Value::number(m);
    }
    if (op == "**") return Value::number(std::pow(x, y));
  }
  const int64_t x = a.as_int(), y = b.as_int();
  if (op == "+") return checked([](int64_t p, int64_t q, int64_t* r) { return __builtin_add_overflow(p, q, r); }, x, y);
  if (op == "-") return checked([](int64_t p, int64_t q, int64_t* r) { return __builtin_sub_overflow(p, q, r); }, x, y);
  if (op == "*") return checked([](int64_t p, int64_t q, int64_t* r) { return __builtin_mul_overflow(p, q, r); }, x, y);
  if (op == "//" || op == "%") {
    if (y == 0) throw_error(std::string("ZeroDivisionError: integer ") + (op == "%" ? "modulo by zero" : "division or modulo by zero"));
    if (y == -1) {  // INT64_MIN / -1 does not fit (and traps in hardware)
      if (op == "%") return Value::integer(0);
      if (x == std::numeric_limits<int64_t>::min()) throw_error("OverflowError: integer result out of the 64-bit range");
      return Value::integer(-x);
    }
    if (op == "//") return Value::integer(floor_div(x, y));
    return Value::integer(x - floor_div(x, y) * y);
  }
  if (op == "**") {
    if (y < 0) return Value::number(std::pow(static_cast<double>(x), static_cast<double>(y)));
    int64_t result = 1;
    for (int64_t i = 0; i < y; ++i) {
      if (__builtin_mul_overflow(result, x, &result)) throw_error("OverflowError: integer result out of the 64-bit range");
      if (result == 0 || result == 1) break;
    }
    return Value::integer(result);
  }
  unsupported(op, a, b);
}

}  // namespace

Value binary_op(Interpreter& in, const std::string& op, const Value& a, const Value& b) {
  if (op == "~") {
    if (a.is_string() && b.is_string()) {  // the common case, without temporary copies
      in.check_string_size(a.as_string().size() + b.as_string().size());
      in.count_bytes(a.as_string().size() + b.as_string().size());
      std::string s;
      s.reserve(a.as_string().size() + b.as_string().size());
      s += a.as_string();
      s += b.as_string();
      return Value::string(std::move(s));
    }
    std::string s = a.str();
    s += b.str();
    in.check_string_size(s.size());
    in.count_bytes(s.size());
    return Value::string(std::move(s));
  }
  if (a.is_undefined()) a.fail_undefined();
  if (b.is_undefined()) b.fail_undefined();
  if (a.is_number() && b.is_number()) return arithmetic(op, a, b);
  if (op == "+") {
    if (a.is_string() && b.is_string()) {
      in.check_string_size(a.as_string().size() + b.as_string().size());
      in.count_bytes(a.as_string().size() + b.as_string().size());
      if (a.is_markup() || b.is_markup()) {  // markupsafe: the plain side is escaped
        const std::string l = a.is_markup() ? a.as_string() : html_escape(a.as_string());
        const std::string r = b.is_markup() ? b.as_string() : html_escape(b.as_string());
        return Value::markup(l + r);
      }
      return Value::string(a.as_string() + b.as_string());
    }
    if (a.is_list() && b.is_list() && !a.is_generator() && !b.is_generator() && a.is_tuple() == b.is_tuple()) {
      std::vector<Value> items = a.items();
      items.insert(items.end(), b.items().begin(), b.items().end());
      in.check_collection_size(items.size());
      return a.is_tuple() ? Value::tuple(std::move(items)) : Value::list(std::move(items));
    }
    if (a.is_string())
      throw_error("TypeError: can only concatenate str (not \"" + b.type_name() + "\") to str");
    if (a.is_list() && !a.is_generator())
      throw_error("TypeError: can only concatenate " + a.type_name() + " (not \"" + b.type_name() + "\") to " +
                  a.type_name());
  }
  if (op == "*") {
    if ((a.is_string() || (a.is_list() && !a.is_generator())) && (b.is_int() || b.is_bool())) return repeat(in, a, b.as_int());
    if ((b.is_string() || (b.is_list() && !b.is_generator())) && (a.is_int() || a.is_bool())) return repeat(in, b, a.as_int());
  }
  if (op == "%" && a.is_string()) {
    std::string s = percent_format(a.as_string(), b);
    in.check_string_size(s.size());
    in.count_bytes(s.size());
    return Value::string(std::move(s));
  }
  unsupported(op, a, b);
}

Value unary_op(const std::string& op, const Value& a) {
  if (a.is_undefined()) a.fail_undefined();
  if (!a.is_number()) throw_error("TypeError: bad operand type for unary " + op + ": '" + a.type_name() + "'");
  if (op == "+") return a.is_bool() ? Value::integer(a.as_int()) : a;
  if (a.is_float()) return Value::number(-a.as_double());
  if (a.as_int() == std::numeric_limits<int64_t>::min()) throw_error("OverflowError: integer out of range");
  return Value::integer(-a.as_int());
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::kString:
      if (!item.is_string())
        throw_error("TypeError: 'in <string>' requires string as left operand, not " + item.type_name());
      return container.as_string().find(item.as_string()) != std::string::npos;
    case Value::Kind::kList:
      for (const auto& v : container.items())
        if (values_equal(v, item)) return true;
      return false;
    case Value::Kind::kDict:
      if (container.is_namespace()) break;
      return container.dict_data().find(item) != nullptr;
    case Value::Kind::kUndefined:
      return false;
    default:
      break;
  }
  throw_error("TypeError: argument of type '" + container.type_name() + "' is not iterable");
}

std::string percent_format(const std::string& fmt, const Value& args) {
  std::vector<Value> list;
  if (args.is_tuple())
    list = args.items();
  else
    list.push_back(args);
  size_t next = 0;
  std::string out;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out += fmt[i];
      continue;
    }
    if (++i >= fmt.size()) throw_error("ValueError: incomplete format");
    std::string spec = "%";
    while (i < fmt.size() && std::string_view("-+ #0123456789.").find(fmt[i]) != std::string_view::npos) spec += fmt[i++];
    for (size_t k = 1, run = 0; k < spec.size(); ++k) {  // no field width or precision over 1 MiB
      run = (spec[k] >= '0' && spec[k] <= '9') ? run + 1 : 0;
      if (run > 6) throw_error("LimitError: format width or precision too large in '" + spec + "'");
    }
    if (i >= fmt.size()) throw_error("ValueError: incomplete format");
    const char conv = fmt[i];
    if (conv == '%') {
      out += '%';
      continue;
    }
    if (next >= list.size()) throw_error("TypeError: not enough arguments for format string");
    const Value& v = list[next++];
    // snprintf into a string sized by a first, counting call (widths are bounded above).
    auto print = [](const std::string& f, auto x) {
      const int n = std::snprintf(nullptr, 0, f.c_str(), x);
      std::string r(static_cast<size_t>(std::max(n, 0)) + 1, '\0');
      std::snprintf(r.data(), r.size(), f.c_str(), x);
      r.pop_back();
      return r;
    };
    switch (conv) {
      case 's':
      case 'r': {
        std::string s = conv == 's' ? v.str() : v.repr();
        spec += "s";
        const int n = std::snprintf(nullptr, 0, spec.c_str(), s.c_str());
        std::string formatted(static_cast<size_t>(std::max(n, 0)) + 1, '\0');
        std::snprintf(formatted.data(), formatted.size(), spec.c_str(), s.c_str());
        formatted.pop_back();
        out += formatted;
        break;
      }
      case 'd':
      case 'i':
      case 'x':
      case 'X':
      case 'o':
        if (!v.is_number()) throw_error("TypeError: %d format: a real number is required, not " + v.type_name());
        spec += "ll";
        spec += conv == 'i' ? 'd' : conv;
        out += print(spec, static_cast<long long>(v.is_float() ? std::trunc(v.as_double()) : v.as_int()));
        break;
      case 'c':
        if (v.is_string()) {
          out += v.as_string();
        } else if (v.is_int()) {
          utf8::append(out, static_cast<char32_t>(v.as_int()));
        } else {
          throw_error("TypeError: %c requires int or char");
        }
        break;
      case 'f':
      case 'F':
      case 'e':
      case 'E':
      case 'g':
      case 'G':
        if (!v.is_number()) throw_error(std::string("TypeError: must be real number, not ") + v.type_name());
        spec += conv;
        out += print(spec, v.as_double());
        break;
      default:
        throw_error(std::string("ValueError: unsupported format character '") + conv + "'");
    }
  }
  if (next < list.size() && args.is_tuple())
    throw_error("TypeError: not all arguments converted during string formatting");
  return out;
}

}  // namespace kite::jinja

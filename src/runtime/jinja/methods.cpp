// kite/src/runtime/jinja/methods.cpp — methods of str, list and dict values as templates call
// them (`s.strip()`, `d.items()`, ...), and Python's str.format. Mutating list/dict methods are
// refused the way jinja2's ImmutableSandboxedEnvironment refuses them: an undefined whose use
// raises SecurityError.
#include <algorithm>
#include <cstdio>

#include "src/runtime/jinja/interpreter.h"
#include "src/runtime/jinja/utf8.h"

namespace kite::jinja {
namespace {

Value arg_at(const CallArgs& a, size_t i, std::string_view name, const Value& dflt) {
  const Value* v = a.get(i, name);
  return v ? *v : dflt;
}

std::string require_string(const Value& v, const char* what) {
  if (!v.is_string()) throw_error(std::string("TypeError: ") + what + " must be str, not " + v.type_name());
  return v.as_string();
}

// Python's str.strip family. `chars` null: whitespace.
std::string strip_string(const std::string& s, const Value* chars, bool left, bool right) {
  std::u32string cps = utf8::decode(s);
  std::u32string set;
  const bool ws = !chars || chars->is_none() || chars->is_undefined();
  if (!ws) set = utf8::decode(require_string(*chars, "strip arg"));
  auto strip_it = [&](char32_t c) { return ws ? utf8::is_space(c) : set.find(c) != std::u32string::npos; };
  size_t b = 0, e = cps.size();
  if (left)
    while (b < e && strip_it(cps[b])) ++b;
  if (right)
    while (e > b && strip_it(cps[e - 1])) --e;
  return utf8::encode(cps.substr(b, e - b));
}

std::vector<Value> split_string(const std::string& s, const Value* sep_v, const Value* max_v, bool from_right) {
  int64_t maxsplit = (max_v && max_v->is_int()) ? max_v->as_int() : -1;
  std::vector<std::string> parts;
  if (!sep_v || sep_v->is_none()) {
    std::u32string cps = utf8::decode(s);
    if (from_right) std::reverse(cps.begin(), cps.end());
    size_t i = 0;
    const size_t n = cps.size();
    while (true) {
      while (i < n && utf8::is_space(cps[i])) ++i;
      if (i >= n) break;
      if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
        size_t e = n;
        while (e > i && utf8::is_space(cps[e - 1])) --e;
        std::u32string rest = cps.substr(i);
        parts.push_back(utf8::encode(rest));
        break;
      }
      size_t j = i;
      while (j < n && !utf8::is_space(cps[j])) ++j;
      parts.push_back(utf8::encode(cps.substr(i, j - i)));
      i = j;
    }
    if (from_right) {
      for (auto& p : parts) {
        std::u32string c = utf8::decode(p);
        std::reverse(c.begin(), c.end());
        p = utf8::encode(c);
      }
      std::reverse(parts.begin(), parts.end());
    }
  } else {
    const std::string sep = require_string(*sep_v, "separator");
    if (sep.empty()) throw_error("ValueError: empty separator");
    if (!from_right) {
      size_t start = 0;
      while (true) {
        const size_t p = (maxsplit >= 0 && static_cast<int64_t>(parts.size()) >= maxsplit) ? std::string::npos
                                                                                            : s.find(sep, start);
        if (p == std::string::npos) {
          parts.push_back(s.substr(start));
          break;
        }
        parts.push_back(s.substr(start, p - start));
        start = p + sep.size();
      }
    } else {
      size_t end = s.size();
      while (true) {
        size_t p = std::string::npos;
        if (!(maxsplit >= 0 && static_cast<int64_t>(parts.size()) >= maxsplit) && end >= sep.size())
          p = s.rfind(sep, end - sep.size());
        if (p == std::string::npos) {
          parts.push_back(s.substr(0, end));
          break;
        }
        parts.push_back(s.substr(p + sep.size(), end - p - sep.size()));
        end = p;
      }
      std::reverse(parts.begin(), parts.end());
    }
  }
  std::vector<Value> out;
  out.reserve(parts.size());
  for (auto& p : parts) out.push_back(Value::string(std::move(p)));
  return out;
}

bool affix_match(const std::string& s, const Value& affix, bool prefix) {
  auto one = [&](const Value& v) {
    const std::string a = require_string(v, prefix ? "startswith first arg" : "endswith first arg");
    if (a.size() > s.size()) return false;
    return prefix ? s.compare(0, a.size(), a) == 0 : s.compare(s.size() - a.size(), a.size(), a) == 0;
  };
  if (affix.is_tuple()) {
    for (const auto& v : affix.items())
      if (one(v)) return true;
    return false;
  }
  return one(affix);
}

std::string case_map(const std::string& s, int mode) {  // 0 upper, 1 lower, 2 title, 3 capitalize
  std::u32string cps = utf8::decode(s);
  bool prev_cased = false;
  for (size_t i = 0; i < cps.size(); ++i) {
    char32_t& c = cps[i];
    switch (mode) {
      case 0: c = utf8::to_upper(c); break;
      case 1: c = utf8::to_lower(c); break;
      case 2: {
        const bool cased = utf8::is_cased_letter(c);
        c = prev_cased ? utf8::to_lower(c) : utf8::to_upper(c);
        prev_cased = cased;
        break;
      }
      default: c = i == 0 ? utf8::to_upper(c) : utf8::to_lower(c);
    }
  }
  return utf8::encode(cps);
}

int64_t count_substr(const std::string& s, const std::string& sub) {
  if (sub.empty()) return static_cast<int64_t>(utf8::length(s)) + 1;
  int64_t n = 0;
  for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
  return n;
}

int64_t cp_index(const std::string& s, size_t byte_pos) {
  return static_cast<int64_t>(utf8::length(std::string_view(s).substr(0, byte_pos)));
}

std::string replace_all(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  std::string out;
  if (from.empty()) {
    std::u32string cps = utf8::decode(s);
    int64_t n = 0;
    for (char32_t c : cps) {
      if (count < 0 || n < count) {
        out += to;
        ++n;
      }
      utf8::append(out, c);
    }
    if (count < 0 || n < count) out += to;
    return out;
  }
  size_t start = 0;
  int64_t n = 0;
  while (true) {
    const size_t p = (count >= 0 && n >= count) ? std::string::npos : s.find(from, start);
    if (p == std::string::npos) break;
    out.append(s, start, p - start);
    out += to;
    start = p + from.size();
    ++n;
  }
  out.append(s, start, std::string::npos);
  return out;
}

Value string_method(Interpreter& in, const std::string& s, const std::string& name) {
  auto fn = [&name](NativeFn f) { return Value::function(name, std::move(f)); };
  const Value none = Value::none();
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const bool l = name != "rstrip", r = name != "lstrip";
    return fn([s, l, r](Interpreter&, CallArgs& a) { return Value::string(strip_string(s, a.get(0, "chars"), l, r)); });
  }
  if (name == "split" || name == "rsplit") {
    const bool right = name == "rsplit";
    return fn([s, right](Interpreter&, CallArgs& a) {
      return Value::list(split_string(s, a.get(0, "sep"), a.get(1, "maxsplit"), right));
    });
  }
  if (name == "splitlines")
    return fn([s](Interpreter&, CallArgs&) {
      std::vector<Value> out;
      size_t start = 0;
      for (size_t i = 0; i < s.size(); ++i) {
        if (s[i] == '\n' || s[i] == '\r') {
          out.push_back(Value::string(s.substr(start, i - start)));
          if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
          start = i + 1;
        }
      }
      if (start < s.size()) out.push_back(Value::string(s.substr(start)));
      return Value::list(std::move(out));
    });
  if (name == "startswith" || name == "endswith") {
    const bool prefix = name == "startswith";
    return fn([s, prefix](Interpreter&, CallArgs& a) {
      if (a.positional.empty()) throw_error("TypeError: startswith() takes at least 1 argument (0 given)");
      return Value::boolean(affix_match(s, a.positional[0], prefix));
    });
  }
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
    const int mode = name == "upper" ? 0 : name == "lower" ? 1 : name == "title" ? 2 : 3;
    return fn([s, mode](Interpreter&, CallArgs&) { return Value::string(case_map(s, mode)); });
  }
  if (name == "replace")
    return fn([s](Interpreter& in2, CallArgs& a) {
      if (a.positional.size() < 2) throw_error("TypeError: replace expected at least 2 arguments");
      const Value& cnt = arg_at(a, 2, "count", Value::integer(-1));
      std::string r = replace_all(s, require_string(a.positional[0], "replace() argument 1"),
                                  require_string(a.positional[1], "replace() argument 2"), cnt.as_int());
      in2.check_string_size(r.size());
      in2.count_bytes(r.size());
      return Value::string(std::move(r));
    });
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex")
    return fn([s, name](Interpreter&, CallArgs& a) {
      if (a.positional.empty()) throw_error("TypeError: " + name + "() takes at least 1 argument (0 given)");
      const std::string sub = require_string(a.positional[0], "must be str");
      const size_t p = (name[0] == 'r') ? s.rfind(sub) : s.find(sub);
      if (p == std::string::npos) {
        if (name.find("index") != std::string::npos) throw_error("ValueError: substring not found");
        return Value::integer(-1);
      }
      return Value::integer(cp_index(s, p));
    });
  if (name == "count")
    return fn([s](Interpreter&, CallArgs& a) {
      if (a.positional.empty()) throw_error("TypeError: count() takes at least 1 argument (0 given)");
      return Value::integer(count_substr(s, require_string(a.positional[0], "must be str")));
    });
  if (name == "join")
    return fn([s](Interpreter& in2, CallArgs& a) {
      if (a.positional.empty()) throw_error("TypeError: join() takes exactly one argument (0 given)");
      std::string out;
      bool first = true;
      for (const auto& v : in2.iterate(a.positional[0])) {
        if (!first) out += s;
        first = false;
        out += require_string(v, "sequence item");
        in2.check_string_size(out.size());
      }
      in2.count_bytes(out.size());
      return Value::string(std::move(out));
    });
  if (name == "format")
    return fn([s](Interpreter& in2, CallArgs& a) {
      std::string r = python_format(s, a);
      in2.check_string_size(r.size());
      in2.count_bytes(r.size());
      return Value::string(std::move(r));
    });
  if (name == "isdigit" || name == "isalpha" || name == "isalnum" || name == "isspace" || name == "islower" ||
      name == "isupper" || name == "isnumeric" || name == "isdecimal")
    return fn([s, name](Interpreter&, CallArgs&) {
      std::u32string cps = utf8::decode(s);
      if (cps.empty()) return Value::boolean(false);
      bool any_cased = false;
      for (char32_t c : cps) {
        const bool digit = c >= '0' && c <= '9';
        const bool alpha = c >= 0x80 ? utf8::is_cased_letter(c) : ((c | 32) >= 'a' && (c | 32) <= 'z');
        if (name == "isdigit" || name == "isnumeric" || name == "isdecimal") {
          if (!digit) return Value::boolean(false);
        } else if (name == "isalpha") {
          if (!alpha) return Value::boolean(false);
        } else if (name == "isalnum") {
          if (!alpha && !digit) return Value::boolean(false);
        } else if (name == "isspace") {
          if (!utf8::is_space(c)) return Value::boolean(false);
        } else if (utf8::is_cased_letter(c)) {
          any_cased = true;
          if (name == "islower" ? utf8::to_lower(c) != c : utf8::to_upper(c) != c) return Value::boolean(false);
        }
      }
      return Value::boolean((name == "islower" || name == "isupper") ? any_cased : true);
    });
  (void)in;
  (void)none;
  return Value::undefined("'str object' has no attribute '" + name + "'");
}

bool is_mutating(const Value& obj, const std::string& name) {
  static const char* kList[] = {"append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse"};
  static const char* kDict[] = {"pop", "popitem", "setdefault", "update", "clear"};
  if (obj.is_list())
    return std::any_of(std::begin(kList), std::end(kList), [&](const char* n) { return name == n; });
  if (obj.is_dict())
    return std::any_of(std::begin(kDict), std::end(kDict), [&](const char* n) { return name == n; });
  return false;
}

}  // namespace

Value get_method(Interpreter& in, const Value& obj, const std::string& name) {
  if (obj.is_string()) return string_method(in, obj.as_string(), name);
  if (is_mutating(obj, name))
    return Value::unsafe("access to attribute '" + name + "' of '" + obj.type_name() + "' object is unsafe.");
  if (obj.is_dict() && !obj.is_namespace()) {
    const Value d = obj;
    if (name == "get")
      return Value::function("get", [d](Interpreter&, CallArgs& a) {
        if (a.positional.empty()) throw_error("TypeError: get expected at least 1 argument, got 0");
        if (const Value* v = d.dict_data().find(a.positional[0])) return *v;
        return a.positional.size() > 1 ? a.positional[1] : Value::none();
      });
    if (name == "items" || name == "keys" || name == "values")
      return Value::function(name, [d, name](Interpreter&, CallArgs&) {
        std::vector<Value> out;
        for (const auto& [k, v] : d.dict_data().entries) {
          if (name == "items")
            out.push_back(Value::tuple({k, v}));
          else
            out.push_back(name == "keys" ? k : v);
        }
        return Value::list(std::move(out));
      });
    if (name == "copy") return Value::function(name, [d](Interpreter&, CallArgs&) { return d; });
  }
  if (obj.is_list() && !obj.is_generator()) {
    const Value l = obj;
    if (name == "index" || name == "count")
      return Value::function(name, [l, name](Interpreter&, CallArgs& a) {
        if (a.positional.empty()) throw_error("TypeError: " + name + "() takes exactly one argument (0 given)");
        int64_t n = 0;
        for (size_t i = 0; i < l.items().size(); ++i) {
          if (!values_equal(l.items()[i], a.positional[0])) continue;
          if (name == "index") return Value::integer(static_cast<int64_t>(i));
          ++n;
        }
        if (name == "index") throw_error("ValueError: " + a.positional[0].repr() + " is not in list");
        return Value::integer(n);
      });
  }
  return Value::undefined("'" + object_description(obj) + "' has no attribute '" + name + "'");
}

// ---------------------------------------------------------------------------------------------
// str.format

namespace {

std::string format_spec(const Value& v, const std::string& spec) {
  if (spec.empty()) return v.str();
  size_t i = 0;
  char fill = ' ', align = 0;
  if (spec.size() >= 2 && std::string_view("<>^=").find(spec[1]) != std::string_view::npos) {
    fill = spec[0];
    align = spec[1];
    i = 2;
  } else if (std::string_view("<>^=").find(spec[0]) != std::string_view::npos) {
    align = spec[0];
    i = 1;
  }
  std::string sign;
  if (i < spec.size() && (spec[i] == '+' || spec[i] == '-' || spec[i] == ' ')) sign = spec[i++];
  if (i < spec.size() && spec[i] == '0') {
    fill = '0';
    if (!align) align = '=';
    ++i;
  }
  size_t width = 0;
  while (i < spec.size() && spec[i] >= '0' && spec[i] <= '9') {
    width = width * 10 + static_cast<size_t>(spec[i++] - '0');
    if (width > (size_t{1} << 20)) throw_error("LimitError: format width too large in '" + spec + "'");
  }
  int precision = -1;
  if (i < spec.size() && spec[i] == '.') {
    precision = 0;
    ++i;
    while (i < spec.size() && spec[i] >= '0' && spec[i] <= '9') {
      precision = precision * 10 + (spec[i++] - '0');
      if (precision > 1000) throw_error("LimitError: format precision too large in '" + spec + "'");
    }
  }
  const char type = i < spec.size() ? spec[i] : 0;
  std::string body;
  char buf[512];
  if (type == 'f' || type == 'F' || type == 'e' || type == 'g' || type == '%' || (v.is_float() && precision >= 0 && !type)) {
    if (!v.is_number()) throw_error("ValueError: Unknown format code '" + std::string(1, type) + "' for object of type '" + v.type_name() + "'");
    const double d = type == '%' ? v.as_double() * 100 : v.as_double();
    const char t = (type == '%' || !type) ? 'f' : type;
    std::snprintf(buf, sizeof(buf), ("%" + sign + "." + std::to_string(precision < 0 ? 6 : precision) + t).c_str(), d);
    body = buf;
    if (type == '%') body += '%';
  } else if (type == 'd' || type == 'x' || type == 'X' || type == 'o' || type == 'b') {
    if (!v.is_int() && !v.is_bool()) throw_error("ValueError: Unknown format code '" + std::string(1, type) + "' for object of type '" + v.type_name() + "'");
    if (type == 'b') {
      uint64_t u = static_cast<uint64_t>(std::llabs(v.as_int()));
      do {
        body.insert(body.begin(), static_cast<char>('0' + (u & 1)));
        u >>= 1;
      } while (u);
      if (v.as_int() < 0) body.insert(0, "-");
    } else {
      std::snprintf(buf, sizeof(buf), ("%" + sign + "ll" + std::string(1, type == 'd' ? 'd' : type)).c_str(),
                    static_cast<long long>(v.as_int()));
      body = buf;
    }
  } else {
    body = v.str();
    if (precision >= 0 && v.is_string()) body = utf8::encode(utf8::decode(body).substr(0, static_cast<size_t>(precision)));
    if (!align) align = v.is_number() ? '>' : '<';
  }
  const size_t len = utf8::length(body);
  if (len >= width) return body;
  const size_t pad = width - len;
  if (!align) align = '>';
  switch (align) {
    case '<': return body + std::string(pad, fill);
    case '^': return std::string(pad / 2, fill) + body + std::string(pad - pad / 2, fill);
    case '=':
      if (!body.empty() && (body[0] == '-' || body[0] == '+')) return body.substr(0, 1) + std::string(pad, fill) + body.substr(1);
      return std::string(pad, fill) + body;
    default: return std::string(pad, fill) + body;
  }
}

}  // namespace

std::string python_format(const std::string& fmt, const CallArgs& args) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    const char c = fmt[i];
    if (c == '}') {
      if (i + 1 < fmt.size() && fmt[i + 1] == '}') {
        out += '}';
        ++i;
        continue;
      }
      throw_error("ValueError: Single '}' encountered in format string");
    }
    if (c != '{') {
      out += c;
      continue;
    }
    if (i + 1 < fmt.size() && fmt[i + 1] == '{') {
      out += '{';
      ++i;
      continue;
    }
    const size_t close = fmt.find('}', i);
    if (close == std::string::npos) throw_error("ValueError: Single '{' encountered in format string");
    std::string field = fmt.substr(i + 1, close - i - 1);
    i = close;
    std::string spec, conv;
    if (const size_t colon = field.find(':'); colon != std::string::npos) {
      spec = field.substr(colon + 1);
      field.resize(colon);
    }
    if (const size_t bang = field.find('!'); bang != std::string::npos) {
      conv = field.substr(bang + 1);
      field.resize(bang);
    }
    const Value* v = nullptr;
    if (field.empty()) {
      if (auto_index >= args.positional.size())
        throw_error("IndexError: Replacement index " + std::to_string(auto_index) + " out of range for positional args tuple");
      v = &args.positional[auto_index++];
    } else if (std::all_of(field.begin(), field.end(), [](char ch) { return ch >= '0' && ch <= '9'; })) {
      const size_t idx = field.size() > 9 ? args.positional.size() : std::strtoul(field.c_str(), nullptr, 10);
      if (idx >= args.positional.size())
        throw_error("IndexError: Replacement index " + field + " out of range for positional args tuple");
      v = &args.positional[idx];
    } else {
      for (const auto& [k, val] : args.keyword)
        if (k == field) v = &val;
      if (!v) throw_error("KeyError: '" + field + "'");
    }
    if (conv == "r")
      out += format_spec(Value::string(v->repr()), spec);
    else
      out += format_spec(conv == "s" ? Value::string(v->str()) : *v, spec);
  }
  return out;
}

}  // namespace kite::jinja

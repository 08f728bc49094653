// kite/src/runtime/jinja/lexer.cpp — see lexer.h. The state machine mirrors jinja2's: text until
// the next tag opener (with lstrip/`-` rules applied to that text), then tag contents until the
// matching closer at bracket depth zero (with trim_blocks/`-` rules applied after it).
#include "src/runtime/jinja/lexer.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>

#include "src/runtime/jinja/utf8.h"

namespace kite::jinja {
namespace {

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

std::string normalize_newlines(std::string_view s, bool keep_trailing_newline) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\r') {
      out.push_back('\n');
      if (i + 1 < s.size() && s[i + 1] == '\n') ++i;
    } else {
      out.push_back(s[i]);
    }
  }
  if (!keep_trailing_newline && !out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

class Lexer {
 public:
  Lexer(std::string source, const LexOptions& o) : src_(std::move(source)), o_(o) {
    line_starts_.push_back(0);
    for (size_t i = 0; i < src_.size(); ++i)
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
  }

  Result<std::vector<Token>> run() {
    while (pos_ < src_.size()) {
      Status st = root_step();
      if (!st) return st.error();
    }
    Token end;
    end.type = Tok::kEnd;
    locate(end, src_.size());
    out_.push_back(std::move(end));
    return std::move(out_);
  }

 private:
  Error error_at(size_t pos, std::string_view what) const {
    Token t;
    locate(t, pos);
    return make_error("template syntax error at line ", t.line, ", column ", t.column, ": ", what);
  }

  void locate(Token& t, size_t pos) const {
    auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), pos);
    const size_t line = static_cast<size_t>(it - line_starts_.begin());
    t.line = static_cast<int>(line);
    t.column = static_cast<int>(pos - line_starts_[line - 1] + 1);
  }

  void emit(Tok type, std::string text, size_t pos) {
    Token t;
    t.type = type;
    t.text = std::move(text);
    locate(t, pos);
    out_.push_back(std::move(t));
  }

  // Applies the `-` / lstrip_blocks rules to the text before a tag opener.
  std::string strip_before(std::string text, char sign, bool is_variable) const {
    if (sign == '-') {
      size_t e = text.size();
      while (e > 0 && is_ws(text[e - 1])) --e;
      text.resize(e);
    } else if (sign != '+' && o_.lstrip_blocks && !is_variable) {
      const size_t nl = text.rfind('\n');
      const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
      if ((l_pos > 0 || line_starting_) && l_pos < text.size() &&
          std::all_of(text.begin() + static_cast<long>(l_pos), text.end(), is_ws))
        text.resize(l_pos);
    }
    return text;
  }

  // After a closer at `end` (the index just past it), whose first char is at `closer`: applies
  // `-` (all whitespace) or trim_blocks (one newline) unless `+`; returns the new position.
  size_t strip_after(size_t closer, size_t end, bool trim_allowed) {
    const char sign = src_[closer];
    if (sign == '-') {
      while (end < src_.size() && is_ws(src_[end])) ++end;
    } else if (sign != '+' && trim_allowed && o_.trim_blocks && end < src_.size() && src_[end] == '\n') {
      ++end;
    }
    line_starting_ = end > 0 && src_[end - 1] == '\n';
    return end;
  }

  Status root_step() {
    size_t start = pos_;
    while (true) {
      start = src_.find('{', start);
      if (start == std::string::npos || start + 1 >= src_.size()) {
        emit(Tok::kText, src_.substr(pos_), pos_);
        pos_ = src_.size();
        return ok_status();
      }
      const char k = src_[start + 1];
      if (k == '{' || k == '%' || k == '#') break;
      ++start;
    }
    const char kind = src_[start + 1];
    char sign = start + 2 < src_.size() ? src_[start + 2] : 0;
    if (sign != '-' && sign != '+') sign = 0;
    std::string text = strip_before(src_.substr(pos_, start - pos_), sign, kind == '{');
    if (!text.empty()) emit(Tok::kText, std::move(text), pos_);
    line_starting_ = false;
    pos_ = start + 2 + (sign ? 1 : 0);
    if (kind == '#') return comment(start);
    if (kind == '%' && is_raw_begin()) return raw(start);
    emit(kind == '{' ? Tok::kVarBegin : Tok::kBlockBegin, kind == '{' ? "{{" : "{%", start);
    return tag(kind == '{', start);
  }

  Status comment(size_t start) {
    const size_t end = src_.find("#}", pos_);
    if (end == std::string::npos) return error_at(start, "missing end of comment tag");
    const size_t closer = end > pos_ ? end - 1 : end;
    pos_ = strip_after(closer, end + 2, true);
    return ok_status();
  }

  // At pos_ (just after "{%" and its sign): "\s*raw\s*(-%}|%})"?
  bool is_raw_begin() {
    size_t p = pos_;
    while (p < src_.size() && is_ws(src_[p])) ++p;
    if (src_.compare(p, 3, "raw") != 0 || (p + 3 < src_.size() && is_name_char(src_[p + 3]))) return false;
    p += 3;
    while (p < src_.size() && is_ws(src_[p])) ++p;
    return src_.compare(p, 2, "%}") == 0 || src_.compare(p, 3, "-%}") == 0;
  }

  Status raw(size_t start) {
    size_t p = src_.find("%}", pos_);
    const bool dash = src_[p - 1] == '-';
    p += 2;
    if (dash)
      while (p < src_.size() && is_ws(src_[p])) ++p;
    // Find "{%[-+]?\s*endraw\s*[-+]?%}".
    size_t search = p;
    while (true) {
      const size_t open = src_.find("{%", search);
      if (open == std::string::npos) return error_at(start, "missing end of raw directive");
      size_t q = open + 2;
      char sign = 0;
      if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) sign = src_[q++];
      while (q < src_.size() && is_ws(src_[q])) ++q;
      if (src_.compare(q, 6, "endraw") == 0) {
        q += 6;
        while (q < src_.size() && is_ws(src_[q])) ++q;
        size_t closer = q;
        if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) ++q;
        if (src_.compare(q, 2, "%}") == 0) {
          line_starting_ = p > 0 && src_[p - 1] == '\n';
          std::string text = strip_before(src_.substr(p, open - p), sign, false);
          if (!text.empty()) emit(Tok::kText, std::move(text), p);
          pos_ = strip_after(closer, q + 2, true);
          return ok_status();
        }
      }
      search = open + 2;
    }
  }

  Status tag(bool is_variable, size_t start) {
    std::vector<char> brackets;
    while (true) {
      while (pos_ < src_.size() && is_ws(src_[pos_])) ++pos_;
      if (pos_ >= src_.size())
        return error_at(start, is_variable ? "unexpected end of template: '{{' is never closed by '}}'"
                                           : "unexpected end of template: '{%' is never closed by '%}'");
      const char c = src_[pos_];
      if (brackets.empty()) {
        if (!is_variable) {
          for (const char* closer : {"+%}", "-%}", "%}"}) {
            const size_t len = std::char_traits<char>::length(closer);
            if (src_.compare(pos_, len, closer) == 0) {
              emit(Tok::kBlockEnd, "%}", pos_);
              pos_ = strip_after(pos_, pos_ + len, true);
              return ok_status();
            }
          }
        } else {
          for (const char* closer : {"-}}", "}}"}) {
            const size_t len = std::char_traits<char>::length(closer);
            if (src_.compare(pos_, len, closer) == 0) {
              emit(Tok::kVarEnd, "}}", pos_);
              pos_ = strip_after(pos_, pos_ + len, false);
              return ok_status();
            }
          }
        }
      }
      if (is_digit(c)) {
        KITE_TRY(number());
      } else if (is_name_start(c)) {
        const size_t b = pos_;
        while (pos_ < src_.size() && is_name_char(src_[pos_])) ++pos_;
        emit(Tok::kName, src_.substr(b, pos_ - b), b);
      } else if (c == '\'' || c == '"') {
        KITE_TRY(string_literal());
      } else {
        KITE_TRY(op(brackets));
      }
    }
  }

  Status number() {
    const size_t b = pos_;
    auto digits = [&](size_t p) {
      const size_t s = p;
      while (p < src_.size() && (is_digit(src_[p]) || (src_[p] == '_' && p > s && p + 1 < src_.size() &&
                                                       is_digit(src_[p + 1]))))
        ++p;
      return p;
    };
    if (src_[b] == '0' && b + 1 < src_.size() && std::string_view("xXoObB").find(src_[b + 1]) != std::string_view::npos) {
      const int base = (src_[b + 1] == 'x' || src_[b + 1] == 'X') ? 16 : (src_[b + 1] == 'o' || src_[b + 1] == 'O') ? 8 : 2;
      size_t p = b + 2;
      int64_t v = 0;
      while (p < src_.size() && (std::isxdigit(static_cast<unsigned char>(src_[p])) || src_[p] == '_')) {
        if (src_[p] != '_') {
          const int d = std::isdigit(static_cast<unsigned char>(src_[p])) ? src_[p] - '0' : (std::tolower(src_[p]) - 'a' + 10);
          if (d >= base) break;
          v = v * base + d;
        }
        ++p;
      }
      pos_ = p;
      Token t;
      t.type = Tok::kInt;
      t.int_value = v;
      t.text = src_.substr(b, p - b);
      locate(t, b);
      out_.push_back(std::move(t));
      return ok_status();
    }
    size_t p = digits(b);
    bool is_float = false;
    const bool after_dot = b > 0 && src_[b - 1] == '.';
    if (!after_dot && p + 1 < src_.size() && src_[p] == '.' && is_digit(src_[p + 1])) {
      p = digits(p + 1);
      is_float = true;
    }
    if (!after_dot && p < src_.size() && (src_[p] == 'e' || src_[p] == 'E')) {
      size_t q = p + 1;
      if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) ++q;
      if (q < src_.size() && is_digit(src_[q])) {
        p = digits(q);
        is_float = true;
      }
    }
    std::string text;
    for (size_t i = b; i < p; ++i)
      if (src_[i] != '_') text.push_back(src_[i]);
    Token t;
    t.text = src_.substr(b, p - b);
    locate(t, b);
    if (is_float) {
      t.type = Tok::kFloat;
      t.float_value = std::strtod(text.c_str(), nullptr);
    } else {
      t.type = Tok::kInt;
      errno = 0;
      const long long v = std::strtoll(text.c_str(), nullptr, 10);
      if (errno == ERANGE) return error_at(b, "integer literal too large: " + text);
      t.int_value = v;
    }
    pos_ = p;
    out_.push_back(std::move(t));
    return ok_status();
  }

  Status string_literal() {
    const size_t b = pos_;
    const char q = src_[pos_++];
    std::string value;
    while (true) {
      if (pos_ >= src_.size()) return error_at(b, "unterminated string literal");
      const char c = src_[pos_];
      if (c == q) {
        ++pos_;
        break;
      }
      if (c != '\\') {
        value.push_back(c);
        ++pos_;
        continue;
      }
      if (pos_ + 1 >= src_.size()) return error_at(b, "unterminated string literal");
      const char e = src_[pos_ + 1];
      pos_ += 2;
      switch (e) {
        case 'n': value.push_back('\n'); break;
        case 't': value.push_back('\t'); break;
        case 'r': value.push_back('\r'); break;
        case '\\': value.push_back('\\'); break;
        case '\'': value.push_back('\''); break;
        case '"': value.push_back('"'); break;
        case 'a': value.push_back('\a'); break;
        case 'b': value.push_back('\b'); break;
        case 'f': value.push_back('\f'); break;
        case 'v': value.push_back('\v'); break;
        case '\n': break;
        case 'x':
        case 'u':
        case 'U': {
          const size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          if (pos_ + n > src_.size()) return error_at(b, "truncated \\" + std::string(1, e) + " escape");
          char32_t cp = 0;
          for (size_t i = 0; i < n; ++i) {
            const char h = src_[pos_ + i];
            if (!std::isxdigit(static_cast<unsigned char>(h))) return error_at(b, "bad escape in string literal");
            cp = cp * 16 + static_cast<char32_t>(std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : std::tolower(h) - 'a' + 10);
          }
          pos_ += n;
          if (cp > 0x10FFFF) return error_at(b, "escape out of range in string literal");
          utf8::append(value, cp);
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            char32_t cp = static_cast<char32_t>(e - '0');
            for (int i = 0; i < 2 && pos_ < src_.size() && src_[pos_] >= '0' && src_[pos_] <= '7'; ++i)
              cp = cp * 8 + static_cast<char32_t>(src_[pos_++] - '0');
            utf8::append(value, cp);
          } else {
            value.push_back('\\');
            value.push_back(e);
          }
      }
    }
    emit(Tok::kString, std::move(value), b);
    return ok_status();
  }

  Status op(std::vector<char>& brackets) {
    static constexpr std::string_view kTwo[] = {"**", "//", "==", "!=", ">=", "<="};
    const size_t b = pos_;
    for (auto two : kTwo) {
      if (src_.compare(pos_, 2, two) == 0) {
        pos_ += 2;
        emit(Tok::kOp, std::string(two), b);
        return ok_status();
      }
    }
    const char c = src_[pos_];
    if (std::string_view("+-/*%~[](){}<>=.:|,;").find(c) == std::string_view::npos)
      return error_at(b, std::string("unexpected char '") + c + "'");
    if (c == '(' || c == '[' || c == '{') {
      brackets.push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
    } else if (c == ')' || c == ']' || c == '}') {
      if (brackets.empty()) return error_at(b, std::string("unexpected '") + c + "'");
      if (brackets.back() != c)
        return error_at(b, std::string("unexpected '") + c + "', expected '" + brackets.back() + "'");
      brackets.pop_back();
    }
    ++pos_;
    emit(Tok::kOp, std::string(1, c), b);
    return ok_status();
  }

  std::string src_;
  LexOptions o_;
  std::vector<size_t> line_starts_;
  size_t pos_ = 0;
  bool line_starting_ = true;
  std::vector<Token> out_;
};

}  // namespace

Result<std::vector<Token>> tokenize(std::string_view source, const LexOptions& options) {
  Lexer lexer(normalize_newlines(source, options.keep_trailing_newline), options);
  return lexer.run();
}

}  // namespace kite::jinja

// kite/src/base/status.h — the error type every layer returns.
//
// Contract: anything a user, a file or a network peer can get wrong is reported through
// `Result<T>` / `Status`, never by exiting, aborting, throwing across a layer or printing.
// The message names the thing (file, key, tensor, offset, expected vs actual); callers add
// context with `with_context()` as the error travels up.
#pragma once

#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>

namespace kite {

// What kind of failure, for callers that must answer differently (an HTTP status, an exit
// code); most errors need none and stay kUnspecified.
enum class ErrorCode {
  kUnspecified,
  kInvalidArgument,  // the caller's input is wrong (a bad field, an out-of-range value)
  kBusy,             // try again later (a full queue)
  kTooLarge,         // the input exceeds a limit (prompt longer than the context)
};

struct Error {
  std::string message;
  ErrorCode code = ErrorCode::kUnspecified;

  // Prefixes "context: " to the message (e.g. the file name).
  Error with_context(std::string_view context) const& {
    return Error{std::string(context) + ": " + message, code};
  }
};

// Builds an Error from any streamable pieces: make_error("tensor '", name, "' has ", n, " dims").
template <class... Args>
Error make_error(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return Error{os.str()};
}

template <class... Args>
Error make_error_code(ErrorCode code, const Args&... args) {
  Error e = make_error(args...);
  e.code = code;
  return e;
}

template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Error error) : v_(std::move(error)) {}  // NOLINT

  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }

  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  const Error& error() const { return std::get<1>(v_); }

 private:
  std::variant<T, Error> v_;
};

template <>
class [[nodiscard]] Result<void> {
 public:
  Result() = default;
  Result(Error error) : error_(std::move(error)), ok_(false) {}  // NOLINT

  bool ok() const { return ok_; }
  explicit operator bool() const { return ok_; }
  const Error& error() const { return error_; }

 private:
  Error error_;
  bool ok_ = true;
};

using Status = Result<void>;

inline Status ok_status() { return Status(); }

}  // namespace kite

#define KITE_CONCAT_INNER_(a, b) a##b
#define KITE_CONCAT_(a, b) KITE_CONCAT_INNER_(a, b)

// KITE_TRY(status_expr): returns the error from the enclosing function if it failed.
#define KITE_TRY(expr)                                   \
  do {                                                   \
    auto kite_try_status_ = (expr);                      \
    if (!kite_try_status_) return kite_try_status_.error(); \
  } while (0)

// KITE_ASSIGN_OR_RETURN(decl, result_expr): `KITE_ASSIGN_OR_RETURN(auto f, File::open(p));`
#define KITE_ASSIGN_OR_RETURN(decl, expr) \
  KITE_ASSIGN_OR_RETURN_IMPL_(KITE_CONCAT_(kite_result_, __LINE__), decl, expr)
#define KITE_ASSIGN_OR_RETURN_IMPL_(tmp, decl, expr) \
  auto tmp = (expr);                                 \
  if (!tmp) return tmp.error();                      \
  decl = std::move(tmp).value()

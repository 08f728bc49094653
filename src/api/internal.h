// kite/src/api/internal.h — what the C API's implementation files share: the handle structs
// behind kite.h's opaque types, the error boundary and logging.
//
// Every exported function runs its body through `guard()`, which turns a kite::Error or any C++
// exception into a kite_status plus the thread's last-error message, so nothing thrown inside
// the engine (std::bad_alloc, a std::out_of_range from a bug) crosses into C.
#pragma once

#include <memory>
#include <new>
#include <string>
#include <vector>

#include "src/api/kite.h"
#include "src/base/status.h"
#include "src/model/model.h"
#include "src/runtime/context.h"
#include "src/runtime/sampler.h"
#include "src/runtime/scheduler.h"
#include "src/runtime/tokenizer.h"

struct kite_model {
  std::shared_ptr<const kite::Model> model;
  std::shared_ptr<const kite::Tokenizer> tokenizer;
  std::string chat_template;  // the model's own (empty: none)
  bool has_chat_template = false;
};

struct kite_context {
  kite_model* owner = nullptr;
  std::unique_ptr<kite::Context> ctx;
  int32_t n_batch = 512;
  // What kite_get_logits serves: the outputs of the last kite_decode (kDecode), logits restored by
  // kite_state_load (kRestored), or nothing (after kite_generate / kite_embed, or never).
  enum class Outputs { kNone, kDecode, kRestored } outputs = Outputs::kNone;
  std::vector<int32_t> seq_last_output;  // per sequence: the output of its last token in the last decode, or -1
  std::vector<float> restored_logits;
  int32_t restored_seq = -1;
};

struct kite_sampler {
  explicit kite_sampler(const kite::SamplerParams& p) : sampler(p) {}
  kite::Sampler sampler;
};

struct kite_batch {
  std::vector<kite::BatchToken> tokens;
  size_t capacity = 0;
};

namespace kite::capi {

// Records `message` as this thread's last error, logs it at KITE_LOG_ERROR and returns `status`.
kite_status fail(kite_status status, const std::string& message);
// The status an engine error maps to (its ErrorCode, or what the message says).
kite_status status_of(const Error& e);
inline kite_status fail(const Error& e) {
  return fail(status_of(e), e.message);
}

void log(kite_log_level level, const std::string& message);

// Runs `body` (returning kite_status) with every exception turned into an error status.
template <class F>
kite_status guard(const char* function, F&& body) noexcept {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return fail(KITE_ERROR_OUT_OF_MEMORY, std::string(function) + ": out of memory");
  } catch (const std::exception& e) {
    return fail(KITE_ERROR_FAILED, std::string(function) + ": internal error: " + e.what());
  } catch (...) {
    return fail(KITE_ERROR_FAILED, std::string(function) + ": internal error (unknown exception)");
  }
}

// The same for functions that return a value: `fallback` on an exception.
template <class T, class F>
T guard_value(const char* function, T fallback, F&& body) noexcept {
  try {
    return body();
  } catch (const std::exception& e) {
    fail(KITE_ERROR_FAILED, std::string(function) + ": internal error: " + e.what());
  } catch (...) {
    fail(KITE_ERROR_FAILED, std::string(function) + ": internal error (unknown exception)");
  }
  return fallback;
}

// "`what` is NULL" errors, named after the function and the parameter.
inline kite_status null_arg(const char* function, const char* what) {
  return fail(KITE_ERROR_INVALID_ARGUMENT, std::string(function) + ": " + what + " is NULL");
}

// Copies `n` elements into a caller's buffer of `capacity` under the snprintf-like rules of
// kite.h: *needed = n; KITE_ERROR_BUFFER_TOO_SMALL when capacity < n + extra.
kite_status too_small(const char* function, size_t needed, size_t capacity);

}  // namespace kite::capi

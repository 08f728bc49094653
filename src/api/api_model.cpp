// The C API: status and errors, version, logging, models, tokens and chat templates.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>

#include "src/api/internal.h"
#include "src/runtime/chat_template.h"

namespace kite::capi {
namespace {

thread_local std::string t_last_error;

struct LogSink {
  std::mutex mu;
  kite_log_callback callback = nullptr;
  void* user_data = nullptr;
  kite_log_level min_level = KITE_LOG_INFO;
};

LogSink& log_sink() {
  static LogSink sink;
  return sink;
}

const char* level_name(kite_log_level level) {
  switch (level) {
    case KITE_LOG_DEBUG:
      return "debug";
    case KITE_LOG_INFO:
      return "info";
    case KITE_LOG_WARN:
      return "warning";
    case KITE_LOG_ERROR:
      return "error";
    default:
      return "log";
  }
}

}  // namespace

void log(kite_log_level level, const std::string& message) {
  LogSink& s = log_sink();
  std::lock_guard<std::mutex> lock(s.mu);
  if (level < s.min_level || level >= KITE_LOG_NONE) return;
  if (s.callback != nullptr) {
    s.callback(level, message.c_str(), s.user_data);
  } else {
    std::fprintf(stderr, "kite: %s: %s\n", level_name(level), message.c_str());
  }
}

kite_status fail(kite_status status, const std::string& message) {
  try {
    t_last_error = message;
    // A buffer too small is the normal answer to a size query, not something to log.
    if (status != KITE_ERROR_BUFFER_TOO_SMALL) log(KITE_LOG_ERROR, message);
  } catch (...) {  // out of memory while reporting: the status still says what happened
  }
  return status;
}

kite_status status_of(const Error& e) {
  switch (e.code) {
    case ErrorCode::kInvalidArgument:
      return KITE_ERROR_INVALID_ARGUMENT;
    case ErrorCode::kTooLarge:
      return KITE_ERROR_CONTEXT_FULL;
    default:
      break;
  }
  // The KV cache reports a full context or pool in these words (no ErrorCode of its own).
  if (e.message.find("context full") != std::string::npos || e.message.find("KV cache full") != std::string::npos)
    return KITE_ERROR_CONTEXT_FULL;
  // Context::create's check of the weights and KV cache against a device's free memory.
  if (e.message.find("does not fit in device memory") != std::string::npos) return KITE_ERROR_OUT_OF_MEMORY;
  return KITE_ERROR_FAILED;
}

kite_status too_small(const char* function, size_t needed, size_t capacity) {
  return fail(KITE_ERROR_BUFFER_TOO_SMALL, std::string(function) + ": the buffer holds " + std::to_string(capacity) +
                                               ", " + std::to_string(needed) + " needed");
}

}  // namespace kite::capi

using namespace kite;
using kite::capi::fail;
using kite::capi::guard;
using kite::capi::guard_value;
using kite::capi::null_arg;

// (Helpers of the C functions below, outside the extern "C" block: they return C++ types.)
namespace {

// Writes `s` and a NUL into a caller's buffer under kite.h's rules.
kite_status put_text(const char* fn, const std::string& s, char* out, size_t capacity, size_t* len) {
  *len = s.size();
  if (capacity > 0) {
    const size_t n = std::min(capacity - 1, s.size());
    std::memcpy(out, s.data(), n);
    out[n] = '\0';
  }
  if (capacity <= s.size()) return capi::too_small(fn, s.size() + 1, capacity);
  return KITE_OK;
}

Result<ChatTemplate> choose_template(const kite_model& m, const char* tmpl) {
  if (tmpl == nullptr) {
    if (m.has_chat_template) {
      auto t = ChatTemplate::parse(m.chat_template);
      if (!t) return t.error().with_context("the model's chat template");
      return t;
    }
    capi::log(KITE_LOG_WARN, "the model has no chat template; using the built-in chatml");
    return ChatTemplate::builtin("chatml");
  }
  const std::string_view s(tmpl);
  if (s.find("{{") != std::string_view::npos || s.find("{%") != std::string_view::npos) {
    auto t = ChatTemplate::parse(s);
    if (!t) return t.error().with_context("the template given");
    return t;
  }
  auto t = ChatTemplate::builtin(s);  // the error lists the built-in names
  if (!t) return make_error_code(ErrorCode::kInvalidArgument, t.error().message);
  return t;
}

}  // namespace

extern "C" {

const char* kite_status_name(kite_status status) {
  switch (status) {
    case KITE_OK:
      return "KITE_OK";
    case KITE_ABORTED:
      return "KITE_ABORTED";
    case KITE_ERROR_INVALID_ARGUMENT:
      return "KITE_ERROR_INVALID_ARGUMENT";
    case KITE_ERROR_FILE_NOT_FOUND:
      return "KITE_ERROR_FILE_NOT_FOUND";
    case KITE_ERROR_INVALID_MODEL:
      return "KITE_ERROR_INVALID_MODEL";
    case KITE_ERROR_CANCELLED:
      return "KITE_ERROR_CANCELLED";
    case KITE_ERROR_BUFFER_TOO_SMALL:
      return "KITE_ERROR_BUFFER_TOO_SMALL";
    case KITE_ERROR_CONTEXT_FULL:
      return "KITE_ERROR_CONTEXT_FULL";
    case KITE_ERROR_OUT_OF_MEMORY:
      return "KITE_ERROR_OUT_OF_MEMORY";
    case KITE_ERROR_INVALID_STATE:
      return "KITE_ERROR_INVALID_STATE";
    case KITE_ERROR_FAILED:
      return "KITE_ERROR_FAILED";
  }
  return "KITE_STATUS_UNKNOWN";
}

const char* kite_last_error(void) {
  return capi::t_last_error.c_str();
}

const char* kite_version(void) {
  return KITE_VERSION_STRING;
}

void kite_log_set_callback(kite_log_callback callback, void* user_data) {
  capi::LogSink& s = capi::log_sink();
  std::lock_guard<std::mutex> lock(s.mu);
  s.callback = callback;
  s.user_data = user_data;
}

void kite_log_set_level(kite_log_level level) {
  capi::LogSink& s = capi::log_sink();
  std::lock_guard<std::mutex> lock(s.mu);
  s.min_level = level;
}

kite_model_params kite_model_default_params(void) {
  kite_model_params p;
  p.progress = nullptr;
  p.progress_user_data = nullptr;
  return p;
}

kite_status kite_model_load(const char* path, const kite_model_params* params, kite_model** out_model) {
  static const char* const kFn = "kite_model_load";
  return guard(kFn, [&]() -> kite_status {
    if (out_model == nullptr) return null_arg(kFn, "out_model");
    if (path == nullptr) return null_arg(kFn, "path");
    const kite_model_params p = params != nullptr ? *params : kite_model_default_params();
    std::error_code ec;
    if (!std::filesystem::exists(path, ec))
      return fail(KITE_ERROR_FILE_NOT_FOUND, std::string(kFn) + ": no such file or folder: " + path);

    const auto t0 = std::chrono::steady_clock::now();
    LoadOptions lo;
    bool cancelled = false;
    if (p.progress != nullptr) {
      lo.progress = [&](size_t done, size_t total) {
        const bool go_on = p.progress(done, total, p.progress_user_data);
        cancelled = cancelled || !go_on;
        return go_on;
      };
    }
    auto model = Model::load(path, lo);
    if (!model) {
      if (cancelled)
        return fail(KITE_ERROR_CANCELLED, std::string(kFn) + ": " + path + ": cancelled by the progress callback");
      return fail(KITE_ERROR_INVALID_MODEL, std::string(kFn) + ": " + model.error().message);
    }
    auto tok = Tokenizer::load((*model)->source().metadata());
    if (!tok)
      return fail(KITE_ERROR_INVALID_MODEL, std::string(kFn) + ": " + path + ": tokenizer: " + tok.error().message);

    auto m = std::make_unique<kite_model>();
    m->model = std::move(*model);
    m->tokenizer = std::move(*tok);
    if (auto t = m->model->source().metadata().get<std::string>("tokenizer.chat_template")) {
      m->chat_template = *t;
      m->has_chat_template = true;
    }
    const HParams& hp = m->model->hparams();
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    char line[512];
    std::snprintf(line, sizeof line, "loaded %s: %s, %lld layers, n_embd %lld, vocabulary %lld, in %.0f ms", path,
                  hp.arch.c_str(), static_cast<long long>(hp.n_layer), static_cast<long long>(hp.n_embd),
                  static_cast<long long>(hp.n_vocab), ms);
    capi::log(KITE_LOG_INFO, line);
    *out_model = m.release();
    return KITE_OK;
  });
}

void kite_model_free(kite_model* model) {
  delete model;
}

int32_t kite_model_n_vocab(const kite_model* model) {
  return model ? static_cast<int32_t>(model->model->hparams().n_vocab) : 0;
}
int32_t kite_model_n_embd(const kite_model* model) {
  return model ? static_cast<int32_t>(model->model->hparams().n_embd) : 0;
}
int32_t kite_model_n_layer(const kite_model* model) {
  return model ? static_cast<int32_t>(model->model->hparams().n_layer) : 0;
}
int32_t kite_model_n_ctx_train(const kite_model* model) {
  return model ? static_cast<int32_t>(model->model->hparams().n_ctx_train) : 0;
}
const char* kite_model_arch(const kite_model* model) {
  return model ? model->model->hparams().arch.c_str() : "";
}
const char* kite_model_chat_template(const kite_model* model) {
  return model && model->has_chat_template ? model->chat_template.c_str() : nullptr;
}

int32_t kite_token_bos(const kite_model* model) {
  return model ? model->tokenizer->bos() : -1;
}
int32_t kite_token_eos(const kite_model* model) {
  return model ? model->tokenizer->eos() : -1;
}
bool kite_token_is_eog(const kite_model* model, int32_t token) {
  return guard_value("kite_token_is_eog", false, [&] { return model != nullptr && model->tokenizer->is_eog(token); });
}

kite_status kite_tokenize(const kite_model* model, const char* text, size_t text_len, bool add_special,
                          bool parse_special, int32_t* tokens, size_t capacity, size_t* n_tokens) {
  static const char* const kFn = "kite_tokenize";
  return guard(kFn, [&]() -> kite_status {
    if (model == nullptr) return null_arg(kFn, "model");
    if (text == nullptr) return null_arg(kFn, "text");
    if (n_tokens == nullptr) return null_arg(kFn, "n_tokens");
    if (tokens == nullptr && capacity > 0) return null_arg(kFn, "tokens (with capacity > 0)");
    const size_t len = text_len == static_cast<size_t>(-1) ? std::strlen(text) : text_len;
    EncodeOptions eo;
    eo.add_special = add_special;
    eo.parse_special = parse_special;
    const std::vector<TokenId> ids = model->tokenizer->encode(std::string_view(text, len), eo);
    *n_tokens = ids.size();
    if (capacity > 0) std::copy_n(ids.begin(), std::min(capacity, ids.size()), tokens);
    if (capacity < ids.size()) return capi::too_small(kFn, ids.size(), capacity);
    return KITE_OK;
  });
}

kite_status kite_detokenize(const kite_model* model, const int32_t* tokens, size_t n_tokens, bool render_special,
                            char* text, size_t capacity, size_t* text_len) {
  static const char* const kFn = "kite_detokenize";
  return guard(kFn, [&]() -> kite_status {
    if (model == nullptr) return null_arg(kFn, "model");
    if (tokens == nullptr && n_tokens > 0) return null_arg(kFn, "tokens");
    if (text_len == nullptr) return null_arg(kFn, "text_len");
    if (text == nullptr && capacity > 0) return null_arg(kFn, "text (with capacity > 0)");
    const int32_t n_vocab = model->tokenizer->n_vocab();
    for (size_t i = 0; i < n_tokens; ++i)
      if (tokens[i] < 0 || tokens[i] >= n_vocab)
        return fail(KITE_ERROR_INVALID_ARGUMENT, std::string(kFn) + ": tokens[" + std::to_string(i) +
                                                     "] = " + std::to_string(tokens[i]) +
                                                     " is outside the vocabulary [0, " + std::to_string(n_vocab) + ")");
    DecodeOptions d;
    d.render_special = render_special;
    const std::string s = model->tokenizer->decode(std::span<const TokenId>(tokens, n_tokens), d);
    return put_text(kFn, s, text, capacity, text_len);
  });
}

kite_status kite_token_to_piece(const kite_model* model, int32_t token, char* buf, size_t capacity, size_t* len) {
  static const char* const kFn = "kite_token_to_piece";
  return guard(kFn, [&]() -> kite_status {
    if (model == nullptr) return null_arg(kFn, "model");
    if (len == nullptr) return null_arg(kFn, "len");
    if (buf == nullptr && capacity > 0) return null_arg(kFn, "buf (with capacity > 0)");
    const int32_t n_vocab = model->tokenizer->n_vocab();
    if (token < 0 || token >= n_vocab)
      return fail(KITE_ERROR_INVALID_ARGUMENT, std::string(kFn) + ": token " + std::to_string(token) +
                                                   " is outside the vocabulary [0, " + std::to_string(n_vocab) + ")");
    const std::string s = model->tokenizer->token_bytes(token);
    *len = s.size();
    if (capacity < s.size()) return capi::too_small(kFn, s.size(), capacity);
    std::memcpy(buf, s.data(), s.size());
    return KITE_OK;
  });
}

kite_status kite_chat_apply_template(const kite_model* model, const char* tmpl, const kite_chat_message* messages,
                                     size_t n_messages, bool add_generation_prompt, char* text, size_t capacity,
                                     size_t* text_len) {
  static const char* const kFn = "kite_chat_apply_template";
  return guard(kFn, [&]() -> kite_status {
    if (model == nullptr) return null_arg(kFn, "model");
    if (messages == nullptr && n_messages > 0) return null_arg(kFn, "messages");
    if (text_len == nullptr) return null_arg(kFn, "text_len");
    if (text == nullptr && capacity > 0) return null_arg(kFn, "text (with capacity > 0)");
    nlohmann::ordered_json msgs = nlohmann::ordered_json::array();
    for (size_t i = 0; i < n_messages; ++i) {
      if (messages[i].role == nullptr || messages[i].content == nullptr)
        return fail(KITE_ERROR_INVALID_ARGUMENT,
                    std::string(kFn) + ": messages[" + std::to_string(i) + "] has a NULL role or content");
      msgs.push_back({{"role", messages[i].role}, {"content", messages[i].content}});
    }
    auto t = choose_template(*model, tmpl);
    if (!t) return fail(capi::status_of(t.error()), std::string(kFn) + ": " + t.error().message);
    const Tokenizer& tok = *model->tokenizer;
    const std::string bos = tok.bos() != kNoToken ? tok.token_bytes(tok.bos()) : std::string();
    const std::string eos = tok.eos() != kNoToken ? tok.token_bytes(tok.eos()) : std::string();
    const nlohmann::ordered_json ctx = {
        {"messages", msgs}, {"add_generation_prompt", add_generation_prompt}, {"bos_token", bos}, {"eos_token", eos}};
    auto rendered = t->render(ctx);
    if (!rendered)
      return fail(KITE_ERROR_FAILED,
                  std::string(kFn) + ": the template rejected the conversation: " + rendered.error().message);
    return put_text(kFn, *rendered, text, capacity, text_len);
  });
}

}  // extern "C"

// The C API: contexts, batched decoding and logits, samplers, generation and embeddings.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <string>

#include "src/api/internal.h"
#include "src/runtime/embed.h"

using namespace kite;
using kite::capi::fail;
using kite::capi::guard;
using kite::capi::guard_value;
using kite::capi::null_arg;

namespace {

std::string str(int64_t v) {
  return std::to_string(v);
}

kite_status bad_seq(const char* fn, const kite_context* ctx, int32_t seq) {
  return fail(KITE_ERROR_INVALID_ARGUMENT, std::string(fn) + ": sequence " + str(seq) + " is out of range [0, " +
                                               str(ctx->ctx->kv().n_seqs()) + ")");
}

SamplerParams to_sampler_params(const kite_sampler_params& p) {
  SamplerParams s;
  s.temperature = p.temperature;
  s.top_k = p.top_k;
  s.top_p = p.top_p;
  s.min_p = p.min_p;
  s.typical_p = p.typical_p;
  s.repeat_penalty = p.repeat_penalty;
  s.frequency_penalty = p.frequency_penalty;
  s.presence_penalty = p.presence_penalty;
  s.penalty_last_n = p.penalty_last_n;
  s.seed = p.seed;
  return s;
}

}  // namespace

extern "C" {

kite_context_params kite_context_default_params(void) {
  kite_context_params p;
  p.n_ctx = 2048;
  p.n_seq_max = 1;
  p.n_threads = 0;
  p.n_batch = 512;
  p.kv_type = KITE_KV_F16;
  p.prefix_cache = true;
  p.device = "cpu";
  p.gpu_layers = -1;
  p.tensor_parallel = 1;
  return p;
}

const char* kite_device_name(size_t i) {
  return guard_value<const char*>("kite_device_name", nullptr, [&]() -> const char* {
    static const std::vector<std::string> names = backend_names();  // fixed once the built-ins register
    return i < names.size() ? names[i].c_str() : nullptr;
  });
}

kite_status kite_context_new(kite_model* model, const kite_context_params* params, kite_context** out_ctx) {
  static const char* const kFn = "kite_context_new";
  return guard(kFn, [&]() -> kite_status {
    if (out_ctx == nullptr) return null_arg(kFn, "out_ctx");
    if (model == nullptr) return null_arg(kFn, "model");
    const kite_context_params p = params != nullptr ? *params : kite_context_default_params();
    auto bad = [&](const char* field, int64_t v, const char* want) {
      return fail(KITE_ERROR_INVALID_ARGUMENT,
                  std::string(kFn) + ": " + field + " must be " + want + ", got " + str(v));
    };
    if (p.n_ctx <= 0) return bad("n_ctx", p.n_ctx, "> 0");
    if (p.n_seq_max <= 0) return bad("n_seq_max", p.n_seq_max, "> 0");
    if (p.n_threads < 0) return bad("n_threads", p.n_threads, ">= 0 (0: every core)");
    if (p.n_batch <= 0) return bad("n_batch", p.n_batch, "> 0");
    static_assert(KITE_GPU_LAYERS_AUTO == kGpuLayersAuto);
    if (p.gpu_layers < KITE_GPU_LAYERS_AUTO)
      return bad("gpu_layers", p.gpu_layers,
                 "-1 (every layer on the device), -2 (as many as fit), 0 (none) or a layer count");
    if (p.tensor_parallel < 1) return bad("tensor_parallel", p.tensor_parallel, ">= 1");
    const std::string device = p.device != nullptr ? p.device : "cpu";
    const std::vector<std::string> devices = backend_names();
    if (std::find(devices.begin(), devices.end(), device) == devices.end()) {
      std::string known;
      for (const std::string& d : devices) known += (known.empty() ? "" : ", ") + d;
      return fail(KITE_ERROR_INVALID_ARGUMENT,
                  std::string(kFn) + ": device '" + device + "' is not one this build has (" + known + ")");
    }
    ContextOptions o;
    switch (p.kv_type) {
      case KITE_KV_F16:
        o.kv_type = DType::F16;
        break;
      case KITE_KV_BF16:
        o.kv_type = DType::BF16;
        break;
      case KITE_KV_F32:
        o.kv_type = DType::F32;
        break;
      case KITE_KV_Q8_0:
        o.kv_type = DType::Q8_0;
        break;
      default:
        return bad("kv_type", p.kv_type, "a kite_kv_type (KITE_KV_F16, _BF16, _F32, _Q8_0)");
    }
    o.n_ctx = p.n_ctx;
    o.n_seqs = p.n_seq_max;
    o.n_threads = p.n_threads;
    o.prefix_cache = p.prefix_cache;
    o.device = device;
    o.gpu_layers = p.gpu_layers;
    o.tensor_parallel = p.tensor_parallel;
    auto c = Context::create(model->model, o);
    if (!c) return fail(capi::status_of(c.error()), std::string(kFn) + ": " + c.error().message);
    auto out = std::make_unique<kite_context>();
    out->owner = model;
    out->ctx = std::move(*c);
    out->n_batch = p.n_batch;
    *out_ctx = out.release();
    return KITE_OK;
  });
}

void kite_context_free(kite_context* ctx) {
  delete ctx;
}

int32_t kite_context_n_ctx(const kite_context* ctx) {
  return ctx ? static_cast<int32_t>(ctx->ctx->kv().n_ctx()) : 0;
}
int32_t kite_context_n_seq_max(const kite_context* ctx) {
  return ctx ? ctx->ctx->kv().n_seqs() : 0;
}
const kite_model* kite_context_model(const kite_context* ctx) {
  return ctx ? ctx->owner : nullptr;
}

int32_t kite_kv_seq_len(const kite_context* ctx, int32_t seq) {
  static const char* const kFn = "kite_kv_seq_len";
  return guard_value<int32_t>(kFn, -1, [&]() -> int32_t {
    if (ctx == nullptr) return null_arg(kFn, "ctx"), -1;
    if (seq < 0 || seq >= ctx->ctx->kv().n_seqs()) return bad_seq(kFn, ctx, seq), -1;
    return static_cast<int32_t>(ctx->ctx->kv().seq_len(seq));
  });
}

kite_status kite_kv_truncate(kite_context* ctx, int32_t seq, int32_t len) {
  static const char* const kFn = "kite_kv_truncate";
  return guard(kFn, [&]() -> kite_status {
    if (ctx == nullptr) return null_arg(kFn, "ctx");
    KvCache& kv = ctx->ctx->kv();
    if (seq < -1 || seq >= kv.n_seqs()) return bad_seq(kFn, ctx, seq);
    if (len < 0) return fail(KITE_ERROR_INVALID_ARGUMENT, std::string(kFn) + ": len must be >= 0, got " + str(len));
    for (int32_t s = 0; s < kv.n_seqs(); ++s)
      if (seq == -1 || s == seq) kv.truncate(s, len);
    return KITE_OK;
  });
}

// --- batches and decoding -------------------------------------------------------------------

kite_status kite_batch_new(size_t capacity, kite_batch** out_batch) {
  static const char* const kFn = "kite_batch_new";
  return guard(kFn, [&]() -> kite_status {
    if (out_batch == nullptr) return null_arg(kFn, "out_batch");
    if (capacity == 0) return fail(KITE_ERROR_INVALID_ARGUMENT, std::string(kFn) + ": capacity must be > 0");
    auto b = std::make_unique<kite_batch>();
    b->tokens.reserve(capacity);
    b->capacity = capacity;
    *out_batch = b.release();
    return KITE_OK;
  });
}

void kite_batch_free(kite_batch* batch) {
  delete batch;
}
void kite_batch_clear(kite_batch* batch) {
  if (batch) batch->tokens.clear();
}
size_t kite_batch_size(const kite_batch* batch) {
  return batch ? batch->tokens.size() : 0;
}

kite_status kite_batch_add(kite_batch* batch, int32_t token, int32_t seq, bool logits) {
  static const char* const kFn = "kite_batch_add";
  if (batch == nullptr) return null_arg(kFn, "batch");
  if (batch->tokens.size() >= batch->capacity)
    return fail(KITE_ERROR_INVALID_ARGUMENT,
                std::string(kFn) + ": the batch is full (capacity " + str(static_cast<int64_t>(batch->capacity)) + ")");
  batch->tokens.push_back({token, seq, logits});  // within capacity: no allocation
  return KITE_OK;
}

kite_status kite_decode(kite_context* ctx, const kite_batch* batch) {
  static const char* const kFn = "kite_decode";
  return guard(kFn, [&]() -> kite_status {
    if (ctx == nullptr) return null_arg(kFn, "ctx");
    if (batch == nullptr) return null_arg(kFn, "batch");
    if (batch->tokens.empty()) return fail(KITE_ERROR_INVALID_ARGUMENT, std::string(kFn) + ": the batch is empty");
    const int32_t n_vocab = static_cast<int32_t>(ctx->owner->model->hparams().n_vocab);
    for (size_t i = 0; i < batch->tokens.size(); ++i) {
      const BatchToken& t = batch->tokens[i];
      if (t.token < 0 || t.token >= n_vocab)
        return fail(KITE_ERROR_INVALID_ARGUMENT, std::string(kFn) + ": batch token " + str(static_cast<int64_t>(i)) +
                                                     ": token " + str(t.token) + " is outside the vocabulary [0, " +
                                                     str(n_vocab) + ")");
      if (t.seq < 0 || t.seq >= ctx->ctx->kv().n_seqs())
        return fail(KITE_ERROR_INVALID_ARGUMENT, std::string(kFn) + ": batch token " + str(static_cast<int64_t>(i)) +
                                                     ": sequence " + str(t.seq) + " is out of range [0, " +
                                                     str(ctx->ctx->kv().n_seqs()) + ")");
    }
    ctx->outputs = kite_context::Outputs::kNone;
    if (auto st = ctx->ctx->decode(batch->tokens); !st)
      return fail(capi::status_of(st.error()), std::string(kFn) + ": " + st.error().message);
    // Which output holds each sequence's newest logits (for kite_state_save).
    ctx->seq_last_output.assign(static_cast<size_t>(ctx->ctx->kv().n_seqs()), -1);
    int32_t o = 0;
    bool any = false;
    for (const BatchToken& t : batch->tokens) {
      ctx->seq_last_output[static_cast<size_t>(t.seq)] = t.logits ? o : -1;
      o += t.logits ? 1 : 0;
      any = any || t.logits;
    }
    if (!any) ctx->seq_last_output[static_cast<size_t>(batch->tokens.back().seq)] = 0;
    ctx->outputs = kite_context::Outputs::kDecode;
    return KITE_OK;
  });
}

int32_t kite_n_outputs(const kite_context* ctx) {
  if (ctx == nullptr) return 0;
  switch (ctx->outputs) {
    case kite_context::Outputs::kDecode:
      return static_cast<int32_t>(ctx->ctx->n_outputs());
    case kite_context::Outputs::kRestored:
      return 1;
    default:
      return 0;
  }
}

const float* kite_get_logits(kite_context* ctx, int32_t i) {
  static const char* const kFn = "kite_get_logits";
  return guard_value<const float*>(kFn, nullptr, [&]() -> const float* {
    if (ctx == nullptr) return null_arg(kFn, "ctx"), nullptr;
    const int32_t n = kite_n_outputs(ctx);
    if (n == 0)
      return fail(KITE_ERROR_INVALID_ARGUMENT,
                  std::string(kFn) + ": no logits: the last call on this context was not a kite_decode"),
             nullptr;
    const int32_t idx = i == -1 ? n - 1 : i;
    if (idx < 0 || idx >= n)
      return fail(KITE_ERROR_INVALID_ARGUMENT,
                  std::string(kFn) + ": output " + str(i) + " is out of range [0, " + str(n) + ") (or -1: the last)"),
             nullptr;
    if (ctx->outputs == kite_context::Outputs::kRestored) return ctx->restored_logits.data();
    return ctx->ctx->logits(static_cast<size_t>(idx)).data();
  });
}

// --- samplers -------------------------------------------------------------------------------

kite_sampler_params kite_sampler_default_params(void) {
  const SamplerParams d;
  kite_sampler_params p;
  p.temperature = d.temperature;
  p.top_k = d.top_k;
  p.top_p = d.top_p;
  p.min_p = d.min_p;
  p.typical_p = d.typical_p;
  p.repeat_penalty = d.repeat_penalty;
  p.frequency_penalty = d.frequency_penalty;
  p.presence_penalty = d.presence_penalty;
  p.penalty_last_n = d.penalty_last_n;
  p.seed = d.seed;
  return p;
}

kite_status kite_sampler_new(const kite_sampler_params* params, kite_sampler** out_sampler) {
  static const char* const kFn = "kite_sampler_new";
  return guard(kFn, [&]() -> kite_status {
    if (out_sampler == nullptr) return null_arg(kFn, "out_sampler");
    if (params == nullptr) return null_arg(kFn, "params");
    const SamplerParams sp = to_sampler_params(*params);
    if (auto st = Sampler::validate(sp, INT32_MAX); !st)
      return fail(KITE_ERROR_INVALID_ARGUMENT, std::string(kFn) + ": " + st.error().message);
    *out_sampler = new kite_sampler(sp);
    return KITE_OK;
  });
}

void kite_sampler_free(kite_sampler* sampler) {
  delete sampler;
}

int32_t kite_sampler_sample(kite_sampler* sampler, const float* logits, int32_t n_vocab) {
  static const char* const kFn = "kite_sampler_sample";
  return guard_value<int32_t>(kFn, -1, [&]() -> int32_t {
    if (sampler == nullptr) return null_arg(kFn, "sampler"), -1;
    if (logits == nullptr) return null_arg(kFn, "logits"), -1;
    if (n_vocab <= 0)
      return fail(KITE_ERROR_INVALID_ARGUMENT, std::string(kFn) + ": n_vocab must be > 0, got " + str(n_vocab)), -1;
    const int32_t t = sampler->sampler.sample(std::span<const float>(logits, static_cast<size_t>(n_vocab)));
    if (t < 0) fail(KITE_ERROR_FAILED, std::string(kFn) + ": every token is banned (all logits are -inf or NaN)");
    return t;
  });
}

kite_status kite_sampler_accept(kite_sampler* sampler, int32_t token) {
  static const char* const kFn = "kite_sampler_accept";
  return guard(kFn, [&]() -> kite_status {
    if (sampler == nullptr) return null_arg(kFn, "sampler");
    if (token < 0)
      return fail(KITE_ERROR_INVALID_ARGUMENT, std::string(kFn) + ": token " + str(token) + " is negative");
    sampler->sampler.accept(token);
    return KITE_OK;
  });
}

void kite_sampler_reset(kite_sampler* sampler) {
  guard("kite_sampler_reset", [&] {
    if (sampler) sampler->sampler.reset();
    return KITE_OK;
  });
}

// --- generation -----------------------------------------------------------------------------

kite_generate_params kite_generate_default_params(void) {
  kite_generate_params p;
  p.sampling = kite_sampler_default_params();
  p.max_tokens = 256;
  p.ignore_eos = false;
  p.stop = nullptr;
  p.n_stop = 0;
  p.on_token = nullptr;
  p.user_data = nullptr;
  p.abort_flag = nullptr;
  return p;
}

kite_status kite_generate(kite_context* ctx, const int32_t* prompt, size_t n_prompt, const kite_generate_params* params,
                          kite_generate_result* result) {
  static const char* const kFn = "kite_generate";
  return guard(kFn, [&]() -> kite_status {
    if (ctx == nullptr) return null_arg(kFn, "ctx");
    if (prompt == nullptr) return null_arg(kFn, "prompt");
    if (params == nullptr) return null_arg(kFn, "params");
    if (n_prompt == 0)
      return fail(KITE_ERROR_INVALID_ARGUMENT, std::string(kFn) + ": the prompt is empty (n_prompt 0)");
    if (params->stop == nullptr && params->n_stop > 0) return null_arg(kFn, "params->stop (with n_stop > 0)");
    Request r;
    r.prompt.assign(prompt, prompt + n_prompt);
    r.params.sampling = to_sampler_params(params->sampling);
    r.params.max_tokens = params->max_tokens;
    r.params.ignore_eos = params->ignore_eos;
    for (size_t i = 0; i < params->n_stop; ++i) {
      if (params->stop[i] == nullptr)
        return fail(KITE_ERROR_INVALID_ARGUMENT,
                    std::string(kFn) + ": params->stop[" + str(static_cast<int64_t>(i)) + "] is NULL");
      r.params.stop.emplace_back(params->stop[i]);
    }
    bool callback_stopped = false;
    std::string gen_error;
    kite_generate_result res{};
    res.n_prompt_tokens = static_cast<int32_t>(n_prompt);
    r.on_event = [&](const StreamEvent& e) {
      if (e.token >= 0) ++res.n_generated_tokens;
      if ((e.token >= 0 || !e.text.empty()) && params->on_token != nullptr && !callback_stopped)
        callback_stopped = !params->on_token(e.text.c_str(), e.text.size(), e.token, params->user_data);
      if (!e.finished) return;
      switch (e.reason) {
        case FinishReason::kStop:
          res.finish_reason = KITE_FINISH_STOP;
          break;
        case FinishReason::kLength:
          res.finish_reason = KITE_FINISH_LENGTH;
          break;
        case FinishReason::kCancelled:
          res.finish_reason = KITE_FINISH_ABORTED;
          break;
        case FinishReason::kError:
          res.finish_reason = KITE_FINISH_ERROR;
          break;
        default:
          break;
      }
      if (e.reason == FinishReason::kError) gen_error = e.error;
    };
    r.on_done = [&](const Usage& u) { res.n_cached_tokens = static_cast<int32_t>(u.cached_tokens); };

    // The scheduler owns the context's sequences while it runs: start from empty ones.
    ctx->outputs = kite_context::Outputs::kNone;
    for (int32_t s = 0; s < ctx->ctx->kv().n_seqs(); ++s) ctx->ctx->kv().clear(s);
    // One scheduler per call (cheap: no buffers until it runs), so an error or an exception in one
    // generation leaves nothing behind for the next; the prefix cache lives in the KV cache.
    SchedulerOptions so;
    so.max_batch_tokens = ctx->n_batch;
    Scheduler sched(*ctx->ctx, ctx->owner->tokenizer, so);
    auto id = sched.submit(std::move(r));
    if (!id) return fail(capi::status_of(id.error()), std::string(kFn) + ": " + id.error().message);
    bool cancelled = false;
    while (!sched.idle()) {
      const bool abort = params->abort_flag != nullptr && std::atomic_ref<int>(*params->abort_flag).load() != 0;
      if ((abort || callback_stopped) && !cancelled) {
        sched.cancel(*id);
        cancelled = true;
      }
      if (auto st = sched.step(); !st) {
        res.finish_reason = KITE_FINISH_ERROR;
        if (result) *result = res;
        return fail(capi::status_of(st.error()), std::string(kFn) + ": " + st.error().message);
      }
    }
    if (cancelled) res.finish_reason = KITE_FINISH_ABORTED;
    if (result) *result = res;
    if (res.finish_reason == KITE_FINISH_ABORTED) return KITE_ABORTED;
    if (res.finish_reason == KITE_FINISH_ERROR)
      return fail(KITE_ERROR_FAILED, std::string(kFn) + ": the generation failed: " + gen_error);
    return KITE_OK;
  });
}

// --- embeddings -----------------------------------------------------------------------------

kite_status kite_embed(kite_context* ctx, const int32_t* tokens, size_t n_tokens, kite_pooling pooling, bool normalize,
                       float* out, size_t capacity, size_t* n_embd) {
  static const char* const kFn = "kite_embed";
  return guard(kFn, [&]() -> kite_status {
    if (ctx == nullptr) return null_arg(kFn, "ctx");
    if (tokens == nullptr) return null_arg(kFn, "tokens");
    if (n_embd == nullptr) return null_arg(kFn, "n_embd");
    if (out == nullptr && capacity > 0) return null_arg(kFn, "out (with capacity > 0)");
    EmbedOptions eo;
    switch (pooling) {
      case KITE_POOLING_MEAN:
        eo.pooling = Pooling::kMean;
        break;
      case KITE_POOLING_LAST:
        eo.pooling = Pooling::kLast;
        break;
      case KITE_POOLING_CLS:
        eo.pooling = Pooling::kCls;
        break;
      default:
        return fail(KITE_ERROR_INVALID_ARGUMENT, std::string(kFn) + ": pooling " + str(pooling) +
                                                     " is not a kite_pooling (KITE_POOLING_MEAN, _LAST or _CLS)");
    }
    eo.normalize = normalize;
    eo.n_batch = static_cast<size_t>(ctx->n_batch);
    const size_t ne = static_cast<size_t>(ctx->owner->model->hparams().n_embd);
    *n_embd = ne;
    if (capacity < ne) return capi::too_small(kFn, ne, capacity);
    ctx->outputs = kite_context::Outputs::kNone;
    auto v = embed(*ctx->ctx, std::span<const int32_t>(tokens, n_tokens), eo, 0);
    if (!v) return fail(capi::status_of(v.error()), std::string(kFn) + ": " + v.error().message);
    std::copy(v->begin(), v->end(), out);
    return KITE_OK;
  });
}

}  // extern "C"

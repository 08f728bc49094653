/* kite.h — the C API of libkite (C99/C11 and C++).
 *
 * Usage: load a model, make a context, generate with a streaming callback.
 *
 *   #include <kite.h>
 *
 *   static bool on_token(const char *piece, size_t len, int32_t token, void *user) {
 *     fwrite(piece, 1, len, stdout);
 *     return true;                                   // false stops the generation
 *   }
 *
 *   kite_model *model = NULL;
 *   kite_context *ctx = NULL;
 *   if (kite_model_load("model.gguf", NULL, &model) != KITE_OK ||
 *       kite_context_new(model, NULL, &ctx) != KITE_OK) {
 *     fprintf(stderr, "%s\n", kite_last_error());
 *     return 1;
 *   }
 *   int32_t prompt[512];
 *   size_t n_prompt = 0;
 *   kite_tokenize(model, "Once upon a time", (size_t)-1, true, false, prompt, 512, &n_prompt);
 *   kite_generate_params gp = kite_generate_default_params();
 *   gp.max_tokens = 64;
 *   gp.on_token = on_token;
 *   kite_generate(ctx, prompt, n_prompt, &gp, NULL);
 *   kite_context_free(ctx);
 *   kite_model_free(model);
 *
 * Apps that drive their own loop use kite_batch + kite_decode + kite_get_logits + kite_sampler
 * (see examples/decode_loop.cpp); examples/chat.c uses kite_chat_apply_template.
 *
 * Thread safety:
 *   - A kite_model is immutable once loaded: any number of threads and contexts may share it
 *     (free it after every context made from it).
 *   - A kite_context (and a kite_sampler, a kite_batch) belongs to one thread at a time; calls on
 *     different contexts may run concurrently. The one exception is the abort flag of
 *     kite_generate, which any thread may set.
 *   - kite_last_error() is per thread. The log callback is process-wide and may be called from any
 *     thread that calls into kite; kite serializes the calls (it must not call kite_log_set_*).
 *
 * Errors: every fallible call returns a kite_status (KITE_OK is 0); on failure kite_last_error()
 * returns a message that names what is wrong (the file, the parameter, expected vs actual). No
 * C++ exception, exit() or abort() crosses this API on bad input. Pointers documented as "out"
 * are written only on success unless stated otherwise.
 *
 * Buffers follow snprintf: functions that fill a caller's buffer take its capacity and report the
 * size needed through an out parameter; when the buffer is too small they return
 * KITE_ERROR_BUFFER_TOO_SMALL (with the needed size set), so call once with capacity 0 to size it.
 */
#ifndef KITE_H
#define KITE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kite_version.h" /* KITE_VERSION_MAJOR, KITE_VERSION_MINOR, KITE_VERSION_PATCH, KITE_VERSION_STRING */

#if defined(__GNUC__) || defined(__clang__)
#define KITE_API __attribute__((visibility("default")))
#else
#define KITE_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------------------------- */
/* Status, errors, version, logging                                                            */

typedef enum kite_status {
  KITE_OK = 0,
  KITE_ABORTED = 1,                     /* stopped on request (abort flag, callback); output so far is valid */
  KITE_ERROR_INVALID_ARGUMENT = 2,      /* a NULL pointer, an out-of-range value, a bad parameter */
  KITE_ERROR_FILE_NOT_FOUND = 3,        /* the path does not exist or cannot be read */
  KITE_ERROR_INVALID_MODEL = 4,         /* the file or folder is not a model kite can load (corrupt, truncated, unsupported) */
  KITE_ERROR_CANCELLED = 5,             /* the progress callback cancelled a load */
  KITE_ERROR_BUFFER_TOO_SMALL = 6,      /* the needed size was written to the size out parameter */
  KITE_ERROR_CONTEXT_FULL = 7,          /* no room left in the context (KV cache) */
  KITE_ERROR_OUT_OF_MEMORY = 8,
  KITE_ERROR_INVALID_STATE = 9,         /* a saved state that does not fit this model or context */
  KITE_ERROR_FAILED = 10                /* anything else; see kite_last_error() */
} kite_status;

/* "KITE_OK", "KITE_ERROR_INVALID_ARGUMENT", ...; "KITE_STATUS_UNKNOWN" for other values. */
KITE_API const char *kite_status_name(kite_status status);

/* The message of the last error on this thread ("" if none). Valid until the next kite call on
 * this thread that fails. */
KITE_API const char *kite_last_error(void);

/* The library's version, "MAJOR.MINOR.PATCH" (compare with KITE_VERSION_STRING from the header). */
KITE_API const char *kite_version(void);

typedef enum kite_log_level {
  KITE_LOG_DEBUG = 0,
  KITE_LOG_INFO = 1,
  KITE_LOG_WARN = 2,
  KITE_LOG_ERROR = 3,
  KITE_LOG_NONE = 4 /* as a minimum level: silence */
} kite_log_level;

/* `message` is one line without a trailing newline; it is valid during the call only. */
typedef void (*kite_log_callback)(kite_log_level level, const char *message, void *user_data);

/* Where kite's logs go (process-wide). NULL restores the default: "kite: LEVEL: message" lines
 * on stderr. */
KITE_API void kite_log_set_callback(kite_log_callback callback, void *user_data);
/* Messages below `level` are dropped (default KITE_LOG_INFO); KITE_LOG_NONE silences kite. */
KITE_API void kite_log_set_level(kite_log_level level);

/* ------------------------------------------------------------------------------------------- */
/* Models                                                                                      */

typedef struct kite_model kite_model;
typedef struct kite_context kite_context;
typedef struct kite_sampler kite_sampler;
typedef struct kite_batch kite_batch;

/* Loading progress: `done` of `total` steps (the loader's units, e.g. tensors prepared); the last
 * call has done == total. Return false to cancel the load (kite_model_load then returns
 * KITE_ERROR_CANCELLED). Called on the loading thread. */
typedef bool (*kite_progress_callback)(uint64_t done, uint64_t total, void *user_data);

typedef struct kite_model_params {
  kite_progress_callback progress; /* NULL: none */
  void *progress_user_data;
} kite_model_params;

KITE_API kite_model_params kite_model_default_params(void);

/* Loads a GGUF file or a Hugging Face folder (config.json + safetensors + tokenizer.json).
 * `params` may be NULL (defaults). On success *out_model owns the model. */
KITE_API kite_status kite_model_load(const char *path, const kite_model_params *params, kite_model **out_model);
/* NULL is ignored. Free every context of the model first. */
KITE_API void kite_model_free(kite_model *model);

KITE_API int32_t kite_model_n_vocab(const kite_model *model);    /* 0 for NULL */
KITE_API int32_t kite_model_n_embd(const kite_model *model);     /* hidden size: embedding dimensions */
KITE_API int32_t kite_model_n_layer(const kite_model *model);
KITE_API int32_t kite_model_n_ctx_train(const kite_model *model);
/* The architecture name ("llama", "qwen2", ...); "" for NULL. Lives as long as the model. */
KITE_API const char *kite_model_arch(const kite_model *model);
/* The model's own Jinja chat template, or NULL when it has none. Lives as long as the model. */
KITE_API const char *kite_model_chat_template(const kite_model *model);

/* Special tokens; -1 when the model has none. */
KITE_API int32_t kite_token_bos(const kite_model *model);
KITE_API int32_t kite_token_eos(const kite_model *model);
/* End of generation (EOS, EOT, <|im_end|>-like control tokens). */
KITE_API bool kite_token_is_eog(const kite_model *model, int32_t token);

/* ------------------------------------------------------------------------------------------- */
/* Tokens and text                                                                             */

/* Text -> token ids. `text_len` (size_t)-1 means NUL-terminated. `add_special` adds BOS (and EOS)
 * as the model's tokenizer asks; `parse_special` matches control tokens written in the text
 * ("<|eot_id|>"). *n_tokens receives the number of tokens of the whole text, also when it does
 * not fit in `capacity` (then KITE_ERROR_BUFFER_TOO_SMALL and the first `capacity` are written).
 * `tokens` may be NULL when `capacity` is 0. */
KITE_API kite_status kite_tokenize(const kite_model *model, const char *text, size_t text_len, bool add_special,
                                   bool parse_special, int32_t *tokens, size_t capacity, size_t *n_tokens);

/* Token ids -> UTF-8 text (always valid UTF-8; U+FFFD for broken bytes). `render_special` writes
 * control tokens' text. *text_len receives the text's length without the NUL; the text and a NUL
 * are written when capacity > *text_len, else KITE_ERROR_BUFFER_TOO_SMALL (and a truncated,
 * NUL-terminated prefix when capacity > 0). */
KITE_API kite_status kite_detokenize(const kite_model *model, const int32_t *tokens, size_t n_tokens,
                                     bool render_special, char *text, size_t capacity, size_t *text_len);

/* The raw bytes of one token (may be part of a UTF-8 character); same buffer rules, no NUL
 * needed: *len receives the byte count, written when capacity >= *len. */
KITE_API kite_status kite_token_to_piece(const kite_model *model, int32_t token, char *buf, size_t capacity,
                                         size_t *len);

typedef struct kite_chat_message {
  const char *role;    /* "system", "user", "assistant" */
  const char *content;
} kite_chat_message;

/* Renders a conversation into prompt text with a chat template:
 *   tmpl == NULL: the model's own template (the built-in chatml when it has none, with a warning log);
 *   tmpl containing "{{" or "{%": Jinja template source;
 *   otherwise a built-in name: "chatml", "llama2", "llama3", "mistral", "phi3", "gemma", "qwen"
 *   (another name: KITE_ERROR_INVALID_ARGUMENT, the message lists them).
 * `add_generation_prompt` ends the text with the opening of an assistant turn. The text may begin
 * with the BOS token's text; tokenize it with parse_special = true, and add_special = false
 * when it already starts with BOS. Same buffer rules as kite_detokenize. */
KITE_API kite_status kite_chat_apply_template(const kite_model *model, const char *tmpl,
                                              const kite_chat_message *messages, size_t n_messages,
                                              bool add_generation_prompt, char *text, size_t capacity,
                                              size_t *text_len);

/* ------------------------------------------------------------------------------------------- */
/* Contexts                                                                                    */

typedef enum kite_kv_type { KITE_KV_F16 = 0, KITE_KV_BF16 = 1, KITE_KV_F32 = 2, KITE_KV_Q8_0 = 3 } kite_kv_type;

/* kite_context_params.gpu_layers: as many of the last layers as fit in the device's memory. */
#define KITE_GPU_LAYERS_AUTO (-2)

/* Contexts are made from kite_context_default_params() with fields changed: the struct may grow
 * (new fields at the end) between versions, so always start from the defaults, and rebuild an
 * app against the kite.h of the libkite it loads (0.x versions do not keep the struct's size). */
typedef struct kite_context_params {
  int32_t n_ctx;       /* positions per sequence (default 2048); must be > 0 */
  int32_t n_seq_max;   /* sequences the context holds at once (default 1) */
  int32_t n_threads;   /* 0: every physical core */
  int32_t n_batch;     /* tokens per model step in kite_generate / kite_embed (default 512) */
  kite_kv_type kv_type;
  bool prefix_cache;   /* reuse KV blocks of earlier prompts with the same beginning (default true) */
  /* Where to compute: a name kite_device_name lists, "cpu" (the default; NULL means it too) or
   * "cuda" (an NVIDIA GPU, in builds with CUDA). A name this build lacks is
   * KITE_ERROR_INVALID_ARGUMENT; a device it has but the machine lacks (no GPU) KITE_ERROR_FAILED. */
  const char *device;
  /* How many transformer layers run on `device` (llama.cpp's -ngl, kite's --gpu-layers):
   *   -1 (default): the whole model on `device`;
   *    0: the whole model on the CPU (`device` is not opened);
   *    N > 0: the last N layers and the output norm + head on `device`, the token embedding and
   *      the first n_layer - N layers on the CPU (N >= n_layer: every layer on `device`); the
   *      activations cross once per step. With device "cpu" the second part runs on a second CPU
   *      backend (the results equal the unsplit ones; for testing a split).
   *   KITE_GPU_LAYERS_AUTO (-2): as many of the last layers as fit in the device's free memory
   *      (leaving a tenth of it, at most 1 GiB, for activations): the whole model where it fits,
   *      none where not even the head does.
   * Below -2: KITE_ERROR_INVALID_ARGUMENT. When the layers do not fit in the device's memory,
   * kite_context_new fails with KITE_ERROR_OUT_OF_MEMORY and a message naming a count that fits. */
  int32_t gpu_layers;
  /* Tensor parallelism: every layer split over this many ranks on `device` (default 1). "cpu":
   * ranks are threads sharing n_threads. A model whose heads or FFN width do not divide, or a
   * device without a communicator, is KITE_ERROR_FAILED with a message naming it. Below 1:
   * KITE_ERROR_INVALID_ARGUMENT. Not with gpu_layers >= 0. */
  int32_t tensor_parallel;
} kite_context_params;

KITE_API kite_context_params kite_context_default_params(void);

/* The compute devices this build of libkite has, i = 0, 1, ...: "cuda" (builds with CUDA) and
 * "cpu" (always, last); NULL past the end. Having a device does not mean the machine has one:
 * kite_context_new says so. The strings live as long as the library. */
KITE_API const char *kite_device_name(size_t i);

/* A context over `model` (which must outlive it). `params` may be NULL (defaults). */
KITE_API kite_status kite_context_new(kite_model *model, const kite_context_params *params, kite_context **out_ctx);
KITE_API void kite_context_free(kite_context *ctx); /* NULL is ignored */
KITE_API int32_t kite_context_n_ctx(const kite_context *ctx);
KITE_API int32_t kite_context_n_seq_max(const kite_context *ctx);
KITE_API const kite_model *kite_context_model(const kite_context *ctx);

/* Tokens (positions) sequence `seq` holds; -1 on a bad argument. */
KITE_API int32_t kite_kv_seq_len(const kite_context *ctx, int32_t seq);
/* Drops positions >= len of `seq` (len 0: empties it); seq -1: every sequence. */
KITE_API kite_status kite_kv_truncate(kite_context *ctx, int32_t seq, int32_t len);

/* ------------------------------------------------------------------------------------------- */
/* Batched decoding: for apps that drive their own loop                                        */

/* A batch of tokens, each appended at the end of its sequence. `capacity` > 0. */
KITE_API kite_status kite_batch_new(size_t capacity, kite_batch **out_batch);
KITE_API void kite_batch_free(kite_batch *batch);
KITE_API void kite_batch_clear(kite_batch *batch);
KITE_API size_t kite_batch_size(const kite_batch *batch);
/* `logits`: keep this token's logits (the i-th token added with logits true is output i). */
KITE_API kite_status kite_batch_add(kite_batch *batch, int32_t token, int32_t seq, bool logits);

/* Runs the model over the batch. On error no sequence changes. When no token asked for logits,
 * the last token's are kept. */
KITE_API kite_status kite_decode(kite_context *ctx, const kite_batch *batch);
/* Outputs of the last kite_decode (or restored by kite_state_load). */
KITE_API int32_t kite_n_outputs(const kite_context *ctx);
/* The logits (kite_model_n_vocab floats) of output i of the last decode; i = -1: the last one.
 * NULL (and kite_last_error) when i is out of range. Valid until the next call on ctx. */
KITE_API const float *kite_get_logits(kite_context *ctx, int32_t i);

/* ------------------------------------------------------------------------------------------- */
/* Sampling                                                                                    */

typedef struct kite_sampler_params {
  float temperature;       /* 0: greedy (default 0.8) */
  int32_t top_k;           /* 0: off (default 40) */
  float top_p;             /* 1: off (default 0.95) */
  float min_p;             /* 0: off (default 0.05) */
  float typical_p;         /* >= 1: off (default 1) */
  float repeat_penalty;    /* 1: off (default 1) */
  float frequency_penalty; /* 0: off */
  float presence_penalty;  /* 0: off */
  int32_t penalty_last_n;  /* tokens the penalties look back over; -1: all, 0: none (default 64) */
  uint64_t seed;           /* the same seed, tokens and logits give the same draw */
} kite_sampler_params;

KITE_API kite_sampler_params kite_sampler_default_params(void);
/* Checks every field; the error names the field and its valid range. */
KITE_API kite_status kite_sampler_new(const kite_sampler_params *params, kite_sampler **out_sampler);
KITE_API void kite_sampler_free(kite_sampler *sampler);
/* The next token from `n_vocab` logits (the caller's array is not changed); -1 on a bad
 * argument or when every token is banned (kite_last_error says which). Does not accept it. */
KITE_API int32_t kite_sampler_sample(kite_sampler *sampler, const float *logits, int32_t n_vocab);
/* Records a kept token (for the penalties). */
KITE_API kite_status kite_sampler_accept(kite_sampler *sampler, int32_t token);
/* Forgets the history and restarts the random stream from the seed. */
KITE_API void kite_sampler_reset(kite_sampler *sampler);

/* ------------------------------------------------------------------------------------------- */
/* Generation                                                                                  */

/* Called with each piece of text as it becomes final (whole UTF-8 characters; may be empty when
 * a token completes no character, or when text is held back because it may start a stop string)
 * and the token that produced it, in generation order; a last call with token -1 may deliver
 * text that was held back until the end. Return false to stop. Runs on the thread that called
 * kite_generate. `piece` is valid during the call only; it is NUL-terminated. */
typedef bool (*kite_token_callback)(const char *piece, size_t len, int32_t token, void *user_data);

typedef enum kite_finish_reason {
  KITE_FINISH_NONE = 0,
  KITE_FINISH_STOP = 1,    /* an end-of-generation token or a stop string */
  KITE_FINISH_LENGTH = 2,  /* max_tokens or the context's end */
  KITE_FINISH_ABORTED = 3, /* the abort flag or the callback */
  KITE_FINISH_ERROR = 4
} kite_finish_reason;

typedef struct kite_generate_params {
  kite_sampler_params sampling;
  int32_t max_tokens;          /* generated tokens at most; <= 0: until the context is full (default 256) */
  bool ignore_eos;             /* keep going past end-of-generation tokens */
  const char *const *stop;     /* stop strings (not passed to the callback); NULL or n_stop entries */
  size_t n_stop;
  kite_token_callback on_token; /* NULL: none */
  void *user_data;
  /* When not NULL: set *abort_flag to nonzero from any thread (an _Atomic int, or an int written
   * with atomic_store) to stop the generation after the current step. Read atomically. */
  int *abort_flag;
} kite_generate_params;

typedef struct kite_generate_result {
  int32_t n_prompt_tokens;
  int32_t n_cached_tokens;      /* prompt tokens served by the prefix cache */
  int32_t n_generated_tokens;
  kite_finish_reason finish_reason;
} kite_generate_result;

KITE_API kite_generate_params kite_generate_default_params(void);

/* Generates a continuation of `prompt` (token ids; include BOS as kite_tokenize adds it) through
 * kite's scheduler. Starts from an empty context: every sequence of ctx is cleared first (the
 * prefix cache still serves a repeated beginning, so a growing chat recomputes only its new
 * tokens). Returns KITE_OK when it finished (result->finish_reason says why), KITE_ABORTED when the
 * abort flag or the callback stopped it. `result` may be NULL. */
KITE_API kite_status kite_generate(kite_context *ctx, const int32_t *prompt, size_t n_prompt,
                                   const kite_generate_params *params, kite_generate_result *result);

/* ------------------------------------------------------------------------------------------- */
/* Embeddings                                                                                  */

typedef enum kite_pooling {
  KITE_POOLING_MEAN = 0, /* mean of every token's final hidden state */
  KITE_POOLING_LAST = 1, /* the last token's */
  KITE_POOLING_CLS = 2   /* the first token's */
} kite_pooling;

/* One embedding of `tokens` (include BOS as kite_tokenize adds it): the final hidden state after
 * the final norm, pooled, L2-normalized when `normalize`; kite_model_n_embd floats into `out`.
 * Runs on sequence 0 of ctx, which must be empty, and leaves it empty. *n_embd receives the
 * dimension count; same buffer rules as above. */
KITE_API kite_status kite_embed(kite_context *ctx, const int32_t *tokens, size_t n_tokens, kite_pooling pooling,
                                bool normalize, float *out, size_t capacity, size_t *n_embd);

/* ------------------------------------------------------------------------------------------- */
/* Saving and restoring a sequence                                                             */

/* A sequence's state: its tokens, their KV cache bytes and, when the last kite_decode produced
 * logits for its last token, those logits. Restoring it into an empty sequence of a context over
 * the same model (same KV type) continues exactly where it was: the next decode gives the same
 * logits, and kite_get_logits(ctx, -1) returns the saved ones.
 * kite_state_save: *size receives the bytes needed; same buffer rules as above. */
KITE_API kite_status kite_state_save(kite_context *ctx, int32_t seq, void *buf, size_t capacity, size_t *size);
/* Replaces sequence `seq` with the state. A state that is damaged or made for another model or KV
 * type is refused (KITE_ERROR_INVALID_STATE) before anything changes; when the KV pool cannot
 * hold it (KITE_ERROR_CONTEXT_FULL) the sequence is left empty. */
KITE_API kite_status kite_state_load(kite_context *ctx, int32_t seq, const void *buf, size_t size);
/* The same through a file (written to a temp file beside it, then renamed). */
KITE_API kite_status kite_state_save_file(kite_context *ctx, int32_t seq, const char *path);
KITE_API kite_status kite_state_load_file(kite_context *ctx, int32_t seq, const char *path);

#ifdef __cplusplus
}
#endif

#endif /* KITE_H */

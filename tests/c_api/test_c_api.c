/* test_c_api.c — the C API, from C11, against the real test models (built with
 * -fsanitize=address; see CMakeLists.txt). One executable, one ctest test per case:
 *
 *   kite-c-api-test CASE       (kite-c-api-test with no argument lists the cases)
 *
 * Paths come from the build: KITE_TESTDATA_DIR, KITE_EXE (the kite executable, for the
 * greedy-output cross-check), KITE_EXAMPLES_DIR (the example programs), KITE_SCRATCH_DIR. */
#define _POSIX_C_SOURCE 200809L /* popen, mkdir */
#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <threads.h>

#include "c_api_test.h"

int g_failures = 0;

const char *path_of(char *buf, size_t cap, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, cap, fmt, ap);
  va_end(ap);
  return buf;
}

char g_target[1024], g_draft_gguf[1024], g_stories[1024], g_reference[1024];

char *read_all(const char *path, size_t *size) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) return NULL;
  size_t cap = 1 << 16, n = 0;
  char *buf = malloc(cap + 1);
  size_t got;
  while (buf != NULL && (got = fread(buf + n, 1, cap - n, f)) > 0) {
    n += got;
    if (n == cap) {
      char *p = realloc(buf, 2 * cap + 1);
      if (p == NULL) {
        free(buf);
        buf = NULL;
        break;
      }
      buf = p;
      cap *= 2;
    }
  }
  fclose(f);
  if (buf != NULL) buf[n] = '\0';
  if (size != NULL) *size = n;
  return buf;
}

size_t json_numbers(const char *json, const char *key, double *out, size_t cap) {
  char pattern[64];
  snprintf(pattern, sizeof pattern, "\"%s\": [", key);
  const char *p = strstr(json, pattern);
  if (p == NULL) return 0;
  p += strlen(pattern);
  size_t n = 0;
  while (*p != ']' && n < cap) {
    char *end = NULL;
    out[n++] = strtod(p, &end);
    if (end == p) break;
    p = end;
    while (*p == ',' || *p == ' ' || *p == '\n') ++p;
  }
  return n;
}

char *run_command(const char *cmd, int *status) {
  FILE *p = popen(cmd, "r");
  if (p == NULL) return NULL;
  size_t cap = 4096, n = 0;
  char *buf = malloc(cap);
  size_t got;
  while (buf != NULL && (got = fread(buf + n, 1, cap - n - 1, p)) > 0) {
    n += got;
    if (n + 1 == cap) {
      char *q = realloc(buf, cap * 2);
      if (q == NULL) break;
      buf = q;
      cap *= 2;
    }
  }
  if (buf != NULL) buf[n] = '\0';
  *status = pclose(p);
  return buf;
}

kite_model *load(const char *path) {
  kite_model *m = NULL;
  kite_status st = kite_model_load(path, NULL, &m);
  CHECK(st == KITE_OK, "loading %s: %s: %s", path, kite_status_name(st), kite_last_error());
  return m;
}

kite_context *new_context(kite_model *m, int32_t n_ctx) {
  kite_context_params p = kite_context_default_params();
  p.n_ctx = n_ctx;
  p.n_threads = 2;
  kite_context *c = NULL;
  kite_status st = kite_context_new(m, &p, &c);
  CHECK(st == KITE_OK, "context: %s", kite_last_error());
  return c;
}

const char kPrompt0[] = "First Citizen:\nBefore we proceed any further, hear me speak.";

/* ------------------------------------------------------------------------------------------- */

static void test_version(void) {
  char want[32];
  snprintf(want, sizeof want, "%d.%d.%d", KITE_VERSION_MAJOR, KITE_VERSION_MINOR, KITE_VERSION_PATCH);
  CHECK(strcmp(kite_version(), want) == 0, "kite_version() %s, macros %s", kite_version(), want);
  CHECK(strcmp(KITE_VERSION_STRING, want) == 0, "KITE_VERSION_STRING %s", KITE_VERSION_STRING);
  CHECK(strcmp(kite_status_name(KITE_ERROR_INVALID_MODEL), "KITE_ERROR_INVALID_MODEL") == 0, "status name");
  CHECK(strcmp(kite_status_name((kite_status)99), "KITE_STATUS_UNKNOWN") == 0, "unknown status name");
}

typedef struct {
  int calls;
  uint64_t last_done, last_total;
  int cancel_after; /* 0: never */
  bool monotonic;
} Progress;

static bool on_progress(uint64_t done, uint64_t total, void *user) {
  Progress *p = user;
  if (p->calls > 0 && done < p->last_done) p->monotonic = false;
  ++p->calls;
  p->last_done = done;
  p->last_total = total;
  return p->cancel_after == 0 || p->calls < p->cancel_after;
}

static void test_load(void) {
  /* A GGUF file with a progress callback that sees done reach total. */
  Progress pr = {0, 0, 0, 0, true};
  kite_model_params mp = kite_model_default_params();
  mp.progress = on_progress;
  mp.progress_user_data = &pr;
  kite_model *m = NULL;
  REQUIRE_OK(kite_model_load(g_draft_gguf, &mp, &m));
  CHECK(pr.calls >= 2 && pr.monotonic && pr.last_done == pr.last_total && pr.last_total > 0,
        "progress: %d calls, last %llu/%llu, monotonic %d", pr.calls, (unsigned long long)pr.last_done,
        (unsigned long long)pr.last_total, pr.monotonic);
  CHECK(kite_model_n_vocab(m) == 4096, "n_vocab %d", kite_model_n_vocab(m));
  CHECK(kite_model_n_embd(m) == 256 && kite_model_n_layer(m) == 2, "draft: n_embd %d, n_layer %d",
        kite_model_n_embd(m), kite_model_n_layer(m));
  CHECK(strcmp(kite_model_arch(m), "llama") == 0, "arch %s", kite_model_arch(m));
  CHECK(kite_token_bos(m) == 0 && kite_token_eos(m) == 1, "bos %d eos %d", kite_token_bos(m), kite_token_eos(m));
  CHECK(kite_token_is_eog(m, 4) && !kite_token_is_eog(m, 100), "<|eot_id|> (4) ends generation, 100 does not");
  kite_model_free(m);

  /* A Hugging Face folder. */
  m = load(g_target);
  REQUIRE(m != NULL, "target");
  CHECK(kite_model_n_embd(m) == 512 && kite_model_n_layer(m) == 4, "target: n_embd %d, n_layer %d",
        kite_model_n_embd(m), kite_model_n_layer(m));
  CHECK(kite_model_chat_template(m) != NULL && strstr(kite_model_chat_template(m), "start_header_id") != NULL,
        "the folder's chat template");
  kite_model_free(m);

  /* Cancelled by the callback's false on its second call. */
  Progress cancel = {0, 0, 0, 2, true};
  mp.progress_user_data = &cancel;
  m = NULL;
  CHECK_ERROR(kite_model_load(g_draft_gguf, &mp, &m), KITE_ERROR_CANCELLED, "cancel");
  CHECK(m == NULL && cancel.calls == 2, "cancelled load: model %p, %d calls", (void *)m, cancel.calls);
}

static void test_tokenize(void) {
  kite_model *m = load(g_target);
  REQUIRE(m != NULL, "model");
  size_t size = 0;
  char *json = read_all(g_reference, &size);
  REQUIRE(json != NULL, "cannot read %s", g_reference);
  double want[64];
  const size_t n_want = json_numbers(json, "ids", want, 64);
  free(json);
  REQUIRE(n_want == 16, "reference ids: %zu", n_want);

  /* Size query, then the ids transformers gave. */
  size_t n = 0;
  CHECK_ERROR(kite_tokenize(m, kPrompt0, (size_t)-1, true, false, NULL, 0, &n), KITE_ERROR_BUFFER_TOO_SMALL,
              "buffer");
  CHECK(n == n_want, "needed %zu tokens, expected %zu", n, n_want);
  int32_t ids[64];
  int32_t small[4];
  CHECK(kite_tokenize(m, kPrompt0, (size_t)-1, true, false, small, 4, &n) == KITE_ERROR_BUFFER_TOO_SMALL && n == n_want,
        "a short buffer reports the full count");
  REQUIRE_OK(kite_tokenize(m, kPrompt0, strlen(kPrompt0), true, false, ids, 64, &n));
  REQUIRE(n == n_want, "%zu tokens", n);
  for (size_t i = 0; i < n; ++i) CHECK(ids[i] == (int32_t)want[i], "id %zu: %d, reference %d", i, ids[i], (int)want[i]);
  CHECK(small[0] == ids[0] && small[3] == ids[3], "the first tokens are written into a short buffer");

  /* Round trip: without the BOS text, the ids give back the text. */
  char text[256];
  size_t len = 0;
  REQUIRE_OK(kite_detokenize(m, ids, n, false, text, sizeof text, &len));
  CHECK(len == strlen(kPrompt0) && strcmp(text, kPrompt0) == 0, "round trip: '%s'", text);
  REQUIRE_OK(kite_detokenize(m, ids, n, true, text, sizeof text, &len));
  CHECK(strncmp(text, "<|begin_of_text|>", 17) == 0, "render_special writes BOS: '%s'", text);
  char tiny[6];
  CHECK(kite_detokenize(m, ids + 1, n - 1, false, tiny, sizeof tiny, &len) == KITE_ERROR_BUFFER_TOO_SMALL &&
            len == strlen(kPrompt0) && strcmp(tiny, "First") == 0,
        "a short text buffer: truncated '%s', needed %zu", tiny, len);

  /* Special tokens in text, and one token's bytes. */
  REQUIRE_OK(kite_tokenize(m, "<|eot_id|>", (size_t)-1, false, true, ids, 64, &n));
  CHECK(n == 1 && ids[0] == 4, "parse_special: %zu tokens, first %d", n, ids[0]);
  REQUIRE_OK(kite_tokenize(m, "<|eot_id|>", (size_t)-1, false, false, ids, 64, &n));
  CHECK(n > 1, "without parse_special the marker is text (%zu tokens)", n);
  REQUIRE_OK(kite_token_to_piece(m, 203, text, sizeof text, &len));
  CHECK(len == 1 && text[0] == '\n', "token 203 is a newline");
  CHECK_ERROR(kite_token_to_piece(m, 4096, text, sizeof text, &len), KITE_ERROR_INVALID_ARGUMENT, "4096");
  int32_t bad = -5;
  CHECK_ERROR(kite_detokenize(m, &bad, 1, false, text, sizeof text, &len), KITE_ERROR_INVALID_ARGUMENT, "-5");
  kite_model_free(m);
}

/* Decodes the reference prompt with every token's logits; compares with transformers' output. */
static void test_decode_logits(void) {
  kite_model *m = load(g_target);
  REQUIRE(m != NULL, "model");
  kite_context *c = new_context(m, 256);
  REQUIRE(c != NULL, "context");
  int32_t ids[64];
  size_t n = 0;
  REQUIRE_OK(kite_tokenize(m, kPrompt0, (size_t)-1, true, false, ids, 64, &n));
  kite_batch *b = NULL;
  REQUIRE_OK(kite_batch_new(n, &b));
  for (size_t i = 0; i < n; ++i) REQUIRE_OK(kite_batch_add(b, ids[i], 0, true));
  CHECK_ERROR(kite_batch_add(b, 5, 0, true), KITE_ERROR_INVALID_ARGUMENT, "full");
  REQUIRE_OK(kite_decode(c, b));
  CHECK(kite_n_outputs(c) == (int32_t)n, "%d outputs", kite_n_outputs(c));
  CHECK(kite_kv_seq_len(c, 0) == (int32_t)n, "sequence length %d", kite_kv_seq_len(c, 0));

  char *json = read_all(g_reference, NULL);
  REQUIRE(json != NULL, "reference");
  static double want[4096];
  const size_t n_logits = json_numbers(json, "last_logits", want, 4096);
  free(json);
  REQUIRE(n_logits == 4096, "reference last_logits: %zu", n_logits);
  const float *last = kite_get_logits(c, -1);
  REQUIRE(last != NULL && last == kite_get_logits(c, (int32_t)n - 1), "logits(-1) is the last output");
  double max_diff = 0;
  for (size_t i = 0; i < 4096; ++i) max_diff = fmax(max_diff, fabs(last[i] - want[i]));
  CHECK(max_diff < 0.02, "max |logit - transformers| = %g", max_diff);
  CHECK(kite_get_logits(c, (int32_t)n) == NULL && strstr(kite_last_error(), "out of range") != NULL,
        "output n is out of range: %s", kite_last_error());

  /* The same prompt in one step without all logits gives the same last logits. */
  kite_context *c2 = new_context(m, 256);
  kite_batch_clear(b);
  for (size_t i = 0; i < n; ++i) REQUIRE_OK(kite_batch_add(b, ids[i], 0, false));
  REQUIRE_OK(kite_decode(c2, b));
  CHECK(kite_n_outputs(c2) == 1, "no logits asked: the last token's are kept (%d outputs)", kite_n_outputs(c2));
  const float *l2 = kite_get_logits(c2, 0);
  double d2 = 0;
  for (size_t i = 0; i < 4096; ++i) d2 = fmax(d2, fabs(l2[i] - last[i]));
  CHECK(d2 < 1e-4, "last-token logits differ by %g with and without all outputs", d2);

  /* Two sequences in one batch. */
  kite_context_params p = kite_context_default_params();
  p.n_ctx = 128;
  p.n_seq_max = 2;
  kite_context *c3 = NULL;
  REQUIRE_OK(kite_context_new(m, &p, &c3));
  kite_batch_clear(b);
  for (size_t i = 0; i < n / 2; ++i) {
    REQUIRE_OK(kite_batch_add(b, ids[i], 0, i + 1 == n / 2));
    REQUIRE_OK(kite_batch_add(b, ids[i], 1, i + 1 == n / 2));
  }
  REQUIRE_OK(kite_decode(c3, b));
  const float *s0 = kite_get_logits(c3, 0), *s1 = kite_get_logits(c3, 1);
  CHECK(s0 && s1 && memcmp(s0, s1, 4096 * sizeof(float)) == 0, "the same tokens in two sequences, the same logits");
  REQUIRE_OK(kite_kv_truncate(c3, 1, 0));
  CHECK(kite_kv_seq_len(c3, 1) == 0 && kite_kv_seq_len(c3, 0) == (int32_t)(n / 2), "truncate one sequence");
  kite_batch_clear(b);
  REQUIRE_OK(kite_batch_add(b, 99999, 0, true));
  CHECK_ERROR(kite_decode(c3, b), KITE_ERROR_INVALID_ARGUMENT, "99999 is outside the vocabulary");
  CHECK(kite_kv_seq_len(c3, 0) == (int32_t)(n / 2), "a failed decode changes nothing");

  kite_batch_free(b);
  kite_context_free(c3);
  kite_context_free(c2);
  kite_context_free(c);
  kite_model_free(m);
}

bool on_token(const char *piece, size_t len, int32_t token, void *user) {
  Stream *s = user;
  if (token < 0 || piece == NULL || piece[len] != '\0') s->order_ok = false;
  if (s->n < 512) s->tokens[s->n++] = token;
  if (s->len + len < sizeof s->text) {
    memcpy(s->text + s->len, piece, len);
    s->len += len;
    s->text[s->len] = '\0';
  }
  atomic_fetch_add(&s->seen, 1);
  return s->stop_after == 0 || s->n < s->stop_after;
}

/* Greedy kite_generate == `kite run --temp 0` == an app's own decode loop with a greedy sampler. */
static void test_generate_greedy(void) {
  kite_model *m = load(g_draft_gguf);
  REQUIRE(m != NULL, "model");
  kite_context *c = new_context(m, 256);
  REQUIRE(c != NULL, "context");
  const char *prompt = "ROMEO:";
  int32_t ids[64];
  size_t n = 0;
  REQUIRE_OK(kite_tokenize(m, prompt, (size_t)-1, true, false, ids, 64, &n));
  static Stream s;
  memset(&s, 0, sizeof s);
  s.order_ok = true;
  kite_generate_params gp = kite_generate_default_params();
  gp.sampling.temperature = 0.0f;
  gp.max_tokens = 32;
  gp.ignore_eos = true;
  gp.on_token = on_token;
  gp.user_data = &s;
  kite_generate_result r;
  REQUIRE_OK(kite_generate(c, ids, n, &gp, &r));
  CHECK(r.n_generated_tokens == 32 && s.n == 32 && r.finish_reason == KITE_FINISH_LENGTH,
        "generated %d (callback saw %d), finish %d", r.n_generated_tokens, s.n, r.finish_reason);
  CHECK(r.n_prompt_tokens == (int32_t)n, "prompt tokens %d", r.n_prompt_tokens);
  CHECK(s.order_ok, "every callback had a token and a NUL-terminated piece");

  /* Streaming: the pieces, in order, are the detokenized tokens. */
  char whole[8192];
  size_t len = 0;
  REQUIRE_OK(kite_detokenize(m, s.tokens, (size_t)s.n, true, whole, sizeof whole, &len));
  CHECK(len == s.len && strcmp(whole, s.text) == 0, "streamed '%s' vs detokenized '%s'", s.text, whole);

  /* `kite run` prints the prompt, then the same continuation. */
  char cmd[4096];
  snprintf(cmd, sizeof cmd, "'%s' run -m '%s' -p '%s' --temp 0 -n 32 --ignore-eos -t 2 2>/dev/null", KITE_EXE,
           g_draft_gguf, prompt);
  int status = 0;
  char *out = run_command(cmd, &status);
  REQUIRE(out != NULL && status == 0, "kite run failed (%d)", status);
  char expected[8400];
  snprintf(expected, sizeof expected, "%s%s\n", prompt, s.text);
  CHECK(strcmp(out, expected) == 0, "kite run printed '%s', the C API gave '%s'", out, expected);
  free(out);

  /* An app's own loop: decode + greedy sampler gives the same tokens. */
  kite_sampler_params sp = kite_sampler_default_params();
  sp.temperature = 0.0f;
  kite_sampler *smp = NULL;
  REQUIRE_OK(kite_sampler_new(&sp, &smp));
  kite_batch *b = NULL;
  REQUIRE_OK(kite_batch_new(64, &b));
  for (size_t i = 0; i < n; ++i) REQUIRE_OK(kite_batch_add(b, ids[i], 0, i + 1 == n));
  for (int i = 0; i < 32; ++i) {
    REQUIRE_OK(kite_decode(c, b));
    const int32_t t = kite_sampler_sample(smp, kite_get_logits(c, -1), kite_model_n_vocab(m));
    CHECK(t == s.tokens[i], "token %d: own loop %d, kite_generate %d", i, t, s.tokens[i]);
    REQUIRE_OK(kite_sampler_accept(smp, t));
    kite_batch_clear(b);
    REQUIRE_OK(kite_batch_add(b, t, 0, true));
  }
  kite_batch_free(b);
  kite_sampler_free(smp);

  /* kite_generate again, after the manual loop filled sequence 0: the same output. */
  static Stream s2;
  memset(&s2, 0, sizeof s2);
  gp.user_data = &s2;
  REQUIRE_OK(kite_generate(c, ids, n, &gp, &r));
  CHECK(strcmp(s2.text, s.text) == 0, "a second generation differs: '%s'", s2.text);
  CHECK(r.n_cached_tokens >= 0, "cached %d", r.n_cached_tokens);
  /* A stop string from the middle of that text: the output ends just before it. */
  REQUIRE(s.len > 20, "greedy text '%s'", s.text);
  char stop[8];
  memcpy(stop, s.text + s.len / 2, 6);
  stop[6] = '\0';
  const size_t cut = (size_t)(strstr(s.text, stop) - s.text);
  const char *stops[1] = {stop};
  static Stream s3;
  memset(&s3, 0, sizeof s3);
  gp.user_data = &s3;
  gp.stop = stops;
  gp.n_stop = 1;
  REQUIRE_OK(kite_generate(c, ids, n, &gp, &r));
  CHECK(r.finish_reason == KITE_FINISH_STOP && s3.len == cut && strncmp(s3.text, s.text, cut) == 0,
        "stop '%s': finish %d, got '%s', expected the first %zu bytes of '%s'", stop, r.finish_reason, s3.text, cut,
        s.text);
  kite_context_free(c);
  kite_model_free(m);
}

typedef struct {
  Stream *stream;
  int *flag;
} AbortArgs;

static int abort_thread(void *arg) {
  AbortArgs *a = arg;
  while (atomic_load(&a->stream->seen) < 5) thrd_yield();
  atomic_store((_Atomic int *)a->flag, 1);
  return 0;
}

/* Stopping mid-generation: by the callback's return value, and by the abort flag from a thread. */
static void test_abort(void) {
  kite_model *m = load(g_draft_gguf);
  REQUIRE(m != NULL, "model");
  kite_context *c = new_context(m, 512);
  REQUIRE(c != NULL, "context");
  int32_t ids[64];
  size_t n = 0;
  REQUIRE_OK(kite_tokenize(m, "JULIET:", (size_t)-1, true, false, ids, 64, &n));
  static Stream s;
  memset(&s, 0, sizeof s);
  s.stop_after = 3;
  kite_generate_params gp = kite_generate_default_params();
  gp.max_tokens = 400;
  gp.ignore_eos = true;
  gp.on_token = on_token;
  gp.user_data = &s;
  kite_generate_result r;
  CHECK(kite_generate(c, ids, n, &gp, &r) == KITE_ABORTED, "callback stop: %s", kite_last_error());
  CHECK(s.n == 3 && r.finish_reason == KITE_FINISH_ABORTED, "callback stop: %d tokens, finish %d", s.n,
        r.finish_reason);

  memset(&s, 0, sizeof s);
  _Atomic int flag = 0;
  AbortArgs args = {&s, (int *)&flag};
  gp.abort_flag = (int *)&flag;
  thrd_t th;
  REQUIRE(thrd_create(&th, abort_thread, &args) == thrd_success, "thread");
  const kite_status st = kite_generate(c, ids, n, &gp, &r);
  thrd_join(th, NULL);
  CHECK(st == KITE_ABORTED && r.finish_reason == KITE_FINISH_ABORTED, "abort flag: %s, finish %d",
        kite_status_name(st), r.finish_reason);
  CHECK(s.n >= 5 && s.n < 400 && r.n_generated_tokens == s.n, "aborted after %d tokens (result says %d)", s.n,
        r.n_generated_tokens);

  /* The context is usable afterwards. */
  flag = 0;
  memset(&s, 0, sizeof s);
  gp.max_tokens = 4;
  REQUIRE_OK(kite_generate(c, ids, n, &gp, &r));
  CHECK(r.n_generated_tokens == 4, "after an abort: %d tokens", r.n_generated_tokens);
  kite_context_free(c);
  kite_model_free(m);
}

typedef struct {
  kite_model *model;
  const int32_t *prompt;
  size_t n_prompt;
  Stream stream;
  kite_status status;
  char error[256];
} Worker;

static int generate_worker(void *arg) {
  Worker *w = arg;
  kite_context *c = NULL;
  kite_context_params p = kite_context_default_params();
  p.n_ctx = 128;
  p.n_threads = 1;
  w->status = kite_context_new(w->model, &p, &c);
  if (w->status != KITE_OK) return 0;
  kite_generate_params gp = kite_generate_default_params();
  gp.sampling.temperature = 0.0f;
  gp.max_tokens = 24;
  gp.ignore_eos = true;
  gp.on_token = on_token;
  gp.user_data = &w->stream;
  w->status = kite_generate(c, w->prompt, w->n_prompt, &gp, NULL);
  /* An error on this thread does not touch the main thread's last error. */
  kite_context_new(NULL, NULL, &c);
  snprintf(w->error, sizeof w->error, "%s", kite_last_error());
  kite_context_free(c);
  return 0;
}

/* One model, two threads with a context each: both give the single-threaded greedy text. */
static void test_threads(void) {
  kite_model *m = load(g_draft_gguf);
  REQUIRE(m != NULL, "model");
  int32_t ids[64];
  size_t n = 0;
  REQUIRE_OK(kite_tokenize(m, "KING HENRY:", (size_t)-1, true, false, ids, 64, &n));
  static Worker w[3];
  memset(w, 0, sizeof w);
  for (int i = 0; i < 3; ++i) w[i] = (Worker){.model = m, .prompt = ids, .n_prompt = n};
  generate_worker(&w[0]);
  REQUIRE(w[0].status == KITE_OK && w[0].stream.n == 24, "single thread: %s", kite_status_name(w[0].status));
  kite_tokenize(m, NULL, 0, false, false, NULL, 0, &n); /* this thread's own error */
  char mine[256];
  snprintf(mine, sizeof mine, "%s", kite_last_error());
  thrd_t t[2];
  for (int i = 0; i < 2; ++i) REQUIRE(thrd_create(&t[i], generate_worker, &w[i + 1]) == thrd_success, "thread");
  for (int i = 0; i < 2; ++i) thrd_join(t[i], NULL);
  for (int i = 1; i < 3; ++i) {
    CHECK(w[i].status == KITE_OK && strcmp(w[i].stream.text, w[0].stream.text) == 0, "thread %d: %s '%s' vs '%s'", i,
          kite_status_name(w[i].status), w[i].stream.text, w[0].stream.text);
    CHECK(strstr(w[i].error, "model is NULL") != NULL, "thread %d's last error: %s", i, w[i].error);
  }
  CHECK(strcmp(kite_last_error(), mine) == 0 && strstr(mine, "text is NULL") != NULL,
        "the main thread's last error changed: '%s' (was '%s')", kite_last_error(), mine);
  kite_model_free(m);
}

/* ------------------------------------------------------------------------------------------- */

typedef struct {
  const char *name;
  void (*run)(void);
} Case;

static const Case kCases[] = {
    {"version", test_version},   {"load", test_load},
    {"tokenize", test_tokenize}, {"decode_logits", test_decode_logits},
    {"generate_greedy", test_generate_greedy}, {"abort", test_abort},
    {"embed", test_embed},       {"state", test_state},
    {"chat_template", test_chat_template},     {"log", test_log},
    {"errors", test_errors},     {"examples", test_examples},
    {"threads", test_threads},   {"placement", test_placement},
};

int main(int argc, char **argv) {
  path_of(g_target, sizeof g_target, "%s/models/llama-target", KITE_TESTDATA_DIR);
  path_of(g_draft_gguf, sizeof g_draft_gguf, "%s/gguf/llama-draft-Q8_0.gguf", KITE_TESTDATA_DIR);
  path_of(g_stories, sizeof g_stories, "%s/gguf/stories260K-Q8_0.gguf", KITE_TESTDATA_DIR);
  path_of(g_reference, sizeof g_reference, "%s/models/llama-target/reference.json", KITE_TESTDATA_DIR);
  char dir[1024];
  snprintf(dir, sizeof dir, "%s", KITE_SCRATCH_DIR);
  for (char *p = dir + 1; *p != '\0'; ++p)
    if (*p == '/') {
      *p = '\0';
      mkdir(dir, 0755);
      *p = '/';
    }
  mkdir(dir, 0755);
  const size_t n_cases = sizeof kCases / sizeof kCases[0];
  if (argc < 2) {
    for (size_t i = 0; i < n_cases; ++i) printf("%s\n", kCases[i].name);
    return 0;
  }
  for (size_t i = 0; i < n_cases; ++i) {
    if (strcmp(argv[1], kCases[i].name) != 0 && strcmp(argv[1], "all") != 0) continue;
    const int before = g_failures;
    kCases[i].run();
    printf("%s: %s\n", kCases[i].name, g_failures == before ? "ok" : "FAILED");
    if (strcmp(argv[1], "all") != 0) return g_failures == 0 ? 0 : 1;
  }
  if (strcmp(argv[1], "all") == 0) return g_failures == 0 ? 0 : 1;
  fprintf(stderr, "unknown case '%s'\n", argv[1]);
  return 2;
}

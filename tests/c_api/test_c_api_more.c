/* test_c_api_more.c — the C API test, continued: embeddings, sequence state, chat templates,
 * logging, error paths and the example programs (see test_c_api.c). */
#define _POSIX_C_SOURCE 200809L /* popen */
#include <math.h>
#include <stdlib.h>

#include "c_api_test.h"

void test_embed(void) {
  kite_model *m = load(g_target);
  REQUIRE(m != NULL, "model");
  kite_context *c = new_context(m, 128);
  REQUIRE(c != NULL, "context");
  char *json = read_all(g_reference, NULL);
  REQUIRE(json != NULL, "reference");
  static double want[512];
  const size_t n_want = json_numbers(json, "embedding", want, 512);
  free(json);
  REQUIRE(n_want == 512, "reference embedding: %zu values", n_want);

  int32_t ids[64];
  size_t n = 0;
  REQUIRE_OK(kite_tokenize(m, "The cat sat on the mat.", (size_t)-1, true, false, ids, 64, &n));
  float v[512];
  size_t dims = 0;
  CHECK_ERROR(kite_embed(c, ids, n, KITE_POOLING_MEAN, true, NULL, 0, &dims), KITE_ERROR_BUFFER_TOO_SMALL, "512");
  CHECK(dims == 512, "dims %zu", dims);
  REQUIRE_OK(kite_embed(c, ids, n, KITE_POOLING_MEAN, true, v, 512, &dims));
  double norm = 0, dot = 0;
  for (size_t d = 0; d < 512; ++d) norm += (double)v[d] * v[d], dot += v[d] * want[d];
  CHECK(fabs(sqrt(norm) - 1.0) < 1e-4, "norm %g", sqrt(norm));
  CHECK(dot > 0.999, "cosine with transformers' embedding %g", dot);
  CHECK(kite_kv_seq_len(c, 0) == 0, "the sequence is empty again");

  /* Last and first-token pooling, without normalization. */
  float last[512], cls[512], cls2[512];
  REQUIRE_OK(kite_embed(c, ids, n, KITE_POOLING_LAST, false, last, 512, &dims));
  REQUIRE_OK(kite_embed(c, ids, n, KITE_POOLING_CLS, false, cls, 512, &dims));
  REQUIRE_OK(kite_embed(c, ids, 1, KITE_POOLING_CLS, false, cls2, 512, &dims));
  double nl = 0;
  for (size_t d = 0; d < 512; ++d) nl += (double)last[d] * last[d];
  CHECK(fabs(sqrt(nl) - 1.0) > 1e-3, "unnormalized last-token state has norm %g", sqrt(nl));
  CHECK(memcmp(last, cls, sizeof last) != 0, "last and first token differ");
  double dc = 0;
  for (size_t d = 0; d < 512; ++d) dc = fmax(dc, fabs(cls[d] - cls2[d]));
  CHECK(dc < 1e-4, "the first token's state does not depend on later tokens (%g)", dc);

  CHECK_ERROR(kite_embed(c, ids, n, (kite_pooling)7, true, v, 512, &dims), KITE_ERROR_INVALID_ARGUMENT, "pooling");
  CHECK_ERROR(kite_embed(c, ids, 0, KITE_POOLING_MEAN, true, v, 512, &dims), KITE_ERROR_INVALID_ARGUMENT, "empty");
  kite_context_free(c);
  kite_model_free(m);
}

/* Save a sequence, restore it into a fresh context: the same logits now and after the next token. */
void test_state(void) {
  kite_model *m = load(g_target);
  REQUIRE(m != NULL, "model");
  kite_context *a = new_context(m, 256), *b = new_context(m, 256), *f = new_context(m, 256);
  REQUIRE(a && b && f, "contexts");
  int32_t ids[64];
  size_t n = 0;
  REQUIRE_OK(kite_tokenize(m, kPrompt0, (size_t)-1, true, false, ids, 64, &n));
  kite_batch *batch = NULL;
  REQUIRE_OK(kite_batch_new(64, &batch));
  for (size_t i = 0; i < n; ++i) REQUIRE_OK(kite_batch_add(batch, ids[i], 0, i + 1 == n));
  REQUIRE_OK(kite_decode(a, batch));

  size_t size = 0;
  CHECK_ERROR(kite_state_save(a, 0, NULL, 0, &size), KITE_ERROR_BUFFER_TOO_SMALL, "needed");
  REQUIRE(size > n * 4 + 4096 * 4, "state size %zu", size);
  unsigned char *state = malloc(size);
  REQUIRE_OK(kite_state_save(a, 0, state, size, &size));
  char file[1024];
  path_of(file, sizeof file, "%s/seq.state", KITE_SCRATCH_DIR);
  REQUIRE_OK(kite_state_save_file(a, 0, file));

  REQUIRE_OK(kite_state_load(b, 0, state, size));
  REQUIRE_OK(kite_state_load_file(f, 0, file));
  CHECK(kite_kv_seq_len(b, 0) == (int32_t)n && kite_kv_seq_len(f, 0) == (int32_t)n, "restored lengths %d, %d",
        kite_kv_seq_len(b, 0), kite_kv_seq_len(f, 0));
  const float *la = kite_get_logits(a, -1), *lb = kite_get_logits(b, -1), *lf = kite_get_logits(f, -1);
  REQUIRE(la && lb && lf, "logits after restore: %s", kite_last_error());
  CHECK(memcmp(la, lb, 4096 * sizeof(float)) == 0 && memcmp(la, lf, 4096 * sizeof(float)) == 0,
        "the saved logits come back");

  /* The next token: identical logits in the original and both restored contexts. */
  const int32_t next = 203;
  kite_context *ctxs[3] = {a, b, f};
  static float next_logits[3][4096];
  for (int k = 0; k < 3; ++k) {
    kite_batch_clear(batch);
    REQUIRE_OK(kite_batch_add(batch, next, 0, true));
    REQUIRE_OK(kite_decode(ctxs[k], batch));
    memcpy(next_logits[k], kite_get_logits(ctxs[k], 0), sizeof next_logits[k]);
  }
  CHECK(memcmp(next_logits[0], next_logits[1], sizeof next_logits[0]) == 0, "next-token logits: restored from buffer");
  CHECK(memcmp(next_logits[0], next_logits[2], sizeof next_logits[0]) == 0, "next-token logits: restored from file");

  /* Damaged or foreign states are refused and leave the sequence empty. */
  state[size / 2] ^= 0x5a;
  CHECK_ERROR(kite_state_load(b, 0, state, size), KITE_ERROR_INVALID_STATE, "checksum");
  CHECK(kite_kv_seq_len(b, 0) == (int32_t)n + 1, "a refused state changes nothing (%d)", kite_kv_seq_len(b, 0));
  state[size / 2] ^= 0x5a;
  CHECK_ERROR(kite_state_load(b, 0, state, size - 1), KITE_ERROR_INVALID_STATE, "bytes");
  char not_state[128];
  memset(not_state, 'x', sizeof not_state);
  CHECK_ERROR(kite_state_load(b, 0, not_state, sizeof not_state), KITE_ERROR_INVALID_STATE, "magic");
  CHECK_ERROR(kite_state_load(b, 0, not_state, 20), KITE_ERROR_INVALID_STATE, "less than a header");
  /* A Q8_0 KV cache round-trips too; an F16 state does not load into it. */
  kite_context_params qp = kite_context_default_params();
  qp.n_ctx = 256;
  qp.kv_type = KITE_KV_Q8_0;
  kite_context *q1 = NULL, *q2 = NULL;
  REQUIRE_OK(kite_context_new(m, &qp, &q1));
  REQUIRE_OK(kite_context_new(m, &qp, &q2));
  CHECK_ERROR(kite_state_load(q1, 0, state, size), KITE_ERROR_INVALID_STATE, "KV type");
  kite_batch_clear(batch);
  for (size_t i = 0; i < n; ++i) REQUIRE_OK(kite_batch_add(batch, ids[i], 0, false));
  REQUIRE_OK(kite_decode(q1, batch));
  size_t qsize = 0;
  kite_state_save(q1, 0, NULL, 0, &qsize);
  CHECK(qsize < size, "a Q8_0 state (%zu bytes) is smaller than an F16 one (%zu)", qsize, size);
  unsigned char *qstate = malloc(qsize);
  REQUIRE_OK(kite_state_save(q1, 0, qstate, qsize, &qsize));
  REQUIRE_OK(kite_state_load(q2, 0, qstate, qsize));
  free(qstate);
  static float q_logits[2][4096];
  kite_context *qs[2] = {q1, q2};
  for (int k = 0; k < 2; ++k) {
    kite_batch_clear(batch);
    REQUIRE_OK(kite_batch_add(batch, next, 0, true));
    REQUIRE_OK(kite_decode(qs[k], batch));
    memcpy(q_logits[k], kite_get_logits(qs[k], 0), sizeof q_logits[k]);
  }
  CHECK(memcmp(q_logits[0], q_logits[1], sizeof q_logits[0]) == 0, "Q8_0 KV: next-token logits after restore");
  kite_context_free(q2);
  kite_context_free(q1);

  kite_context *tiny = new_context(m, 8);
  CHECK_ERROR(kite_state_load(tiny, 0, state, size), KITE_ERROR_CONTEXT_FULL, "16 tokens");
  kite_context_free(tiny);

  kite_model *draft = load(g_draft_gguf);
  kite_context *d = new_context(draft, 256);
  CHECK_ERROR(kite_state_load(d, 0, state, size), KITE_ERROR_INVALID_STATE, "n_layer");
  CHECK_ERROR(kite_state_load(b, 3, state, size), KITE_ERROR_INVALID_ARGUMENT, "sequence 3");
  path_of(file, sizeof file, "%s/no-such.state", KITE_SCRATCH_DIR);
  CHECK_ERROR(kite_state_load_file(b, 0, file), KITE_ERROR_FILE_NOT_FOUND, "no-such.state");
  kite_context_free(d);
  kite_model_free(draft);
  free(state);
  kite_batch_free(batch);
  kite_context_free(f);
  kite_context_free(b);
  kite_context_free(a);
  kite_model_free(m);
}

void test_chat_template(void) {
  kite_model *m = load(g_target);
  REQUIRE(m != NULL, "model");
  const kite_chat_message msgs[2] = {{"system", "Be brief."}, {"user", "Who are you?"}};
  size_t len = 0;
  CHECK_ERROR(kite_chat_apply_template(m, NULL, msgs, 2, true, NULL, 0, &len), KITE_ERROR_BUFFER_TOO_SMALL, "needed");
  char *text = malloc(len + 1);
  REQUIRE_OK(kite_chat_apply_template(m, NULL, msgs, 2, true, text, len + 1, &len));
  CHECK(strlen(text) == len, "length %zu", len);
  CHECK(strstr(text, "<|start_header_id|>user<|end_header_id|>") != NULL && strstr(text, "Who are you?") != NULL &&
            strstr(text, "Be brief.") != NULL,
        "the model's template: '%s'", text);
  const char *tail = "<|start_header_id|>assistant<|end_header_id|>\n\n";
  CHECK(len >= strlen(tail) && strcmp(text + len - strlen(tail), tail) == 0, "generation prompt at the end: '%s'", text);
  free(text);

  char buf[1024];
  REQUIRE_OK(kite_chat_apply_template(m, "chatml", msgs + 1, 1, true, buf, sizeof buf, &len));
  CHECK(strcmp(buf, "<|im_start|>user\nWho are you?<|im_end|>\n<|im_start|>assistant\n") == 0, "chatml: '%s'", buf);
  REQUIRE_OK(kite_chat_apply_template(m, "{% for m in messages %}[{{ m.role }}] {{ m.content }}{% endfor %}", msgs, 2,
                                      false, buf, sizeof buf, &len));
  CHECK(strcmp(buf, "[system] Be brief.[user] Who are you?") == 0, "inline template: '%s'", buf);
  CHECK_ERROR(kite_chat_apply_template(m, "no-such-template", msgs, 2, true, buf, sizeof buf, &len),
              KITE_ERROR_INVALID_ARGUMENT, "chatml");
  CHECK_ERROR(kite_chat_apply_template(m, "{% for %}", msgs, 2, true, buf, sizeof buf, &len), KITE_ERROR_FAILED,
              "template");
  const kite_chat_message bad[1] = {{"user", NULL}};
  CHECK_ERROR(kite_chat_apply_template(m, NULL, bad, 1, true, buf, sizeof buf, &len), KITE_ERROR_INVALID_ARGUMENT,
              "messages[0]");
  kite_model_free(m);
}

typedef struct {
  int infos, errors;
  char last[512];
} LogCapture;

static void capture_log(kite_log_level level, const char *message, void *user) {
  LogCapture *c = user;
  if (level == KITE_LOG_INFO) ++c->infos;
  if (level == KITE_LOG_ERROR) ++c->errors;
  snprintf(c->last, sizeof c->last, "%s", message);
}

void test_log(void) {
  LogCapture cap = {0, 0, ""};
  kite_log_set_callback(capture_log, &cap);
  kite_model *m = load(g_draft_gguf);
  CHECK(cap.infos == 1 && strstr(cap.last, "loaded") != NULL, "load log: %d infos, '%s'", cap.infos, cap.last);
  kite_model *none = NULL;
  kite_model_load("/no/such/model.gguf", NULL, &none);
  CHECK(cap.errors == 1 && strstr(cap.last, "/no/such/model.gguf") != NULL, "error log: '%s'", cap.last);
  kite_log_set_level(KITE_LOG_NONE);
  kite_model_free(m);
  m = load(g_draft_gguf);
  kite_model_load("/no/such/model.gguf", NULL, &none);
  CHECK(cap.infos == 1 && cap.errors == 1, "silenced: %d infos, %d errors", cap.infos, cap.errors);
  kite_log_set_level(KITE_LOG_INFO);
  kite_log_set_callback(NULL, NULL);
  kite_model_free(m);
}

static void write_file(const char *path, const void *data, size_t n) {
  FILE *f = fopen(path, "wb");
  if (f != NULL) {
    fwrite(data, 1, n, f);
    fclose(f);
  }
}

/* Bad files and bad arguments: a status and a message that names the problem, never a crash. */
void test_errors(void) {
  kite_log_set_level(KITE_LOG_NONE);
  kite_model *m = NULL;
  CHECK_ERROR(kite_model_load("/no/such/dir/model.gguf", NULL, &m), KITE_ERROR_FILE_NOT_FOUND, "/no/such/dir/model.gguf");
  CHECK_ERROR(kite_model_load(NULL, NULL, &m), KITE_ERROR_INVALID_ARGUMENT, "path is NULL");
  CHECK_ERROR(kite_model_load(g_draft_gguf, NULL, NULL), KITE_ERROR_INVALID_ARGUMENT, "out_model is NULL");

  /* A truncated GGUF file, and one of garbage, in the scratch folder. */
  size_t size = 0;
  char *bytes = read_all(g_draft_gguf, &size);
  REQUIRE(bytes != NULL && size > 100000, "read %s", g_draft_gguf);
  char truncated[1024], garbage[1024], empty[1024];
  path_of(truncated, sizeof truncated, "%s/truncated.gguf", KITE_SCRATCH_DIR);
  path_of(garbage, sizeof garbage, "%s/garbage.gguf", KITE_SCRATCH_DIR);
  path_of(empty, sizeof empty, "%s/empty.gguf", KITE_SCRATCH_DIR);
  write_file(truncated, bytes, size / 2);
  memset(bytes, 0x41, 4096);
  write_file(garbage, bytes, 4096);
  write_file(empty, bytes, 0);
  free(bytes);
  CHECK_ERROR(kite_model_load(truncated, NULL, &m), KITE_ERROR_INVALID_MODEL, "truncated.gguf");
  CHECK(m == NULL, "no model from a truncated file");
  CHECK_ERROR(kite_model_load(garbage, NULL, &m), KITE_ERROR_INVALID_MODEL, "garbage.gguf");
  CHECK_ERROR(kite_model_load(empty, NULL, &m), KITE_ERROR_INVALID_MODEL, "empty.gguf");
  CHECK_ERROR(kite_model_load(KITE_SCRATCH_DIR, NULL, &m), KITE_ERROR_INVALID_MODEL, KITE_SCRATCH_DIR);

  m = load(g_draft_gguf);
  REQUIRE(m != NULL, "model");
  kite_context *c = NULL;
  kite_context_params p = kite_context_default_params();
  p.n_ctx = 0;
  CHECK_ERROR(kite_context_new(m, &p, &c), KITE_ERROR_INVALID_ARGUMENT, "n_ctx must be > 0, got 0");
  p = kite_context_default_params();
  p.n_seq_max = -1;
  CHECK_ERROR(kite_context_new(m, &p, &c), KITE_ERROR_INVALID_ARGUMENT, "n_seq_max");
  p = kite_context_default_params();
  p.kv_type = (kite_kv_type)42;
  CHECK_ERROR(kite_context_new(m, &p, &c), KITE_ERROR_INVALID_ARGUMENT, "kv_type");
  CHECK_ERROR(kite_context_new(NULL, NULL, &c), KITE_ERROR_INVALID_ARGUMENT, "model is NULL");
  p = kite_context_default_params();
  p.device = "abacus";
  CHECK_ERROR(kite_context_new(m, &p, &c), KITE_ERROR_INVALID_ARGUMENT, "abacus");
  CHECK(c == NULL, "no context");
  c = new_context(m, 16);
  REQUIRE(c != NULL, "context");

  size_t n = 0;
  int32_t ids[64];
  CHECK_ERROR(kite_tokenize(m, NULL, 0, true, false, ids, 64, &n), KITE_ERROR_INVALID_ARGUMENT, "text is NULL");
  CHECK_ERROR(kite_tokenize(NULL, "x", 1, true, false, ids, 64, &n), KITE_ERROR_INVALID_ARGUMENT, "model is NULL");
  CHECK_ERROR(kite_tokenize(m, "x", 1, true, false, NULL, 5, &n), KITE_ERROR_INVALID_ARGUMENT, "tokens");
  CHECK_ERROR(kite_decode(c, NULL), KITE_ERROR_INVALID_ARGUMENT, "batch is NULL");
  kite_batch *b = NULL;
  CHECK_ERROR(kite_batch_new(0, &b), KITE_ERROR_INVALID_ARGUMENT, "capacity");
  REQUIRE_OK(kite_batch_new(32, &b));
  CHECK_ERROR(kite_decode(c, b), KITE_ERROR_INVALID_ARGUMENT, "empty");
  REQUIRE_OK(kite_batch_add(b, 1, 5, true));
  CHECK_ERROR(kite_decode(c, b), KITE_ERROR_INVALID_ARGUMENT, "sequence 5 is out of range [0, 1)");
  CHECK(kite_get_logits(c, 0) == NULL && strstr(kite_last_error(), "no logits") != NULL, "no logits yet: %s",
        kite_last_error());
  CHECK(kite_kv_seq_len(c, 7) == -1 && strstr(kite_last_error(), "sequence 7") != NULL, "seq_len of sequence 7");

  /* A prompt longer than the context (16). */
  REQUIRE_OK(kite_tokenize(m, "ROMEO: what light through yonder window breaks? It is the east", (size_t)-1, true,
                           false, ids, 64, &n));
  REQUIRE(n > 16, "%zu tokens", n);
  kite_generate_params gp = kite_generate_default_params();
  CHECK_ERROR(kite_generate(c, ids, n, &gp, NULL), KITE_ERROR_CONTEXT_FULL, "context");
  kite_batch_clear(b);
  for (size_t i = 0; i < n && i < 32; ++i) REQUIRE_OK(kite_batch_add(b, ids[i], 0, false));
  CHECK_ERROR(kite_decode(c, b), KITE_ERROR_CONTEXT_FULL, "context full");
  CHECK_ERROR(kite_generate(c, ids, 0, &gp, NULL), KITE_ERROR_INVALID_ARGUMENT, "empty");
  CHECK_ERROR(kite_generate(c, ids, 3, NULL, NULL), KITE_ERROR_INVALID_ARGUMENT, "params is NULL");
  gp.sampling.top_p = 1.5f;
  CHECK_ERROR(kite_generate(c, ids, 3, &gp, NULL), KITE_ERROR_INVALID_ARGUMENT, "top_p");
  gp = kite_generate_default_params();
  gp.n_stop = 2;
  CHECK_ERROR(kite_generate(c, ids, 3, &gp, NULL), KITE_ERROR_INVALID_ARGUMENT, "stop");

  kite_sampler_params sp = kite_sampler_default_params();
  sp.top_p = 1.5f;
  kite_sampler *s = NULL;
  CHECK_ERROR(kite_sampler_new(&sp, &s), KITE_ERROR_INVALID_ARGUMENT, "top_p");
  sp = kite_sampler_default_params();
  sp.temperature = -1.0f;
  CHECK_ERROR(kite_sampler_new(&sp, &s), KITE_ERROR_INVALID_ARGUMENT, "temperature");
  CHECK(s == NULL, "no sampler");
  sp = kite_sampler_default_params();
  REQUIRE_OK(kite_sampler_new(&sp, &s));
  CHECK(kite_sampler_sample(s, NULL, 10) == -1 && strstr(kite_last_error(), "logits is NULL") != NULL, "NULL logits");
  const float banned[3] = {-INFINITY, -INFINITY, -INFINITY};
  CHECK(kite_sampler_sample(s, banned, 3) == -1 && strstr(kite_last_error(), "banned") != NULL, "all banned: %s",
        kite_last_error());
  const float three[3] = {0.f, 5.f, 1.f};
  sp.temperature = 0.f;
  kite_sampler *g = NULL;
  REQUIRE_OK(kite_sampler_new(&sp, &g));
  CHECK(kite_sampler_sample(g, three, 3) == 1, "greedy picks the largest");
  CHECK_ERROR(kite_sampler_accept(NULL, 1), KITE_ERROR_INVALID_ARGUMENT, "sampler is NULL");

  /* NULL handles are ignored by the free functions and answer 0 from the getters. */
  kite_model_free(NULL);
  kite_context_free(NULL);
  kite_sampler_free(NULL);
  kite_batch_free(NULL);
  CHECK(kite_model_n_vocab(NULL) == 0 && kite_context_n_ctx(NULL) == 0 && kite_n_outputs(NULL) == 0, "NULL getters");
  kite_sampler_free(g);
  kite_sampler_free(s);
  kite_batch_free(b);
  kite_context_free(c);
  kite_model_free(m);
  kite_log_set_level(KITE_LOG_INFO);
}

/* The example programs, run once each on the test models. */
void test_examples(void) {
  char cmd[4096];
  int status = 0;

  /* simple: the same text as `kite run --temp 0` on the stories260K model. */
  snprintf(cmd, sizeof cmd, "'%s/kite-example-simple' '%s' 'Once upon a time' 32 2>/dev/null", KITE_EXAMPLES_DIR,
           g_stories);
  char *simple = run_command(cmd, &status);
  REQUIRE(simple != NULL && status == 0, "simple failed (%d)", status);
  snprintf(cmd, sizeof cmd, "'%s' run -m '%s' -p 'Once upon a time' --temp 0 -n 32 -t 2 2>/dev/null", KITE_EXE,
           g_stories);
  char *run = run_command(cmd, &status);
  REQUIRE(run != NULL && status == 0, "kite run failed (%d)", status);
  CHECK(strcmp(simple, run) == 0 && strlen(simple) > 40, "simple printed '%s', kite run '%s'", simple, run);
  free(simple);
  free(run);

  /* chat: two turns from stdin give two replies. */
  snprintf(cmd, sizeof cmd, "printf 'Hello\\nWho are you?\\n' | '%s/kite-example-chat' '%s' 2>/dev/null",
           KITE_EXAMPLES_DIR, g_target);
  char *chat = run_command(cmd, &status);
  REQUIRE(chat != NULL && status == 0, "chat failed (%d)", status);
  int replies = 0;
  for (const char *p = chat; (p = strstr(p, "assistant: ")) != NULL; p += 11) ++replies;
  CHECK(replies == 2, "chat: %d replies in '%s'", replies, chat);
  free(chat);

  /* embed: unit vectors of 512 dimensions, similarity 1 with themselves. */
  snprintf(cmd, sizeof cmd, "'%s/kite-example-embed' '%s' 'The cat sat on the mat.' 'A dog ran.' 2>/dev/null",
           KITE_EXAMPLES_DIR, g_target);
  char *emb = run_command(cmd, &status);
  REQUIRE(emb != NULL && status == 0, "embed failed (%d)", status);
  CHECK(strstr(emb, "512 dims, norm 1.0000") != NULL && strstr(emb, "text 1:") != NULL &&
            strstr(emb, " 1.0000") != NULL,
        "embed printed '%s'", emb);
  free(emb);

  /* The C++ example's own decode loop, seeded: the same output twice. */
  snprintf(cmd, sizeof cmd, "'%s/kite-example-decode-loop' '%s' 'ROMEO:' 24 7 2>/dev/null", KITE_EXAMPLES_DIR,
           g_draft_gguf);
  char *l1 = run_command(cmd, &status);
  REQUIRE(l1 != NULL && status == 0, "decode_loop failed (%d)", status);
  char *l2 = run_command(cmd, &status);
  CHECK(l2 != NULL && strcmp(l1, l2) == 0 && strncmp(l1, "ROMEO:", 6) == 0 && strlen(l1) > 20,
        "decode_loop: '%s' then '%s'", l1, l2 ? l2 : "");
  free(l1);
  free(l2);
}

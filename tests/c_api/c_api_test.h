/* c_api_test.h — the harness the C API test files share (C11): CHECK/REQUIRE macros, the test
 * data paths and a few helpers (defined in test_c_api.c). */
#ifndef KITE_C_API_TEST_H
#define KITE_C_API_TEST_H

#include <kite.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

/* ------------------------------------------------------------------------------------------- */
/* A minimal harness: CHECK records a failure and goes on; REQUIRE ends the case.              */

extern int g_failures;

#define CHECK(cond, ...)                                             \
  do {                                                               \
    if (!(cond)) {                                                   \
      fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                  \
      fprintf(stderr, "\n");                                         \
      ++g_failures;                                                  \
    }                                                                \
  } while (0)

#define REQUIRE(cond, ...)   \
  do {                       \
    int before_ = g_failures; \
    CHECK(cond, __VA_ARGS__); \
    if (g_failures != before_) return; \
  } while (0)

#define REQUIRE_OK(call)                                                                       \
  do {                                                                                         \
    kite_status st_ = (call);                                                                  \
    REQUIRE(st_ == KITE_OK, "%s returned %s: %s", #call, kite_status_name(st_), kite_last_error()); \
  } while (0)

/* The call fails with `status` and kite_last_error() contains `needle`. */
#define CHECK_ERROR(call, status, needle)                                                         \
  do {                                                                                            \
    kite_status st_ = (call);                                                                     \
    CHECK(st_ == (status), "%s returned %s, expected %s (%s)", #call, kite_status_name(st_),      \
          kite_status_name(status), kite_last_error());                                          \
    CHECK(strstr(kite_last_error(), (needle)) != NULL, "%s: message '%s' does not mention '%s'", #call, \
          kite_last_error(), (needle));                                                           \
  } while (0)

extern char g_target[1024], g_draft_gguf[1024], g_stories[1024], g_reference[1024];
extern const char kPrompt0[];

const char *path_of(char *buf, size_t cap, const char *fmt, ...);
char *read_all(const char *path, size_t *size);
/* The numbers of the first JSON array after `"key": [` in `json` (no nesting). */
size_t json_numbers(const char *json, const char *key, double *out, size_t cap);
/* Runs a command and returns its stdout (malloc'd) and exit status. */
char *run_command(const char *cmd, int *status);
kite_model *load(const char *path);
kite_context *new_context(kite_model *m, int32_t n_ctx);

/* Collects what kite_generate streams. */
typedef struct {
  int32_t tokens[512];
  int n;
  char text[8192];
  size_t len;
  int stop_after; /* return false after this many tokens (0: never) */
  atomic_int seen;
  bool order_ok;
} Stream;

bool on_token(const char *piece, size_t len, int32_t token, void *user);

/* Cases in test_c_api_more.c. */
void test_embed(void);
void test_state(void);
void test_chat_template(void);
void test_log(void);
void test_errors(void);
void test_examples(void);
/* In test_c_api_device.c. */
void test_placement(void);

#endif /* KITE_C_API_TEST_H */

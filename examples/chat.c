/* chat.c — a multi-turn chat through the model's chat template, one user turn per stdin line.
 *
 *   chat MODEL [SYSTEM_PROMPT] < turns.txt
 *
 * Each turn renders the whole conversation with kite_chat_apply_template and generates the reply
 * (streamed to stdout, one "assistant: ..." line per turn). The prefix cache makes each turn
 * compute only the new tokens. Sampling is seeded, so a script of turns replays the same way. */
#define _POSIX_C_SOURCE 200809L /* strdup */
#include <kite.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { kMaxMessages = 64, kMaxLine = 4096 };

typedef struct {
  char *text;
  size_t len, cap;
} Buffer;

static bool append_piece(const char *piece, size_t len, int32_t token, void *user_data) {
  (void)token;
  Buffer *b = user_data;
  if (b->len + len + 1 > b->cap) {
    size_t cap = (b->cap + len + 1) * 2;
    char *p = realloc(b->text, cap);
    if (p == NULL) return false;
    b->text = p;
    b->cap = cap;
  }
  memcpy(b->text + b->len, piece, len);
  b->len += len;
  b->text[b->len] = '\0';
  fwrite(piece, 1, len, stdout);
  fflush(stdout);
  return true;
}

/* Renders the conversation and tokenizes it (BOS only when the template did not write it). */
static kite_status render(const kite_model *model, const kite_chat_message *msgs, size_t n, int32_t **tokens,
                          size_t *n_tokens) {
  size_t len = 0;
  kite_status st = kite_chat_apply_template(model, NULL, msgs, n, true, NULL, 0, &len);
  if (st != KITE_OK && st != KITE_ERROR_BUFFER_TOO_SMALL) return st;
  char *text = malloc(len + 1);
  if (text == NULL) return KITE_ERROR_OUT_OF_MEMORY;
  st = kite_chat_apply_template(model, NULL, msgs, n, true, text, len + 1, &len);
  if (st == KITE_OK) {
    /* Does the text already begin with the BOS token? */
    bool has_bos = false;
    char bos[64];
    size_t bos_len = 0;
    if (kite_token_bos(model) >= 0 && kite_token_to_piece(model, kite_token_bos(model), bos, sizeof bos, &bos_len) == KITE_OK)
      has_bos = bos_len > 0 && len >= bos_len && memcmp(text, bos, bos_len) == 0;
    st = kite_tokenize(model, text, len, !has_bos, true, NULL, 0, n_tokens);
    if (st == KITE_OK || st == KITE_ERROR_BUFFER_TOO_SMALL) {
      *tokens = malloc(*n_tokens * sizeof **tokens);
      st = *tokens == NULL ? KITE_ERROR_OUT_OF_MEMORY
                           : kite_tokenize(model, text, len, !has_bos, true, *tokens, *n_tokens, n_tokens);
    }
  }
  free(text);
  return st;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s MODEL [SYSTEM_PROMPT] < turns\n", argv[0]);
    return 2;
  }
  kite_model *model = NULL;
  kite_context *ctx = NULL;
  kite_chat_message msgs[kMaxMessages];
  size_t n_msgs = 0;
  int rc = 1;
  if (kite_model_load(argv[1], NULL, &model) != KITE_OK) goto done;
  if (kite_context_new(model, NULL, &ctx) != KITE_OK) goto done;
  if (argc > 2) msgs[n_msgs++] = (kite_chat_message){"system", strdup(argv[2])};

  char line[kMaxLine];
  while (fgets(line, sizeof line, stdin) != NULL) {
    line[strcspn(line, "\r\n")] = '\0';
    if (line[0] == '\0') continue;
    if (n_msgs + 2 > kMaxMessages) {
      fprintf(stderr, "chat: the conversation is full (%d messages)\n", kMaxMessages);
      break;
    }
    msgs[n_msgs++] = (kite_chat_message){"user", strdup(line)};
    int32_t *tokens = NULL;
    size_t n_tokens = 0;
    if (render(model, msgs, n_msgs, &tokens, &n_tokens) != KITE_OK) {
      free(tokens);
      goto done;
    }
    Buffer reply = {NULL, 0, 0};
    kite_generate_params gp = kite_generate_default_params();
    gp.sampling.seed = 42;
    gp.max_tokens = 128;
    gp.on_token = append_piece;
    gp.user_data = &reply;
    fputs("assistant: ", stdout);
    kite_generate_result res;
    kite_status st = kite_generate(ctx, tokens, n_tokens, &gp, &res);
    free(tokens);
    printf("\n");
    if (st != KITE_OK) {
      free(reply.text);
      goto done;
    }
    fprintf(stderr, "chat: %d prompt tokens (%d cached), %d generated\n", res.n_prompt_tokens, res.n_cached_tokens,
            res.n_generated_tokens);
    msgs[n_msgs++] = (kite_chat_message){"assistant", reply.text != NULL ? reply.text : strdup("")};
  }
  rc = 0;

done:
  if (rc != 0) fprintf(stderr, "chat: %s\n", kite_last_error());
  for (size_t i = 0; i < n_msgs; ++i) free((char *)msgs[i].content);
  kite_context_free(ctx);
  kite_model_free(model);
  return rc;
}

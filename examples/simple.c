/* simple.c — load a model, tokenize a prompt, stream a greedy continuation to stdout.
 *
 *   simple MODEL [PROMPT] [N_PREDICT]
 *
 * MODEL is a GGUF file or a Hugging Face folder. Prints the prompt and its continuation (up to
 * N_PREDICT tokens, default 64, stopping at the model's end of text); logs go to stderr. */
#include <kite.h>
#include <stdio.h>
#include <stdlib.h>

static bool print_piece(const char *piece, size_t len, int32_t token, void *user_data) {
  (void)token;
  (void)user_data;
  fwrite(piece, 1, len, stdout);
  fflush(stdout);
  return true;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s MODEL [PROMPT] [N_PREDICT]\n", argv[0]);
    return 2;
  }
  const char *prompt = argc > 2 ? argv[2] : "Once upon a time";
  const int n_predict = argc > 3 ? atoi(argv[3]) : 64;

  kite_model *model = NULL;
  kite_context *ctx = NULL;
  int32_t *tokens = NULL;
  int rc = 1;
  if (kite_model_load(argv[1], NULL, &model) != KITE_OK) goto done;
  if (kite_context_new(model, NULL, &ctx) != KITE_OK) goto done;

  /* Ask for the size first, then tokenize into a buffer that fits. */
  size_t n_tokens = 0;
  kite_status st = kite_tokenize(model, prompt, (size_t)-1, true, false, NULL, 0, &n_tokens);
  if (st != KITE_OK && st != KITE_ERROR_BUFFER_TOO_SMALL) goto done;
  tokens = malloc(n_tokens * sizeof *tokens);
  if (tokens == NULL || kite_tokenize(model, prompt, (size_t)-1, true, false, tokens, n_tokens, &n_tokens) != KITE_OK)
    goto done;

  kite_generate_params gp = kite_generate_default_params();
  gp.sampling.temperature = 0.0f; /* greedy: the same output every run */
  gp.max_tokens = n_predict;
  gp.on_token = print_piece;
  fputs(prompt, stdout);
  kite_generate_result res;
  if (kite_generate(ctx, tokens, n_tokens, &gp, &res) != KITE_OK) goto done;
  printf("\n");
  fprintf(stderr, "simple: %d prompt tokens, %d generated\n", res.n_prompt_tokens, res.n_generated_tokens);
  rc = 0;

done:
  if (rc != 0) fprintf(stderr, "simple: %s\n", kite_last_error());
  free(tokens);
  kite_context_free(ctx);
  kite_model_free(model);
  return rc;
}

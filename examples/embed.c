/* embed.c — sentence embeddings and their cosine similarities.
 *
 *   embed MODEL TEXT [TEXT ...]
 *
 * Prints, for each text, its dimension count, L2 norm and first values (mean pooling,
 * normalized), then the matrix of cosine similarities (dot products of the unit vectors). */
#include <kite.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s MODEL TEXT [TEXT ...]\n", argv[0]);
    return 2;
  }
  const int n_texts = argc - 2;
  kite_model *model = NULL;
  kite_context *ctx = NULL;
  float *vectors = NULL;
  int rc = 1;
  if (kite_model_load(argv[1], NULL, &model) != KITE_OK) goto done;
  kite_context_params cp = kite_context_default_params();
  cp.n_ctx = 512;
  if (kite_context_new(model, &cp, &ctx) != KITE_OK) goto done;
  const size_t n_embd = (size_t)kite_model_n_embd(model);
  vectors = malloc((size_t)n_texts * n_embd * sizeof *vectors);
  if (vectors == NULL) goto done;

  for (int i = 0; i < n_texts; ++i) {
    int32_t tokens[512];
    size_t n_tokens = 0;
    if (kite_tokenize(model, argv[i + 2], (size_t)-1, true, false, tokens, 512, &n_tokens) != KITE_OK) goto done;
    float *v = vectors + (size_t)i * n_embd;
    size_t dims = 0;
    if (kite_embed(ctx, tokens, n_tokens, KITE_POOLING_MEAN, true, v, n_embd, &dims) != KITE_OK) goto done;
    double norm = 0;
    for (size_t d = 0; d < dims; ++d) norm += (double)v[d] * v[d];
    printf("text %d: %zu tokens, %zu dims, norm %.4f, first [%.4f %.4f %.4f]\n", i, n_tokens, dims, sqrt(norm), v[0],
           v[1], v[2]);
  }
  printf("cosine similarity:\n");
  for (int i = 0; i < n_texts; ++i) {
    for (int j = 0; j < n_texts; ++j) {
      double dot = 0;
      for (size_t d = 0; d < n_embd; ++d) dot += (double)vectors[(size_t)i * n_embd + d] * vectors[(size_t)j * n_embd + d];
      printf(" %7.4f", dot);
    }
    printf("\n");
  }
  rc = 0;

done:
  if (rc != 0) fprintf(stderr, "embed: %s\n", kite_last_error());
  free(vectors);
  kite_context_free(ctx);
  kite_model_free(model);
  return rc;
}

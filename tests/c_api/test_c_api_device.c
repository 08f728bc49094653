/* test_c_api_device.c — the C API test, continued: choosing the compute device and the layer
 * split (kite_context_params.device, .gpu_layers and .tensor_parallel, kite_device_name). On the CPU a split runs
 * over two CPU backends, whose logits must be bitwise the unsplit ones. */
#include <math.h>
#include <stdlib.h>

#include "c_api_test.h"

enum { kMaxVocab = 4096 };

/* A context made with `p` decodes `ids` into sequence 0; the last token's logits go to `out`. */
static kite_status last_logits(kite_model* m, const kite_context_params* p, const int32_t* ids, size_t n, float* out) {
  kite_context* c = NULL;
  kite_status st = kite_context_new(m, p, &c);
  if (st != KITE_OK) return st;
  kite_batch* b = NULL;
  st = kite_batch_new(n, &b);
  for (size_t i = 0; i < n && st == KITE_OK; ++i) st = kite_batch_add(b, ids[i], 0, i + 1 == n);
  if (st == KITE_OK) st = kite_decode(c, b);
  const float* l = st == KITE_OK ? kite_get_logits(c, -1) : NULL;
  if (l != NULL) memcpy(out, l, (size_t)kite_model_n_vocab(m) * sizeof(float));
  if (st == KITE_OK && l == NULL) st = KITE_ERROR_FAILED;
  kite_batch_free(b);
  kite_context_free(c);
  return st;
}

/* Greedy kite_generate of 16 tokens in a context made with `p`; the text goes to `s`. */
static kite_status generate(kite_model* m, const kite_context_params* p, const int32_t* ids, size_t n, Stream* s) {
  kite_context* c = NULL;
  kite_status st = kite_context_new(m, p, &c);
  if (st != KITE_OK) return st;
  memset(s, 0, sizeof *s);
  s->order_ok = true;
  kite_generate_params gp = kite_generate_default_params();
  gp.sampling.temperature = 0.f;
  gp.max_tokens = 16;
  gp.ignore_eos = true;
  gp.on_token = on_token;
  gp.user_data = s;
  st = kite_generate(c, ids, n, &gp, NULL);
  kite_context_free(c);
  return st;
}

void test_placement(void) {
  /* The devices of this build, "cpu" last. */
  size_t n_dev = 0;
  bool has_cuda = false;
  for (; kite_device_name(n_dev) != NULL; ++n_dev) has_cuda = has_cuda || strcmp(kite_device_name(n_dev), "cuda") == 0;
  REQUIRE(n_dev >= 1 && strcmp(kite_device_name(n_dev - 1), "cpu") == 0, "%zu devices, the last '%s'", n_dev,
          n_dev > 0 ? kite_device_name(n_dev - 1) : "");
  CHECK(kite_device_name((size_t)-1) == NULL, "no device past the end");

  kite_model* m = load(g_draft_gguf);
  REQUIRE(m != NULL, "model");
  const int32_t n_layer = kite_model_n_layer(m), n_vocab = kite_model_n_vocab(m);
  REQUIRE(n_layer >= 2 && n_vocab > 0 && n_vocab <= kMaxVocab, "%d layers, %d tokens", n_layer, n_vocab);

  kite_context_params p = kite_context_default_params();
  CHECK(p.gpu_layers == -1 && p.device != NULL && strcmp(p.device, "cpu") == 0, "defaults: gpu_layers %d, device %s",
        p.gpu_layers, p.device ? p.device : "NULL");

  /* Bad values are KITE_ERROR_INVALID_ARGUMENT naming the field; no context comes out. */
  kite_context* c = NULL;
  p.gpu_layers = -3;
  CHECK_ERROR(kite_context_new(m, &p, &c), KITE_ERROR_INVALID_ARGUMENT,
              "gpu_layers must be -1 (every layer on the device), -2 (as many as fit), 0 (none) or a layer count, "
              "got -3");
  p.gpu_layers = INT32_MIN;
  CHECK_ERROR(kite_context_new(m, &p, &c), KITE_ERROR_INVALID_ARGUMENT, "gpu_layers");
  p = kite_context_default_params();
  p.device = "abacus";
  CHECK_ERROR(kite_context_new(m, &p, &c), KITE_ERROR_INVALID_ARGUMENT, "device 'abacus' is not one this build has");
  CHECK(strstr(kite_last_error(), "cpu") != NULL, "the message lists the devices: %s", kite_last_error());
  p.device = "";
  CHECK_ERROR(kite_context_new(m, &p, &c), KITE_ERROR_INVALID_ARGUMENT, "device ''");
  /* Tensor parallelism: 1 rank by default; 0 is invalid; this model's one KV head does not split. */
  p = kite_context_default_params();
  CHECK(p.tensor_parallel == 1, "default tensor_parallel %d", p.tensor_parallel);
  p.tensor_parallel = 0;
  CHECK_ERROR(kite_context_new(m, &p, &c), KITE_ERROR_INVALID_ARGUMENT, "tensor_parallel must be >= 1, got 0");
  p.tensor_parallel = 2;
  CHECK_ERROR(kite_context_new(m, &p, &c), KITE_ERROR_FAILED, "KV heads (1) is not divisible by 2");
  CHECK(c == NULL, "no context");

  int32_t ids[64];
  size_t n = 0;
  REQUIRE_OK(kite_tokenize(m, "ROMEO: what light through yonder window breaks?", (size_t)-1, true, false, ids, 64, &n));
  static float ref[kMaxVocab], got[kMaxVocab];
  p = kite_context_default_params();
  p.n_ctx = 128;
  p.n_threads = 2;
  REQUIRE_OK(last_logits(m, &p, ids, n, ref));

  /* Every split on the CPU gives the unsplit logits, bit for bit (auto: the CPU has no memory of its own to fit:
   * the whole model); NULL device means "cpu". */
  const int32_t splits[] = {0, 1, n_layer - 1, n_layer, n_layer + 3, KITE_GPU_LAYERS_AUTO};
  for (size_t i = 0; i < sizeof splits / sizeof splits[0]; ++i) {
    p.gpu_layers = splits[i];
    p.device = i % 2 ? NULL : "cpu";
    memset(got, 0, sizeof got);
    kite_status st = last_logits(m, &p, ids, n, got);
    CHECK(st == KITE_OK, "gpu_layers %d: %s: %s", splits[i], kite_status_name(st), kite_last_error());
    CHECK(memcmp(got, ref, (size_t)n_vocab * sizeof(float)) == 0, "gpu_layers %d: logits differ from the unsplit ones",
          splits[i]);
  }

  /* kite_generate (the scheduler) through a split context: the same greedy text. */
  static Stream whole, split;
  p.device = "cpu";
  p.gpu_layers = -1;
  REQUIRE_OK(generate(m, &p, ids, n, &whole));
  p.gpu_layers = 1;
  REQUIRE_OK(generate(m, &p, ids, n, &split));
  CHECK(whole.n >= 16 && split.n == whole.n && strcmp(whole.text, split.text) == 0,
        "generate: %d tokens '%s' unsplit, %d tokens '%s' with gpu_layers 1", whole.n, whole.text, split.n, split.text);

  /* CUDA builds: gpu_layers 0 never opens the device; a split on it runs (a GPU) or says why. */
  if (has_cuda) {
    p.device = "cuda";
    p.gpu_layers = 0;
    REQUIRE_OK(last_logits(m, &p, ids, n, got));
    CHECK(memcmp(got, ref, (size_t)n_vocab * sizeof(float)) == 0, "cuda, gpu_layers 0: the CPU's logits");
    p.gpu_layers = 1;
    const kite_status st = last_logits(m, &p, ids, n, got);
    if (st == KITE_OK) {
      double num = 0, den = 0;
      for (int32_t i = 0; i < n_vocab; ++i) num += (got[i] - ref[i]) * (got[i] - ref[i]), den += ref[i] * ref[i];
      CHECK(num / den < 1e-4, "cuda, gpu_layers 1: logits nmse %g against the CPU's", num / den);
    } else {
      CHECK(st == KITE_ERROR_FAILED && strstr(kite_last_error(), "no CUDA device") != NULL,
            "cuda without a GPU: %s: %s", kite_status_name(st), kite_last_error());
    }
  }
  kite_model_free(m);
}

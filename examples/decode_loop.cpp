// decode_loop.cpp — the C API from C++: RAII handles and an app-driven decode loop
// (kite_batch + kite_decode + kite_get_logits + kite_sampler) instead of kite_generate.
//
//   decode_loop MODEL [PROMPT] [N_PREDICT] [SEED]
//
// Prints the prompt and a sampled continuation (temperature 0.8, top-k 40, the given seed).
#include <kite.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

struct Free {
  void operator()(kite_model* m) const { kite_model_free(m); }
  void operator()(kite_context* c) const { kite_context_free(c); }
  void operator()(kite_sampler* s) const { kite_sampler_free(s); }
  void operator()(kite_batch* b) const { kite_batch_free(b); }
};
template <class T>
using Handle = std::unique_ptr<T, Free>;

void check(kite_status st, const char* what) {
  if (st != KITE_OK) throw std::runtime_error(std::string(what) + ": " + kite_last_error());
}

std::vector<int32_t> tokenize(const kite_model* model, const std::string& text) {
  size_t n = 0;
  kite_status st = kite_tokenize(model, text.data(), text.size(), true, false, nullptr, 0, &n);
  if (st != KITE_ERROR_BUFFER_TOO_SMALL && st != KITE_OK) check(st, "tokenize");
  std::vector<int32_t> ids(n);
  check(kite_tokenize(model, text.data(), text.size(), true, false, ids.data(), ids.size(), &n), "tokenize");
  return ids;
}

std::string piece(const kite_model* model, int32_t token) {
  std::string s(16, '\0');
  size_t len = 0;
  if (kite_token_to_piece(model, token, s.data(), s.size(), &len) == KITE_ERROR_BUFFER_TOO_SMALL) {
    s.resize(len);
    check(kite_token_to_piece(model, token, s.data(), s.size(), &len), "token_to_piece");
  }
  s.resize(len);
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s MODEL [PROMPT] [N_PREDICT] [SEED]\n", argv[0]);
    return 2;
  }
  const std::string prompt = argc > 2 ? argv[2] : "Once upon a time";
  const int n_predict = argc > 3 ? std::atoi(argv[3]) : 48;
  try {
    kite_model* m = nullptr;
    check(kite_model_load(argv[1], nullptr, &m), "load");
    Handle<kite_model> model(m);
    kite_context* c = nullptr;
    check(kite_context_new(model.get(), nullptr, &c), "context");
    Handle<kite_context> ctx(c);
    kite_sampler_params sp = kite_sampler_default_params();
    sp.seed = argc > 4 ? std::strtoull(argv[4], nullptr, 10) : 1234;
    kite_sampler* s = nullptr;
    check(kite_sampler_new(&sp, &s), "sampler");
    Handle<kite_sampler> sampler(s);

    const std::vector<int32_t> ids = tokenize(model.get(), prompt);
    kite_batch* b = nullptr;
    check(kite_batch_new(ids.size() + 1, &b), "batch");
    Handle<kite_batch> batch(b);
    for (size_t i = 0; i < ids.size(); ++i)
      check(kite_batch_add(batch.get(), ids[i], 0, i + 1 == ids.size()), "batch_add");  // logits of the last only
    std::printf("%s", prompt.c_str());
    const int32_t n_vocab = kite_model_n_vocab(model.get());
    for (int i = 0; i < n_predict; ++i) {
      check(kite_decode(ctx.get(), batch.get()), "decode");
      const int32_t token = kite_sampler_sample(sampler.get(), kite_get_logits(ctx.get(), -1), n_vocab);
      if (token < 0) check(KITE_ERROR_FAILED, "sample");
      if (kite_token_is_eog(model.get(), token)) break;
      check(kite_sampler_accept(sampler.get(), token), "accept");
      const std::string text = piece(model.get(), token);
      std::fwrite(text.data(), 1, text.size(), stdout);
      std::fflush(stdout);
      kite_batch_clear(batch.get());
      check(kite_batch_add(batch.get(), token, 0, true), "batch_add");
    }
    std::printf("\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "decode_loop: %s\n", e.what());
    return 1;
  }
  return 0;
}

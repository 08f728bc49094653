// The test models made from the trained ones in the shared test data, as files, for making
// llama.cpp's reference numbers for them (tests/data/README.md):
//   build-cpu/tests/kite-make-model moe DENSE.gguf OUT.gguf     (tests/moe_model.h)
//   build-cpu/tests/kite-make-model gemma3 QWEN3.gguf OUT.gguf  (tests/gemma_model.h)
//   build-cpu/tests/kite-make-model gemma2 LLAMA.gguf OUT.gguf
#include <cstdio>
#include <cstring>

#include "tests/gemma_model.h"
#include "tests/moe_model.h"

int main(int argc, char** argv) {
  const bool moe = argc == 4 && std::strcmp(argv[1], "moe") == 0;
  const bool gemma = argc == 4 && (std::strcmp(argv[1], "gemma2") == 0 || std::strcmp(argv[1], "gemma3") == 0);
  if (!moe && !gemma) {
    std::fprintf(stderr, "usage: kite-make-model moe|gemma2|gemma3 IN.gguf OUT.gguf\n");
    return 2;
  }
  kite::test::GemmaOptions o;
  if (gemma) o.arch = argv[1];
  const kite::Status st =
      moe ? kite::test::upcycle_to_moe(argv[2], argv[3]) : kite::test::make_gemma(argv[2], argv[3], o);
  if (!st) {
    std::fprintf(stderr, "kite-make-model: %s\n", st.error().message.c_str());
    return 1;
  }
  return 0;
}

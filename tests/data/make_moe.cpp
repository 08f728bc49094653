// The mixture-of-experts test model (tests/moe_model.h) as a file, for making llama.cpp's
// reference numbers for it (tests/data/README.md):
//   build-cpu/tests/kite-make-moe DENSE.gguf OUT.gguf
#include <cstdio>

#include "tests/moe_model.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: kite-make-moe DENSE.gguf OUT.gguf\n");
    return 2;
  }
  if (kite::Status st = kite::test::upcycle_to_moe(argv[1], argv[2]); !st) {
    std::fprintf(stderr, "kite-make-moe: %s\n", st.error().message.c_str());
    return 1;
  }
  return 0;
}

// kite/tests/moe_model.h — a mixture-of-experts test model made from a trained dense one.
//
// The shared test data has no MoE model, so the MoE tests "upcycle" a dense GGUF (F16/F32
// tensors): every layer's FFN becomes n_expert experts, each the dense FFN with its output rows
// scaled by its own factors in [1 - spread, 1 + spread] (so the experts differ and the routing
// matters, while the text stays what the trained model says), and a router with uniform random
// weights whose logits spread about `router_std`. qwen3 becomes qwen3moe; llama stays llama
// with expert keys (Mixtral's layout). Deterministic (its own generator): the same input and
// options give the same bytes, so llama.cpp's numbers for the file can be kept
// (tests/data/README.md says how they were made; tests/data/make_model.cpp is the command line).
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "formats/quant/types.h"
#include "src/base/status.h"

namespace kite::test {

struct MoeUpcycle {
  int n_expert = 4;
  int n_used = 2;
  float spread = 0.25f;
  float router_std = 2.f;
  uint32_t seed = 1;
};

Status upcycle_to_moe(const std::string& dense_gguf, const std::string& out_gguf, const MoeUpcycle& o = {});

// A Hugging Face Qwen3-MoE folder holding the same weights as `moe_gguf` (a qwen3moe file
// upcycle_to_moe made; F16/F32 tensors kept as they are, each layer's experts apart under
// Qwen3-MoE's names): config.json from `dense_hf`'s with the expert keys, its tokenizer files.
Status moe_gguf_to_hf(const std::string& moe_gguf, const std::string& dense_hf, const std::string& out_dir);

// A safetensors file of F16/F32 tensors (ggml order shapes; written outermost first).
struct SafetensorsPiece {
  std::string name;
  quant::Type type;
  std::vector<int64_t> ne;
  const uint8_t* data;
  size_t bytes;
};
Status write_safetensors(const std::string& path, const std::vector<SafetensorsPiece>& pieces);

// (kite-tests only, test_moe.cpp.) tests/data/moe-reference.json, and the test model `name` of
// it made once per process (a path under the build tree); fails the test unless its bytes are
// those llama.cpp's numbers were measured on.
std::string moe_reference_path();
std::string moe_test_file(const std::string& name);

// (kite-tests only.) The test model `name` of the reference JSON at `reference_path` (its
// "fnv1a64" the file's FNV-1a 64 hash), made once per process by `make(path)` under the build
// tree; fails the test unless its bytes are those the reference measured.
std::string derived_test_file(const std::string& reference_path, const std::string& name,
                              const std::function<Status(const std::string& path)>& make);
// (kite-tests only.) `kite perplexity -m path -f heldout.txt -c 256`'s result, as the references'
// ppl_ctx256 were measured.
double kite_perplexity(const std::string& path);
// (kite-tests only.) That perplexity within 0.1% of the reference entry's ppl_ctx256 (llama.cpp's)
// and `kite run`'s 32 greedy tokens equal to its greedy32_output (llama-simple's).
void check_llama_cpp_numbers(const std::string& path, const std::string& name, const nlohmann::json& ref);

}  // namespace kite::test

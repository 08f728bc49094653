// kite/src/model/synthetic.h — real model shapes with random weights, for benchmarks that need
// no large files. The same model can be written as GGUF so llama.cpp runs the very same bytes.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "formats/memory_source.h"

namespace kite {

struct SyntheticShape {
  std::string name;  // "llama-1b"
  int64_t n_vocab, n_embd, n_layer, n_head, n_head_kv, n_ff;
  float rope_theta;
  std::string arch = "llama";  // llama; qwen2 (q/k/v biases); qwen3 (per-head q/k norms); qwen3moe; gemma3
  int64_t head_dim = 0;        // 0: n_embd / n_head
  // Mixture of experts (qwen3moe): n_expert experts of width n_ff_exp, n_expert_used a token.
  int64_t n_expert = 0, n_expert_used = 0, n_ff_exp = 0;
};

// llama-1b (Llama-3.2-1B's layers), llama-3b (Llama-3.2-3B's), both with a 32000-token vocabulary
// and an untied output matrix (the numbers in bench/RESULTS.md use these); llama-8b is
// Llama-3-8B exactly (vocabulary 128256, 32 layers, n_embd 4096, n_ff 14336, 32 heads, 8 KV
// heads); qwen2-7b is Qwen2.5-7B's shape (28 layers, n_embd 3584, 28 heads, 4 KV heads, q/k/v
// biases, vocabulary 152064) and qwen3-8b Qwen3-8B's (36 layers, n_embd 4096, 32 heads, 8 KV
// heads, per-head q/k norms, vocabulary 151936), both untied and with the placeholder vocabulary
// below; qwen3-30b-a3b is Qwen3-30B-A3B's (48 layers, n_embd 2048, 32 heads of 128, 4 KV heads,
// 128 experts of width 768, 8 a token; the router F32 as llama-quantize leaves it; 30.5B
// weights, 3.3B active a token); gemma3-4b is Gemma-3-4B's text model (34 layers, n_embd 2560, 8
// heads of 256, 4 KV heads, n_ff 10240, vocabulary 262208, tied embedding, 1024-position sliding
// windows on 5 of every 6 layers); plus "tiny" for tests.
const std::vector<SyntheticShape>& synthetic_shapes();

// A synthetic model without its bytes: the tensors' names, shapes (ggml order), types and sizes
// (TensorInfo::data is null), in file order. Cheap for every shape (tests check the 8B one).
struct SyntheticPlan {
  const SyntheticShape* shape = nullptr;
  std::string name;  // "synthetic-llama-8b-q4_K_M"
  std::vector<gguf::TensorInfo> tensors;
  uint64_t total_bytes = 0;
};

// `type` names the weights' types:
//   - a ggml type ("q4_0", "q8_0", "q4_K", "f16", ...): every matrix in that type, the token
//     embedding and the output matrix included (llama-quantize --pure);
//   - a llama.cpp file type that is not a type name ("q4_K_M", "q5_K_M", "q3_K_L", "q4_K_S",
//     ...): its per-tensor rules, the ones `kite quantize` applies (formats/quant_mix.h): for
//     Q4_K_M, output.weight Q6_K and attn_v / ffn_down Q6_K in llama.cpp's use_more_bits layers.
// Norms are F32 either way. Errors name an unknown shape or type and list the known ones.
Result<SyntheticPlan> plan_synthetic(std::string_view shape, std::string_view type);

// Builds the planned model with a placeholder SPM vocabulary. Rows are random N(0, 0.02) values:
// 64 rows per type and row length, quantized once and repeated through every matrix of that
// kind (speed does not depend on the values, and quantizing billions of weights would dominate
// the benchmark's start-up). Deterministic for a seed.
Result<std::unique_ptr<MemorySource>> make_synthetic(std::string_view shape, std::string_view type, uint64_t seed = 1);

}  // namespace kite

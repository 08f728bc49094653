#include "src/model/synthetic.h"

#include <cstring>
#include <random>

namespace kite {

const std::vector<SyntheticShape>& synthetic_shapes() {
  static const std::vector<SyntheticShape> shapes = {
      {"tiny", 512, 128, 2, 4, 2, 384, 10000.f},
      {"llama-1b", 32000, 2048, 16, 32, 8, 8192, 500000.f},
      {"llama-3b", 32000, 3072, 28, 24, 8, 8192, 500000.f},
      {"llama-8b", 32000, 4096, 32, 32, 8, 14336, 500000.f},
  };
  return shapes;
}

namespace {

constexpr int kDistinctRows = 64;

// Fills a matrix [ne0, rows] of `type` with kDistinctRows random rows repeated.
Status fill_matrix(uint8_t* dst, quant::Type type, int64_t ne0, int64_t rows, std::mt19937_64& rng) {
  KITE_ASSIGN_OR_RETURN(size_t row_bytes, quant::row_size(type, ne0));
  std::normal_distribution<float> dist(0.f, 0.02f);
  std::vector<float> f(static_cast<size_t>(ne0));
  const int64_t distinct = std::min<int64_t>(rows, kDistinctRows);
  for (int64_t r = 0; r < distinct; ++r) {
    for (float& x : f) x = dist(rng);
    KITE_TRY(quant::quantize_row(type, f.data(), dst + static_cast<size_t>(r) * row_bytes, ne0));
  }
  for (int64_t r = distinct; r < rows; ++r)
    std::memcpy(dst + static_cast<size_t>(r) * row_bytes, dst + static_cast<size_t>(r % distinct) * row_bytes, row_bytes);
  return ok_status();
}

}  // namespace

Result<std::unique_ptr<MemorySource>> make_synthetic(std::string_view shape_name, quant::Type type, uint64_t seed) {
  const SyntheticShape* s = nullptr;
  std::string known;
  for (const auto& sh : synthetic_shapes()) {
    if (sh.name == shape_name) s = &sh;
    known += (known.empty() ? "" : ", ") + sh.name;
  }
  if (s == nullptr) return make_error("unknown synthetic model '", shape_name, "' (known: ", known, ")");
  const quant::TypeTraits* tr = quant::find_traits(type);
  if (tr == nullptr || tr->quantize == nullptr) return make_error("cannot make weights of type ", tr ? tr->name : "?");

  auto src = std::make_unique<MemorySource>("synthetic-" + s->name + "-" + std::string(tr->name));
  gguf::Metadata& m = src->metadata();
  using gguf::Value;
  m.set("general.architecture", "llama");
  m.set("general.name", src->path());
  m.set("llama.context_length", uint32_t{8192});
  m.set("llama.embedding_length", static_cast<uint32_t>(s->n_embd));
  m.set("llama.block_count", static_cast<uint32_t>(s->n_layer));
  m.set("llama.feed_forward_length", static_cast<uint32_t>(s->n_ff));
  m.set("llama.attention.head_count", static_cast<uint32_t>(s->n_head));
  m.set("llama.attention.head_count_kv", static_cast<uint32_t>(s->n_head_kv));
  m.set("llama.rope.freq_base", s->rope_theta);
  m.set("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  m.set("llama.rope.dimension_count", static_cast<uint32_t>(s->n_embd / s->n_head));
  m.set("llama.vocab_size", static_cast<uint32_t>(s->n_vocab));
  // A placeholder SentencePiece vocabulary so llama.cpp loads the file: specials, 256 byte
  // tokens, then numbered pieces.
  gguf::Array tokens{gguf::ValueType::STRING, {}}, scores{gguf::ValueType::F32, {}}, types{gguf::ValueType::I32, {}};
  for (int64_t i = 0; i < s->n_vocab; ++i) {
    std::string t;
    int32_t ty = 1;
    if (i == 0) t = "<unk>", ty = 2;
    else if (i == 1) t = "<s>", ty = 3;
    else if (i == 2) t = "</s>", ty = 3;
    else if (i < 3 + 256) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "<0x%02X>", static_cast<int>(i - 3));
      t = buf, ty = 6;
    } else {
      t = "\xe2\x96\x81t" + std::to_string(i);
    }
    tokens.items.emplace_back(std::move(t));
    scores.items.emplace_back(-static_cast<float>(i));
    types.items.emplace_back(ty);
  }
  m.set("tokenizer.ggml.model", "llama");
  m.set("tokenizer.ggml.tokens", std::move(tokens));
  m.set("tokenizer.ggml.scores", std::move(scores));
  m.set("tokenizer.ggml.token_type", std::move(types));
  m.set("tokenizer.ggml.bos_token_id", uint32_t{1});
  m.set("tokenizer.ggml.eos_token_id", uint32_t{2});
  m.set("tokenizer.ggml.unknown_token_id", uint32_t{0});

  std::mt19937_64 rng(seed);
  const int64_t hd = s->n_embd / s->n_head;
  auto matrix = [&](const std::string& name, int64_t ne0, int64_t ne1) -> Status {
    KITE_ASSIGN_OR_RETURN(uint8_t * p, src->add_tensor(name, type, {ne0, ne1}));
    return fill_matrix(p, type, ne0, ne1, rng);
  };
  auto ones = [&](const std::string& name, int64_t n) -> Status {
    KITE_ASSIGN_OR_RETURN(uint8_t * p, src->add_tensor(name, quant::Type::F32, {n}));
    auto* f = reinterpret_cast<float*>(p);
    for (int64_t i = 0; i < n; ++i) f[i] = 1.f;
    return ok_status();
  };
  KITE_TRY(matrix("token_embd.weight", s->n_embd, s->n_vocab));
  for (int64_t l = 0; l < s->n_layer; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    KITE_TRY(ones(b + "attn_norm.weight", s->n_embd));
    KITE_TRY(matrix(b + "attn_q.weight", s->n_embd, s->n_head * hd));
    KITE_TRY(matrix(b + "attn_k.weight", s->n_embd, s->n_head_kv * hd));
    KITE_TRY(matrix(b + "attn_v.weight", s->n_embd, s->n_head_kv * hd));
    KITE_TRY(matrix(b + "attn_output.weight", s->n_head * hd, s->n_embd));
    KITE_TRY(ones(b + "ffn_norm.weight", s->n_embd));
    KITE_TRY(matrix(b + "ffn_gate.weight", s->n_embd, s->n_ff));
    KITE_TRY(matrix(b + "ffn_up.weight", s->n_embd, s->n_ff));
    KITE_TRY(matrix(b + "ffn_down.weight", s->n_ff, s->n_embd));
  }
  KITE_TRY(ones("output_norm.weight", s->n_embd));
  KITE_TRY(matrix("output.weight", s->n_embd, s->n_vocab));
  return src;
}

}  // namespace kite

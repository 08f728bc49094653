#include "src/model/synthetic.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <random>

#include "formats/quant_mix.h"

namespace kite {

const std::vector<SyntheticShape>& synthetic_shapes() {
  static const std::vector<SyntheticShape> shapes = {
      {"tiny", 512, 128, 2, 4, 2, 384, 10000.f},
      {"llama-1b", 32000, 2048, 16, 32, 8, 8192, 500000.f},
      {"llama-3b", 32000, 3072, 28, 24, 8, 8192, 500000.f},
      {"llama-8b", 128256, 4096, 32, 32, 8, 14336, 500000.f},
      {"qwen2-7b", 152064, 3584, 28, 28, 4, 18944, 1000000.f, "qwen2"},
      {"qwen3-8b", 151936, 4096, 36, 32, 8, 12288, 1000000.f, "qwen3"},
      {"qwen3-30b-a3b", 151936, 2048, 48, 32, 4, 6144, 1000000.f, "qwen3moe", 128, 128, 8, 768},
      {"gemma3-4b", 262208, 2560, 34, 8, 4, 10240, 1000000.f, "gemma3", 256},
  };
  return shapes;
}

namespace {

constexpr int kDistinctRows = 64;

// The hyperparameters under GGUF's keys for the shape's architecture (what plan_types and the
// model loader read).
void set_hparams(gguf::Metadata& m, const SyntheticShape& s, const std::string& name) {
  const std::string a = s.arch + ".";
  m.set("general.architecture", s.arch);
  m.set("general.name", name);
  m.set(a + "context_length", uint32_t{8192});
  m.set(a + "embedding_length", static_cast<uint32_t>(s.n_embd));
  m.set(a + "block_count", static_cast<uint32_t>(s.n_layer));
  m.set(a + "feed_forward_length", static_cast<uint32_t>(s.n_ff));
  m.set(a + "attention.head_count", static_cast<uint32_t>(s.n_head));
  m.set(a + "attention.head_count_kv", static_cast<uint32_t>(s.n_head_kv));
  m.set(a + "rope.freq_base", s.rope_theta);
  m.set(a + "attention.layer_norm_rms_epsilon", 1e-5f);
  const int64_t hd = s.head_dim > 0 ? s.head_dim : s.n_embd / s.n_head;
  m.set(a + "rope.dimension_count", static_cast<uint32_t>(hd));
  m.set(a + "attention.key_length", static_cast<uint32_t>(hd));
  m.set(a + "attention.value_length", static_cast<uint32_t>(hd));
  m.set(a + "vocab_size", static_cast<uint32_t>(s.n_vocab));
  if (s.arch == "gemma3") {  // (Gemma 3's: 1024-position windows, 5 of every 6 layers; rope x8 on the others)
    m.set(a + "attention.sliding_window", uint32_t{1024});
    m.set(a + "rope.scaling.type", std::string("linear"));
    m.set(a + "rope.scaling.factor", 8.f);
    m.set(a + "attention.layer_norm_rms_epsilon", 1e-6f);
  }
  if (s.n_expert > 0) {
    m.set(a + "expert_count", static_cast<uint32_t>(s.n_expert));
    m.set(a + "expert_used_count", static_cast<uint32_t>(s.n_expert_used));
    m.set(a + "expert_feed_forward_length", static_cast<uint32_t>(s.n_ff_exp));
  }
}

// A placeholder SentencePiece vocabulary so llama.cpp loads the file: specials, 256 byte
// tokens, then numbered pieces.
void set_vocab(gguf::Metadata& m, int64_t n_vocab) {
  gguf::Array tokens{gguf::ValueType::STRING, {}}, scores{gguf::ValueType::F32, {}}, types{gguf::ValueType::I32, {}};
  tokens.items.reserve(static_cast<size_t>(n_vocab));
  scores.items.reserve(static_cast<size_t>(n_vocab));
  types.items.reserve(static_cast<size_t>(n_vocab));
  for (int64_t i = 0; i < n_vocab; ++i) {
    std::string t;
    int32_t ty = 1;
    if (i == 0)
      t = "<unk>", ty = 2;
    else if (i == 1)
      t = "<s>", ty = 3;
    else if (i == 2)
      t = "</s>", ty = 3;
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
}

// The tensors of a llama model (and qwen2's biases, qwen3's head norms, qwen3moe's experts) in
// GGUF order; matrices get `matrix_type`, norms, biases and MoE routers F32.
std::vector<gguf::TensorInfo> llama_tensors(const SyntheticShape& s, quant::Type matrix_type) {
  std::vector<gguf::TensorInfo> ts;
  const int64_t hd = s.head_dim > 0 ? s.head_dim : s.n_embd / s.n_head;
  auto add = [&](std::string name, std::vector<int64_t> ne) {
    gguf::TensorInfo t;
    t.name = std::move(name);
    t.type = ne.size() == 1 || t.name.find("ffn_gate_inp") != std::string::npos ? quant::Type::F32 : matrix_type;
    t.ne = std::move(ne);
    ts.push_back(std::move(t));
  };
  add("token_embd.weight", {s.n_embd, s.n_vocab});
  for (int64_t l = 0; l < s.n_layer; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    add(b + "attn_norm.weight", {s.n_embd});
    add(b + "attn_q.weight", {s.n_embd, s.n_head * hd});
    add(b + "attn_k.weight", {s.n_embd, s.n_head_kv * hd});
    add(b + "attn_v.weight", {s.n_embd, s.n_head_kv * hd});
    if (s.arch == "qwen2") {
      add(b + "attn_q.bias", {s.n_head * hd});
      add(b + "attn_k.bias", {s.n_head_kv * hd});
      add(b + "attn_v.bias", {s.n_head_kv * hd});
    } else if (s.arch == "qwen3" || s.arch == "qwen3moe" || s.arch == "gemma3") {
      add(b + "attn_q_norm.weight", {hd});
      add(b + "attn_k_norm.weight", {hd});
    }
    add(b + "attn_output.weight", {s.n_head * hd, s.n_embd});
    if (s.arch == "gemma3") add(b + "post_attention_norm.weight", {s.n_embd});
    add(b + "ffn_norm.weight", {s.n_embd});
    if (s.n_expert > 0) {
      add(b + "ffn_gate_inp.weight", {s.n_embd, s.n_expert});
      add(b + "ffn_gate_exps.weight", {s.n_embd, s.n_ff_exp, s.n_expert});
      add(b + "ffn_up_exps.weight", {s.n_embd, s.n_ff_exp, s.n_expert});
      add(b + "ffn_down_exps.weight", {s.n_ff_exp, s.n_embd, s.n_expert});
      continue;
    }
    add(b + "ffn_gate.weight", {s.n_embd, s.n_ff});
    add(b + "ffn_up.weight", {s.n_embd, s.n_ff});
    add(b + "ffn_down.weight", {s.n_ff, s.n_embd});
    if (s.arch == "gemma3") add(b + "post_ffw_norm.weight", {s.n_embd});
  }
  add("output_norm.weight", {s.n_embd});
  if (s.arch != "gemma3") add("output.weight", {s.n_embd, s.n_vocab});  // (gemma3's LM head is the embedding)
  return ts;
}

// kDistinctRows random N(0, 0.02) rows of `type`, quantized once per (type, row length) and
// shared by every matrix of that kind: quantizing is the slow part of building a model (kite's
// reference quantizers search), and speed does not depend on the values.
class RowPool {
 public:
  explicit RowPool(uint64_t seed) : rng_(seed) {}

  Result<const std::vector<uint8_t>*> rows(quant::Type type, int64_t ne0) {
    auto& block = pool_[{type, ne0}];
    if (!block.empty()) return &block;
    KITE_ASSIGN_OR_RETURN(size_t row_bytes, quant::row_size(type, ne0));
    std::normal_distribution<float> dist(0.f, 0.02f);
    std::vector<float> f(static_cast<size_t>(ne0));
    block.resize(row_bytes * kDistinctRows);
    for (int r = 0; r < kDistinctRows; ++r) {
      for (float& x : f) x = dist(rng_);
      KITE_TRY(quant::quantize_row(type, f.data(), block.data() + static_cast<size_t>(r) * row_bytes, ne0));
    }
    return &block;
  }

 private:
  std::mt19937_64 rng_;
  std::map<std::pair<quant::Type, int64_t>, std::vector<uint8_t>> pool_;
};

// Fills a matrix [ne0, rows] of `type` with the pool's rows, repeated.
Status fill_matrix(uint8_t* dst, quant::Type type, int64_t ne0, int64_t rows, RowPool& pool) {
  KITE_ASSIGN_OR_RETURN(const std::vector<uint8_t>* block, pool.rows(type, ne0));
  const size_t row_bytes = block->size() / kDistinctRows;
  for (int64_t r = 0; r < rows; r += kDistinctRows) {
    const int64_t n = std::min<int64_t>(kDistinctRows, rows - r);
    std::memcpy(dst + static_cast<size_t>(r) * row_bytes, block->data(), static_cast<size_t>(n) * row_bytes);
  }
  return ok_status();
}

}  // namespace

Result<SyntheticPlan> plan_synthetic(std::string_view shape_name, std::string_view type) {
  SyntheticPlan plan;
  std::string known;
  for (const auto& sh : synthetic_shapes()) {
    if (sh.name == shape_name) plan.shape = &sh;
    known += (known.empty() ? "" : ", ") + sh.name;
  }
  if (plan.shape == nullptr) return make_error("unknown synthetic model '", shape_name, "' (known: ", known, ")");
  const SyntheticShape& s = *plan.shape;

  if (const quant::TypeTraits* tr = quant::find_traits(type)) {  // one type for every matrix
    if (tr->quantize == nullptr) return make_error("cannot make weights of type ", tr->name);
    plan.name = "synthetic-" + s.name + "-" + std::string(tr->name);
    plan.tensors = llama_tensors(s, tr->type);
  } else if (const quant::Mix* mix = quant::find_mix(type); mix != nullptr && !mix->pure) {  // llama.cpp's rules
    plan.name = "synthetic-" + s.name + "-" + std::string(mix->name);
    plan.tensors = llama_tensors(s, mix->default_type);
    gguf::Metadata meta(plan.name);
    set_hparams(meta, s, plan.name);
    KITE_ASSIGN_OR_RETURN(std::vector<quant::PlanEntry> types, quant::plan_types(*mix, plan.tensors, meta));
    for (size_t i = 0; i < types.size(); ++i) {
      const quant::TypeTraits* tr = quant::find_traits(types[i].type);
      if (tr == nullptr || tr->quantize == nullptr)
        return make_error(mix->name, " puts ", plan.tensors[i].name, " in a type kite cannot make");
      plan.tensors[i].type = types[i].type;
    }
  } else {
    std::string mixes;
    for (const std::string& n : quant::known_mix_names())
      if (const quant::Mix* m = quant::find_mix(n); m != nullptr && !m->pure && quant::find_traits(n) == nullptr)
        mixes += (mixes.empty() ? "" : ", ") + n;
    return make_error("unknown weight type '", type, "': expected a ggml type (f16, q4_0, q8_0, q4_K, ...) or a ",
                      "llama.cpp mix (", mixes, ")");
  }
  for (gguf::TensorInfo& t : plan.tensors) {
    KITE_ASSIGN_OR_RETURN(size_t row_bytes, quant::row_size(t.type, t.ne[0]));
    t.nbytes = row_bytes * static_cast<uint64_t>(t.n_elements() / t.ne[0]);
    plan.total_bytes += t.nbytes;
  }
  return plan;
}

Result<std::unique_ptr<MemorySource>> make_synthetic(std::string_view shape_name, std::string_view type,
                                                     uint64_t seed) {
  KITE_ASSIGN_OR_RETURN(SyntheticPlan plan, plan_synthetic(shape_name, type));
  const SyntheticShape& s = *plan.shape;
  auto src = std::make_unique<MemorySource>(plan.name);
  set_hparams(src->metadata(), s, plan.name);
  if (const quant::Mix* mix = quant::find_mix(type); mix != nullptr && quant::find_traits(type) == nullptr)
    src->metadata().set("general.file_type", mix->file_type);
  set_vocab(src->metadata(), s.n_vocab);

  RowPool pool(seed);
  for (const gguf::TensorInfo& t : plan.tensors) {
    KITE_ASSIGN_OR_RETURN(uint8_t * p, src->add_tensor(t.name, t.type, t.ne));
    if (t.ne.size() == 1) {  // norms (and biases): ones
      auto* f = reinterpret_cast<float*>(p);
      for (int64_t i = 0; i < t.ne[0]; ++i) f[i] = 1.f;
    } else {
      KITE_TRY(fill_matrix(p, t.type, t.ne[0], t.n_elements() / t.ne[0], pool));
    }
  }
  return src;
}

}  // namespace kite

#include "tests/gemma_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <vector>

#include "formats/gguf.h"
#include "src/base/half.h"
#include "tests/moe_model.h"

namespace kite::test {
namespace {

// llama.cpp writes llama's Q/K rows permuted for its interleaved rope: row (h, 2 b + a) of a head
// holds Hugging Face's row (h, a * hd / 2 + b). The rows back in HF (neox) order.
std::vector<uint8_t> unpermute_rows(const gguf::TensorInfo& t, int64_t n_head) {
  const int64_t rows = t.ne[1], hd = rows / n_head;
  const size_t row = t.nbytes / static_cast<size_t>(rows);
  std::vector<uint8_t> out(t.nbytes);
  for (int64_t h = 0; h < n_head; ++h)
    for (int64_t a = 0; a < 2; ++a)
      for (int64_t b = 0; b < hd / 2; ++b)
        std::memcpy(out.data() + static_cast<size_t>(h * hd + a * hd / 2 + b) * row,
                    t.data + static_cast<size_t>(h * hd + 2 * b + a) * row, row);
  return out;
}

}  // namespace

Status make_gemma(const std::string& dense_gguf, const std::string& out_gguf, const GemmaOptions& o) {
  KITE_ASSIGN_OR_RETURN(gguf::File in, gguf::File::open(dense_gguf));
  const gguf::Metadata& m = in.metadata();
  KITE_ASSIGN_OR_RETURN(const std::string arch, m.get<std::string>("general.architecture"));
  const bool gemma2 = o.arch == "gemma2";
  if (o.arch != "gemma2" && o.arch != "gemma3") return make_error("making a '", o.arch, "' model");
  if (arch != (gemma2 ? "llama" : "qwen3"))
    return make_error(dense_gguf, ": ", o.arch, " is made from ", gemma2 ? "llama" : "qwen3", ", not '", arch, "'");
  const std::string p = arch + ".";
  KITE_ASSIGN_OR_RETURN(const int64_t n_embd, m.get_int(p + "embedding_length"));
  KITE_ASSIGN_OR_RETURN(const int64_t n_head, m.get_int(p + "attention.head_count"));
  const int64_t n_head_kv = m.has(p + "attention.head_count_kv") ? *m.get_int(p + "attention.head_count_kv") : n_head;
  if (in.find_tensor("output.weight") != nullptr) return make_error(dense_gguf, ": gemma ties its LM head");

  gguf::Writer w;
  w.set_version(in.version());
  for (const gguf::KeyValue& kv : m.entries()) {
    std::string key = kv.key;
    if (key.rfind(p, 0) == 0) key = o.arch + "." + key.substr(p.size());
    w.metadata().set(key, key == "general.architecture" ? gguf::Value(o.arch) : kv.value);
  }
  const std::string q = o.arch + ".";
  w.metadata().set(q + "attention.sliding_window", static_cast<uint32_t>(o.window));
  w.metadata().set(q + "attention.sliding_window_pattern", static_cast<uint32_t>(o.pattern));
  if (gemma2) {
    w.metadata().set(q + "attn_logit_softcapping", o.attn_softcap);
    w.metadata().set(q + "final_logit_softcapping", o.final_softcap);
  } else {
    w.metadata().set(q + "rope.scaling.type", std::string("linear"));
    w.metadata().set(q + "rope.scaling.factor", o.rope_linear);
  }

  // Each output tensor: a scaled (or, llama's Q/K, reordered) copy of an input one, or a
  // constant norm.
  struct Out {
    const gguf::TensorInfo* src;  // null: the constant
    float scale;
    int64_t unpermute_heads;  // > 0: rows back in neox order
  };
  std::vector<Out> outs;
  const float embd_scale = 1.f / std::sqrt(static_cast<float>(n_embd));
  for (const gguf::TensorInfo& t : in.tensors()) {
    float s = 1.f;
    const std::string& n = t.name;
    auto ends = [&](const char* suffix) { return n.ends_with(suffix); };
    if (n == "token_embd.weight") s = embd_scale;
    else if (n == "output_norm.weight") s = 1.f / embd_scale;
    else if (ends("ffn_gate.weight")) s = 1.f / 1.702f;
    else if (ends("ffn_up.weight")) s = 1.702f;
    if (s != 1.f && t.type != quant::Type::F16 && t.type != quant::Type::F32)
      return make_error(dense_gguf, ": tensor '", n, "' is not F16 or F32");
    const int64_t heads = !gemma2 ? 0 : ends("attn_q.weight") ? n_head : ends("attn_k.weight") ? n_head_kv : 0;
    outs.push_back({&t, s, heads});
    KITE_TRY(w.add_tensor(n, t.type, t.ne));
    const bool attn_out = ends("attn_output.weight"), ffn_down = ends("ffn_down.weight");
    if (attn_out || ffn_down) {
      const std::string blk = n.substr(0, n.find('.', 4) + 1);  // "blk.N."
      outs.push_back({nullptr, o.post_norm, 0});
      KITE_TRY(w.add_tensor(blk + (attn_out ? "post_attention_norm.weight" : "post_ffw_norm.weight"),
                            quant::Type::F32, {n_embd}));
    }
  }

  KITE_TRY(w.begin(out_gguf));
  for (const Out& out : outs) {
    if (out.src == nullptr) {
      const std::vector<float> c(static_cast<size_t>(n_embd), out.scale);
      KITE_TRY(w.write_tensor_data(c.data(), c.size() * sizeof(float)));
      continue;
    }
    const gguf::TensorInfo& t = *out.src;
    if (out.unpermute_heads > 0) {
      const std::vector<uint8_t> rows = unpermute_rows(t, out.unpermute_heads);
      KITE_TRY(w.write_tensor_data(rows.data(), rows.size()));
      continue;
    }
    if (out.scale == 1.f) {
      KITE_TRY(w.write_tensor_data(t.data, t.nbytes));
      continue;
    }
    std::vector<uint8_t> bytes(t.data, t.data + t.nbytes);
    const auto n = static_cast<size_t>(t.n_elements());
    if (t.type == quant::Type::F16) {
      auto* h = reinterpret_cast<uint16_t*>(bytes.data());
      for (size_t i = 0; i < n; ++i) h[i] = fp32_to_fp16(fp16_to_fp32(h[i]) * out.scale);
    } else {
      auto* f = reinterpret_cast<float*>(bytes.data());
      for (size_t i = 0; i < n; ++i) f[i] *= out.scale;
    }
    KITE_TRY(w.write_tensor_data(bytes.data(), bytes.size()));
  }
  return w.finish();
}

namespace {

// GGUF layer tensor names -> Gemma's (after "model.layers.N.").
constexpr std::pair<const char*, const char*> kGemmaHfNames[] = {
    {"attn_norm.weight", "input_layernorm.weight"},
    {"attn_q.weight", "self_attn.q_proj.weight"},
    {"attn_k.weight", "self_attn.k_proj.weight"},
    {"attn_v.weight", "self_attn.v_proj.weight"},
    {"attn_output.weight", "self_attn.o_proj.weight"},
    {"attn_q_norm.weight", "self_attn.q_norm.weight"},
    {"attn_k_norm.weight", "self_attn.k_norm.weight"},
    {"post_attention_norm.weight", "post_attention_layernorm.weight"},
    {"ffn_norm.weight", "pre_feedforward_layernorm.weight"},
    {"post_ffw_norm.weight", "post_feedforward_layernorm.weight"},
    {"ffn_gate.weight", "mlp.gate_proj.weight"},
    {"ffn_up.weight", "mlp.up_proj.weight"},
    {"ffn_down.weight", "mlp.down_proj.weight"},
};

}  // namespace

Status gemma_gguf_to_hf(const std::string& gemma_gguf, const std::string& dense_hf, const std::string& out_dir,
                        bool multimodal) {
  namespace fs = std::filesystem;
  using Json = nlohmann::json;
  KITE_ASSIGN_OR_RETURN(gguf::File in, gguf::File::open(gemma_gguf));
  const gguf::Metadata& m = in.metadata();
  KITE_ASSIGN_OR_RETURN(const std::string arch, m.get<std::string>("general.architecture"));
  if (arch != "gemma2" && arch != "gemma3") return make_error(gemma_gguf, ": not a gemma model");
  const bool gemma2 = arch == "gemma2";
  const std::string p = arch + ".";
  fs::create_directories(out_dir);
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "generation_config.json"})
    fs::copy_file(fs::path(dense_hf) / f, fs::path(out_dir) / f, fs::copy_options::overwrite_existing);
  const Json dense = Json::parse(std::ifstream(fs::path(dense_hf) / "config.json"));

  Json text = Json::object();
  auto key_int = [&](const char* k) { return *m.get_int(p + k); };
  auto key_float = [&](const char* k) { return *m.get_float(p + k); };
  text["vocab_size"] = dense["vocab_size"];
  text["hidden_size"] = key_int("embedding_length");
  text["intermediate_size"] = key_int("feed_forward_length");
  text["num_hidden_layers"] = key_int("block_count");
  text["num_attention_heads"] = key_int("attention.head_count");
  text["num_key_value_heads"] = key_int("attention.head_count_kv");
  text["head_dim"] = m.has(p + "attention.key_length") ? key_int("attention.key_length")
                                                        : key_int("embedding_length") / key_int("attention.head_count");
  text["rms_norm_eps"] = key_float("attention.layer_norm_rms_epsilon");
  text["max_position_embeddings"] = key_int("context_length");
  text["rope_theta"] = key_float("rope.freq_base");
  text["sliding_window"] = key_int("attention.sliding_window");
  text["hidden_activation"] = "gelu_pytorch_tanh";
  text["tie_word_embeddings"] = true;
  text["bos_token_id"] = dense["bos_token_id"];
  text["eos_token_id"] = dense["eos_token_id"];
  const int64_t every = key_int("attention.sliding_window_pattern");
  if (gemma2) {
    text["attn_logit_softcapping"] = key_float("attn_logit_softcapping");
    text["final_logit_softcapping"] = key_float("final_logit_softcapping");
    text["sliding_window_pattern"] = every;
  } else {
    Json types = Json::array();
    for (int64_t il = 0; il < key_int("block_count"); ++il)
      types.push_back(il % every < every - 1 ? "sliding_attention" : "full_attention");
    text["layer_types"] = types;
    text["rope_scaling"] = {{"rope_type", *m.get<std::string>(p + "rope.scaling.type")},
                            {"factor", key_float("rope.scaling.factor")}};
    text["rope_local_base_freq"] = 10000.0;
    text["final_logit_softcapping"] = nullptr;
    text["attn_logit_softcapping"] = nullptr;
  }
  Json config;
  if (multimodal) {
    text["model_type"] = "gemma3_text";
    config = {{"architectures", {"Gemma3ForConditionalGeneration"}}, {"model_type", "gemma3"}, {"text_config", text}};
  } else {
    config = text;
    config["architectures"] = {gemma2 ? "Gemma2ForCausalLM" : "Gemma3ForCausalLM"};
    config["model_type"] = gemma2 ? "gemma2" : "gemma3_text";
  }
  std::ofstream(fs::path(out_dir) / "config.json") << config.dump(2);

  const std::string model = multimodal ? "language_model.model." : "model.";
  std::vector<SafetensorsPiece> pieces;
  std::deque<std::vector<float>> norms;  // weight - 1, as Gemma stores its norms
  static const std::regex kLayer(R"(blk\.(\d+)\.(.+))");
  for (const gguf::TensorInfo& t : in.tensors()) {
    std::string hf;
    std::smatch sm;
    if (t.name == "token_embd.weight") {
      hf = model + "embed_tokens.weight";
    } else if (t.name == "output_norm.weight") {
      hf = model + "norm.weight";
    } else if (std::regex_match(t.name, sm, kLayer)) {
      const std::string rest = sm[2].str();
      const auto row = std::find_if(std::begin(kGemmaHfNames), std::end(kGemmaHfNames),
                                    [&](const auto& r) { return rest == r.first; });
      if (row == std::end(kGemmaHfNames)) return make_error(gemma_gguf, ": no Hugging Face name for '", t.name, "'");
      hf = model + "layers." + sm[1].str() + "." + row->second;
    } else {
      return make_error(gemma_gguf, ": no Hugging Face name for '", t.name, "'");
    }
    if (!t.name.ends_with("norm.weight")) {
      pieces.push_back({hf, t.type, t.ne, t.data, t.nbytes});
      continue;
    }
    if (t.type != quant::Type::F32) return make_error(gemma_gguf, ": norm '", t.name, "' is not F32");
    std::vector<float>& v = norms.emplace_back(static_cast<size_t>(t.ne[0]));
    for (size_t i = 0; i < v.size(); ++i) v[i] = reinterpret_cast<const float*>(t.data)[i] - 1.f;
    pieces.push_back({hf, quant::Type::F32, t.ne, reinterpret_cast<const uint8_t*>(v.data()), v.size() * 4});
  }
  const std::vector<uint16_t> vision(16 * 3, 0);  // (a vision tower's tensor, which kite skips)
  if (multimodal)
    pieces.push_back({"vision_tower.vision_model.embeddings.patch_embedding.weight", quant::Type::F16, {16, 3},
                      reinterpret_cast<const uint8_t*>(vision.data()), vision.size() * 2});
  return write_safetensors((fs::path(out_dir) / "model.safetensors").string(), pieces);
}

}  // namespace kite::test

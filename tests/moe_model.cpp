#include "tests/moe_model.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <vector>

#include "formats/gguf.h"
#include "src/base/half.h"

namespace kite::test {
namespace {

// xorshift32: the same numbers on every platform (std's distributions are not).
struct Rng {
  uint32_t s;
  float uniform() {  // [-1, 1)
    s ^= s << 13;
    s ^= s >> 17;
    s ^= s << 5;
    return static_cast<float>(s >> 8) / static_cast<float>(1u << 23) - 1.f;
  }
};

float load(const gguf::TensorInfo& t, size_t i) {
  if (t.type == quant::Type::F16) return fp16_to_fp32(reinterpret_cast<const uint16_t*>(t.data)[i]);
  return reinterpret_cast<const float*>(t.data)[i];
}

void store(quant::Type type, std::vector<uint8_t>& out, size_t i, float v) {
  if (type == quant::Type::F16) reinterpret_cast<uint16_t*>(out.data())[i] = fp32_to_fp16(v);
  else reinterpret_cast<float*>(out.data())[i] = v;
}

}  // namespace

Status upcycle_to_moe(const std::string& dense_gguf, const std::string& out_gguf, const MoeUpcycle& o) {
  KITE_ASSIGN_OR_RETURN(gguf::File in, gguf::File::open(dense_gguf));
  KITE_ASSIGN_OR_RETURN(const std::string arch, in.metadata().get<std::string>("general.architecture"));
  if (arch != "llama" && arch != "qwen3") return make_error(dense_gguf, ": upcycling a '", arch, "' model");
  const std::string moe_arch = arch == "qwen3" ? "qwen3moe" : arch;
  KITE_ASSIGN_OR_RETURN(const int64_t n_ff, in.metadata().get_int(arch + ".feed_forward_length"));

  gguf::Writer w;
  w.set_version(in.version());
  for (const gguf::KeyValue& kv : in.metadata().entries()) {
    std::string key = kv.key;
    if (key.rfind(arch + ".", 0) == 0) key = moe_arch + key.substr(arch.size());
    w.metadata().set(key, key == "general.architecture" ? gguf::Value(moe_arch) : kv.value);
  }
  w.metadata().set(moe_arch + ".expert_count", static_cast<uint32_t>(o.n_expert));
  w.metadata().set(moe_arch + ".expert_used_count", static_cast<uint32_t>(o.n_used));
  if (moe_arch == "qwen3moe") w.metadata().set(moe_arch + ".expert_feed_forward_length", static_cast<uint32_t>(n_ff));

  // Tensors in the input's order; a layer's router goes where its ffn_gate was.
  static const std::regex kFfn(R"(blk\.(\d+)\.ffn_(gate|up|down)\.weight)");
  struct Out {
    const gguf::TensorInfo* src;
    enum { kCopy, kRouter, kExperts } kind;
  };
  std::vector<Out> outs;
  for (const gguf::TensorInfo& t : in.tensors()) {
    std::smatch m;
    if (!std::regex_match(t.name, m, kFfn)) {
      outs.push_back({&t, Out::kCopy});
      KITE_TRY(w.add_tensor(t.name, t.type, t.ne));
      continue;
    }
    if (t.type != quant::Type::F16 && t.type != quant::Type::F32)
      return make_error(dense_gguf, ": tensor '", t.name, "' is not F16 or F32");
    const std::string blk = "blk." + m[1].str() + ".";
    if (m[2] == "gate") {
      outs.push_back({&t, Out::kRouter});
      KITE_TRY(w.add_tensor(blk + "ffn_gate_inp.weight", quant::Type::F32, {t.ne[0], o.n_expert}));
    }
    outs.push_back({&t, Out::kExperts});
    KITE_TRY(w.add_tensor(blk + "ffn_" + m[2].str() + "_exps.weight", t.type, {t.ne[0], t.ne[1], o.n_expert}));
  }

  KITE_TRY(w.begin(out_gguf));
  Rng rng{o.seed != 0 ? o.seed : 1};
  for (const Out& out : outs) {
    const gguf::TensorInfo& t = *out.src;
    if (out.kind == Out::kCopy) {
      KITE_TRY(w.write_tensor_data(t.data, t.nbytes));
      continue;
    }
    const int64_t k = t.ne[0], rows = t.ne[1];
    if (out.kind == Out::kRouter) {
      // The router sees the normed hidden state (mean square 1, times ffn_norm's weights): a
      // uniform weight in [-a, a] gives logits of standard deviation a * sqrt(k / 3 * E[g^2]).
      const std::string norm_name = t.name.substr(0, t.name.find("ffn_gate")) + "ffn_norm.weight";
      const gguf::TensorInfo* norm = in.find_tensor(norm_name);
      if (norm == nullptr) return make_error(dense_gguf, ": missing tensor '", norm_name, "'");
      double g2 = 0;
      for (int64_t i = 0; i < k; ++i)
        g2 += static_cast<double>(load(*norm, static_cast<size_t>(i))) * load(*norm, static_cast<size_t>(i));
      const float a = o.router_std / std::sqrt(static_cast<float>(g2 / 3.0));
      std::vector<float> router(static_cast<size_t>(k * o.n_expert));
      for (float& v : router) v = a * rng.uniform();
      KITE_TRY(w.write_tensor_data(router.data(), router.size() * sizeof(float)));
      continue;
    }
    const size_t elem = t.type == quant::Type::F16 ? 2 : 4;
    std::vector<uint8_t> experts(static_cast<size_t>(k * rows * o.n_expert) * elem);
    for (int e = 0; e < o.n_expert; ++e)
      for (int64_t r = 0; r < rows; ++r) {
        const float f = 1.f + o.spread * rng.uniform();
        for (int64_t i = 0; i < k; ++i) {
          const auto at = static_cast<size_t>(r * k + i);
          store(t.type, experts, static_cast<size_t>(e * rows * k) + at, f * load(t, at));
        }
      }
    KITE_TRY(w.write_tensor_data(experts.data(), experts.size()));
  }
  return w.finish();
}

namespace {

// GGUF layer tensor names -> Qwen3-MoE's (after "model.layers.N.").
constexpr std::pair<const char*, const char*> kHfLayerNames[] = {
    {"attn_norm.weight", "input_layernorm.weight"},    {"attn_q.weight", "self_attn.q_proj.weight"},
    {"attn_k.weight", "self_attn.k_proj.weight"},      {"attn_v.weight", "self_attn.v_proj.weight"},
    {"attn_output.weight", "self_attn.o_proj.weight"}, {"attn_q_norm.weight", "self_attn.q_norm.weight"},
    {"attn_k_norm.weight", "self_attn.k_norm.weight"}, {"ffn_norm.weight", "post_attention_layernorm.weight"},
    {"ffn_gate_inp.weight", "mlp.gate.weight"},        {"ffn_gate_exps.weight", "gate_proj.weight"},
    {"ffn_up_exps.weight", "up_proj.weight"},          {"ffn_down_exps.weight", "down_proj.weight"},
};

}  // namespace

Status moe_gguf_to_hf(const std::string& moe_gguf, const std::string& dense_hf, const std::string& out_dir) {
  namespace fs = std::filesystem;
  KITE_ASSIGN_OR_RETURN(gguf::File in, gguf::File::open(moe_gguf));
  const gguf::Metadata& m = in.metadata();
  KITE_ASSIGN_OR_RETURN(const int64_t n_expert, m.get_int("qwen3moe.expert_count"));
  KITE_ASSIGN_OR_RETURN(const int64_t n_used, m.get_int("qwen3moe.expert_used_count"));
  KITE_ASSIGN_OR_RETURN(const int64_t n_ff_exp, m.get_int("qwen3moe.expert_feed_forward_length"));
  fs::create_directories(out_dir);
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "generation_config.json"})
    fs::copy_file(fs::path(dense_hf) / f, fs::path(out_dir) / f, fs::copy_options::overwrite_existing);
  nlohmann::json config = nlohmann::json::parse(std::ifstream(fs::path(dense_hf) / "config.json"));
  config["architectures"] = {"Qwen3MoeForCausalLM"};
  config["model_type"] = "qwen3_moe";
  config["num_experts"] = n_expert;
  config["num_experts_per_tok"] = n_used;
  config["moe_intermediate_size"] = n_ff_exp;
  config["norm_topk_prob"] = true;
  config["decoder_sparse_step"] = 1;
  config["mlp_only_layers"] = nlohmann::json::array();
  config["dtype"] = "float16";
  std::ofstream(fs::path(out_dir) / "config.json") << config.dump(2);

  std::vector<SafetensorsPiece> pieces;
  static const std::regex kLayer(R"(blk\.(\d+)\.(.+))");
  for (const gguf::TensorInfo& t : in.tensors()) {
    if (t.type != quant::Type::F16 && t.type != quant::Type::F32)
      return make_error(moe_gguf, ": tensor '", t.name, "' is not F16 or F32");
    std::smatch sm;
    if (!std::regex_match(t.name, sm, kLayer)) {
      const char* hf = t.name == "token_embd.weight"    ? "model.embed_tokens.weight"
                       : t.name == "output_norm.weight" ? "model.norm.weight"
                       : t.name == "output.weight"      ? "lm_head.weight"
                                                        : nullptr;
      if (hf == nullptr) return make_error(moe_gguf, ": no Hugging Face name for '", t.name, "'");
      pieces.push_back({hf, t.type, t.ne, t.data, t.nbytes});
      continue;
    }
    const std::string prefix = "model.layers." + sm[1].str() + ".", rest = sm[2].str();
    const auto row = std::find_if(std::begin(kHfLayerNames), std::end(kHfLayerNames),
                                  [&](const auto& r) { return rest == r.first; });
    if (row == std::end(kHfLayerNames)) return make_error(moe_gguf, ": no Hugging Face name for '", t.name, "'");
    if (t.ne.size() < 3) {
      pieces.push_back({prefix + row->second, t.type, t.ne, t.data, t.nbytes});
      continue;
    }
    const size_t per_expert = t.nbytes / static_cast<size_t>(t.ne[2]);
    for (int64_t e = 0; e < t.ne[2]; ++e)
      pieces.push_back({prefix + "mlp.experts." + std::to_string(e) + "." + row->second, t.type,
                        {t.ne[0], t.ne[1]}, t.data + static_cast<size_t>(e) * per_expert, per_expert});
  }
  return write_safetensors((fs::path(out_dir) / "model.safetensors").string(), pieces);
}

Status write_safetensors(const std::string& path, const std::vector<SafetensorsPiece>& pieces) {
  // An 8-byte header length, the JSON header, the tensors' bytes.
  nlohmann::json header = nlohmann::json::object();
  size_t at = 0;
  for (const SafetensorsPiece& p : pieces) {
    if (p.type != quant::Type::F16 && p.type != quant::Type::F32)
      return make_error(path, ": tensor '", p.name, "' is not F16 or F32");
    std::vector<int64_t> shape;  // outermost first
    for (size_t d = p.ne.size(); d-- > 0;) shape.push_back(p.ne[d]);
    header[p.name] = {{"dtype", p.type == quant::Type::F16 ? "F16" : "F32"},
                      {"shape", shape},
                      {"data_offsets", {at, at + p.bytes}}};
    at += p.bytes;
  }
  std::string h = header.dump();
  h.resize((h.size() + 7) / 8 * 8, ' ');
  std::ofstream f(path, std::ios::binary);
  const uint64_t n = h.size();
  f.write(reinterpret_cast<const char*>(&n), 8);
  f.write(h.data(), static_cast<std::streamsize>(h.size()));
  for (const SafetensorsPiece& p : pieces)
    f.write(reinterpret_cast<const char*>(p.data), static_cast<std::streamsize>(p.bytes));
  if (!f) return make_error(path, ": cannot write it");
  return ok_status();
}

}  // namespace kite::test

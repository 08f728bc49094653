#include "formats/hf_config.h"

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "formats/safetensors.h"

namespace kite::hf {
namespace {

using Json = nlohmann::json;

struct ArchRow {
  std::string_view hf_architecture;
  std::string_view model_type;
  std::string_view arch;    // GGUF architecture
  int64_t default_context;  // transformers' default max_position_embeddings
  bool always_qkv_bias;     // qwen2 has q/k/v biases without a flag
};

constexpr ArchRow kArchs[] = {
    {"LlamaForCausalLM", "llama", "llama", 2048, false},
    {"MistralForCausalLM", "mistral", "llama", 131072, false},
    {"Qwen2ForCausalLM", "qwen2", "qwen2", 32768, true},
    {"Qwen3ForCausalLM", "qwen3", "qwen3", 32768, false},
    {"Qwen3MoeForCausalLM", "qwen3_moe", "qwen3moe", 32768, false},
    {"MixtralForCausalLM", "mixtral", "llama", 4096 * 32, false},
    {"Gemma2ForCausalLM", "gemma2", "gemma2", 8192, false},
    {"Gemma3ForCausalLM", "gemma3_text", "gemma3", 131072, false},
    {"Gemma3ForConditionalGeneration", "gemma3", "gemma3", 131072, false},  // (its text model)
};

// transformers' Gemma3TextConfig defaults: a Gemma3ForConditionalGeneration's text_config lists
// only what differs from them.
constexpr std::string_view kGemma3TextDefaults = R"({
  "vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
  "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "rms_norm_eps": 1e-6,
  "max_position_embeddings": 131072, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
  "sliding_window": 4096, "sliding_window_pattern": 6, "tie_word_embeddings": true})";

// Reads config.json fields with messages that name the file and the key.
class Reader {
 public:
  Reader(const Json& j, const std::string& source) : j_(j), source_(source) {}

  const Json* find(std::string_view key) const {
    auto it = j_.find(key);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }

  Result<int64_t> get_int(std::string_view key, std::optional<int64_t> fallback = std::nullopt) const {
    const Json* v = find(key);
    if (v == nullptr) {
      if (fallback) return *fallback;
      return make_error(source_, ": missing required key '", key, "'");
    }
    return to_int(*v, key);
  }

  Result<int64_t> get_positive_u32(std::string_view key, std::optional<int64_t> fallback = std::nullopt) const {
    KITE_ASSIGN_OR_RETURN(int64_t x, get_int(key, fallback));
    if (x <= 0 || x > std::numeric_limits<uint32_t>::max())
      return make_error(source_, ": '", key, "' = ", x, " is out of range (expected 1..2^32-1)");
    return x;
  }

  Result<int64_t> to_int(const Json& v, std::string_view key) const {
    if (v.is_number_integer()) {
      if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        return make_error(source_, ": '", key, "' is too large");
      return v.get<int64_t>();
    }
    if (v.is_number_float()) {  // some configs write 4096.0
      const double d = v.get<double>();
      if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9e15) return static_cast<int64_t>(d);
    }
    return make_error(source_, ": '", key, "' must be an integer, got ", v.type_name());
  }

  Result<double> get_float(std::string_view key, double fallback) const {
    const Json* v = find(key);
    if (v == nullptr) return fallback;
    return to_float(*v, key);
  }

  Result<double> to_float(const Json& v, std::string_view key) const {
    if (!v.is_number()) return make_error(source_, ": '", key, "' must be a number, got ", v.type_name());
    const double d = v.get<double>();
    if (!std::isfinite(d)) return make_error(source_, ": '", key, "' is not finite");
    return d;
  }

  Result<bool> get_bool(std::string_view key, bool fallback) const {
    const Json* v = find(key);
    if (v == nullptr) return fallback;
    if (!v->is_boolean()) return make_error(source_, ": '", key, "' must be a boolean, got ", v->type_name());
    return v->get<bool>();
  }

  Result<std::string> get_string(std::string_view key, std::string fallback) const {
    const Json* v = find(key);
    if (v == nullptr) return fallback;
    if (!v->is_string()) return make_error(source_, ": '", key, "' must be a string, got ", v->type_name());
    return v->get<std::string>();
  }

  const std::string& source() const { return source_; }

 private:
  const Json& j_;
  const std::string& source_;
};

Result<const ArchRow*> find_arch(const Reader& r, Config& c) {
  if (const Json* archs = r.find("architectures")) {
    if (!archs->is_array() || archs->empty() || !(*archs)[0].is_string())
      return make_error(r.source(), ": 'architectures' must be a non-empty array of strings");
    c.hf_architecture = (*archs)[0].get<std::string>();
  }
  KITE_ASSIGN_OR_RETURN(c.model_type, r.get_string("model_type", ""));
  for (const ArchRow& row : kArchs)
    if (!c.hf_architecture.empty() ? row.hf_architecture == c.hf_architecture : row.model_type == c.model_type)
      return &row;
  const std::string name = !c.hf_architecture.empty() ? c.hf_architecture
                           : !c.model_type.empty()    ? "model_type " + c.model_type
                                                      : std::string("(no 'architectures' or 'model_type')");
  return make_error(r.source(), ": unsupported architecture ", safetensors::printable(name, 80),
                    " (supported: ", supported_architectures(), ")");
}

// rope_scaling (older configs) or transformers 5's rope_parameters {rope_type, rope_theta, ...}.
Status parse_rope(const Reader& r, Config& c) {
  KITE_ASSIGN_OR_RETURN(c.rope_theta, r.get_float("rope_theta", 10000.0));
  const Json* params = r.find("rope_parameters");
  if (params != nullptr && !params->is_object())
    return make_error(r.source(), ": 'rope_parameters' must be an object, got ", params->type_name());
  if (params != nullptr && params->contains("full_attention")) {
    // Per layer type (transformers 5's gemma3): the global layers' parameters are the model's;
    // the sliding layers' base is gemma3's local one.
    const Json& full = (*params)["full_attention"];
    if (!full.is_object()) return make_error(r.source(), ": 'rope_parameters.full_attention' must be an object");
    if (auto it = params->find("sliding_attention"); it != params->end() && it->is_object()) {
      Reader sr(*it, r.source());
      if (sr.find("rope_theta") != nullptr) {
        KITE_ASSIGN_OR_RETURN(c.gemma.rope_local_base, sr.get_float("rope_theta", 10000.0));
      }
    }
    params = &full;
  }
  if (params != nullptr) {
    Reader pr(*params, r.source());
    KITE_ASSIGN_OR_RETURN(c.rope_theta, pr.get_float("rope_theta", c.rope_theta));
  }
  const Json* scaling = r.find("rope_scaling");
  if (scaling != nullptr && !scaling->is_object())
    return make_error(r.source(), ": 'rope_scaling' must be an object, got ", scaling->type_name());
  if (scaling == nullptr) scaling = params;
  if (scaling == nullptr) return ok_status();

  Reader sr(*scaling, r.source());
  KITE_ASSIGN_OR_RETURN(std::string type, sr.get_string("rope_type", ""));
  if (type.empty()) {
    KITE_ASSIGN_OR_RETURN(type, sr.get_string("type", "default"));
  }
  RopeScaling& s = c.rope_scaling;
  if (type == "default") return ok_status();
  if (type != "linear" && type != "llama3" && type != "yarn" && type != "dynamic")
    return make_error(r.source(), ": unsupported rope scaling type '", safetensors::printable(type, 40),
                      "' (supported: default, linear, llama3, yarn, dynamic)");
  s.type = type;
  KITE_ASSIGN_OR_RETURN(s.factor, sr.get_float("factor", type == "llama3" ? 8.0 : 1.0));
  if (s.factor <= 0) return make_error(r.source(), ": rope scaling factor ", s.factor, " must be positive");
  KITE_ASSIGN_OR_RETURN(s.original_max_position_embeddings,
                        sr.get_int("original_max_position_embeddings", type == "llama3" ? 8192 : 0));
  if (s.original_max_position_embeddings < 0 ||
      s.original_max_position_embeddings > std::numeric_limits<uint32_t>::max())
    return make_error(r.source(), ": original_max_position_embeddings is out of range");
  KITE_ASSIGN_OR_RETURN(s.low_freq_factor, sr.get_float("low_freq_factor", 1.0));
  KITE_ASSIGN_OR_RETURN(s.high_freq_factor, sr.get_float("high_freq_factor", 4.0));
  if (type == "llama3" && !(s.high_freq_factor > s.low_freq_factor && s.low_freq_factor > 0))
    return make_error(r.source(), ": llama3 rope scaling needs 0 < low_freq_factor < high_freq_factor");
  for (auto [key, field] :
       {std::pair{"beta_fast", &s.beta_fast}, std::pair{"beta_slow", &s.beta_slow},
        std::pair{"attention_factor", &s.attention_factor}, std::pair{"extrapolation_factor", &s.ext_factor}}) {
    if (const Json* v = sr.find(key)) {
      KITE_ASSIGN_OR_RETURN(*field, sr.to_float(*v, key));
    }
  }
  return ok_status();
}

Status parse_heads(const Reader& r, Config& c) {
  KITE_ASSIGN_OR_RETURN(c.num_attention_heads, r.get_positive_u32("num_attention_heads"));
  KITE_ASSIGN_OR_RETURN(c.num_key_value_heads, r.get_positive_u32("num_key_value_heads", c.num_attention_heads));
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    return make_error(r.source(), ": num_attention_heads ", c.num_attention_heads,
                      " is not a multiple of num_key_value_heads ", c.num_key_value_heads);
  if (r.find("head_dim") != nullptr) {
    KITE_ASSIGN_OR_RETURN(c.head_dim, r.get_positive_u32("head_dim"));
    c.head_dim_explicit = true;
  } else {
    if (c.hidden_size % c.num_attention_heads != 0)
      return make_error(r.source(), ": hidden_size ", c.hidden_size, " is not a multiple of num_attention_heads ",
                        c.num_attention_heads, " (and no head_dim is given)");
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  if (c.head_dim % 2 != 0) return make_error(r.source(), ": head_dim ", c.head_dim, " must be even for rope");
  return ok_status();
}

// The experts of Qwen3-MoE (every layer sparse, llama.cpp's normalized top-k: the configs
// kite runs as llama.cpp does) and Mixtral.
Status parse_experts(const Reader& r, Config& c) {
  if (c.model_type == "mixtral") {
    KITE_ASSIGN_OR_RETURN(c.num_experts, r.get_positive_u32("num_local_experts"));
    c.moe_intermediate_size = c.intermediate_size;
  } else if (c.arch == "qwen3moe") {
    KITE_ASSIGN_OR_RETURN(c.num_experts, r.get_positive_u32("num_experts"));
    KITE_ASSIGN_OR_RETURN(c.moe_intermediate_size, r.get_positive_u32("moe_intermediate_size"));
    KITE_ASSIGN_OR_RETURN(const bool norm, r.get_bool("norm_topk_prob", true));
    KITE_ASSIGN_OR_RETURN(const int64_t step, r.get_int("decoder_sparse_step", 1));
    const Json* dense = r.find("mlp_only_layers");
    if (!norm || step != 1 || (dense != nullptr && !(dense->is_array() && dense->empty())))
      return make_error(r.source(), ": a Qwen3-MoE layout kite does not run (it needs norm_topk_prob true, ",
                        "decoder_sparse_step 1 and no mlp_only_layers)");
  } else {
    return ok_status();
  }
  KITE_ASSIGN_OR_RETURN(c.num_experts_per_tok, r.get_positive_u32("num_experts_per_tok"));
  if (c.num_experts_per_tok > c.num_experts)
    return make_error(r.source(), ": num_experts_per_tok ", c.num_experts_per_tok, " is more than the ", c.num_experts,
                      " experts");
  return ok_status();
}

// Gemma's sliding windows and soft-capping (llama.cpp's converter's reading of them).
Status parse_gemma(const Reader& r, Config& c) {
  if (c.arch != "gemma2" && c.arch != "gemma3") return ok_status();
  Config::Gemma& g = c.gemma;
  const bool gemma2 = c.arch == "gemma2";
  KITE_ASSIGN_OR_RETURN(g.attn_softcap, r.get_float("attn_logit_softcapping", gemma2 ? 50.0 : 0.0));
  KITE_ASSIGN_OR_RETURN(g.final_softcap, r.get_float("final_logit_softcapping", gemma2 ? 30.0 : 0.0));
  if (g.attn_softcap < 0 || g.final_softcap < 0) return make_error(r.source(), ": negative logit soft-capping");
  if (!gemma2 && g.attn_softcap != 0)
    return make_error(r.source(), ": gemma3 with attn_logit_softcapping is not supported");
  if (!gemma2 && !g.rope_local_base) {
    KITE_ASSIGN_OR_RETURN(const double base, r.get_float("rope_local_base_freq", 10000.0));
    g.rope_local_base = base;
  }
  if (g.rope_local_base && *g.rope_local_base <= 0)
    return make_error(r.source(), ": rope_local_base_freq ", *g.rope_local_base, " must be positive");
  if (const Json* types = r.find("layer_types")) {
    if (!types->is_array() || static_cast<int64_t>(types->size()) != c.num_hidden_layers)
      return make_error(r.source(), ": 'layer_types' must list the ", c.num_hidden_layers, " layers");
    for (const Json& t : *types) {
      const std::string s = t.is_string() ? t.get<std::string>() : "";
      if (s != "sliding_attention" && s != "full_attention")
        return make_error(r.source(), ": 'layer_types' has '", safetensors::printable(t.dump(), 40),
                          "' (expected sliding_attention or full_attention)");
      g.sliding_layers.push_back(s == "sliding_attention");
    }
  } else {
    KITE_ASSIGN_OR_RETURN(g.pattern, r.get_int("sliding_window_pattern", gemma2 ? 2 : 6));
    if (g.pattern < 0 || g.pattern > std::numeric_limits<uint32_t>::max())
      return make_error(r.source(), ": sliding_window_pattern ", g.pattern, " is out of range");
  }
  if (r.find("sliding_window") != nullptr || gemma2) {
    KITE_ASSIGN_OR_RETURN(g.sliding_window, r.get_positive_u32("sliding_window", 4096));
  }
  return ok_status();
}

Status parse_special_ids(const Reader& r, Config& c) {
  auto read_id = [&](std::string_view key, std::optional<int64_t>& out) -> Status {
    const Json* v = r.find(key);
    if (v == nullptr) return ok_status();
    KITE_ASSIGN_OR_RETURN(int64_t id, r.to_int(*v, key));
    if (id < 0) return make_error(r.source(), ": '", key, "' = ", id, " is negative");
    out = id;
    return ok_status();
  };
  KITE_TRY(read_id("bos_token_id", c.bos_token_id));
  KITE_TRY(read_id("pad_token_id", c.pad_token_id));
  if (const Json* eos = r.find("eos_token_id")) {
    if (eos->is_array()) {
      for (const Json& e : *eos) {
        KITE_ASSIGN_OR_RETURN(int64_t id, r.to_int(e, "eos_token_id"));
        if (id < 0) return make_error(r.source(), ": 'eos_token_id' has a negative id");
        c.eos_token_ids.push_back(id);
      }
    } else {
      std::optional<int64_t> id;
      KITE_TRY(read_id("eos_token_id", id));
      c.eos_token_ids.push_back(*id);
    }
  }
  return ok_status();
}

}  // namespace

std::string supported_architectures() {
  std::string out;
  for (const ArchRow& row : kArchs) {
    if (!out.empty()) out += ", ";
    out += row.hf_architecture;
  }
  return out;
}

Result<Config> parse_config(std::string_view json_text, const std::string& source) {
  Json j;
  try {
    j = Json::parse(json_text.begin(), json_text.end());
  } catch (const std::exception& e) {
    return make_error(source, ": malformed JSON: ", safetensors::printable(e.what()));
  }
  if (!j.is_object()) return make_error(source, ": config is a JSON ", j.type_name(), ", not an object");
  Config c;
  KITE_ASSIGN_OR_RETURN(const ArchRow* row, find_arch(Reader(j, source), c));
  c.arch = std::string(row->arch);
  if (c.model_type.empty()) c.model_type = std::string(row->model_type);
  if (row->hf_architecture == "Gemma3ForConditionalGeneration") {
    // The text model: text_config over transformers' defaults; special ids from either.
    const auto text = j.find("text_config");
    if (text == j.end() || !text->is_object()) return make_error(source, ": no 'text_config' object");
    Json merged = Json::parse(kGemma3TextDefaults);
    merged.update(*text);
    for (const char* key : {"bos_token_id", "eos_token_id", "pad_token_id", "torch_dtype", "dtype"})
      if (!merged.contains(key) && j.contains(key)) merged[key] = j[key];
    j = std::move(merged);
  }
  Reader r(j, source);

  KITE_ASSIGN_OR_RETURN(c.vocab_size, r.get_positive_u32("vocab_size"));
  KITE_ASSIGN_OR_RETURN(c.hidden_size, r.get_positive_u32("hidden_size"));
  KITE_ASSIGN_OR_RETURN(c.intermediate_size, r.get_positive_u32("intermediate_size"));
  KITE_ASSIGN_OR_RETURN(c.num_hidden_layers, r.get_positive_u32("num_hidden_layers"));
  KITE_TRY(parse_heads(r, c));
  KITE_ASSIGN_OR_RETURN(c.rms_norm_eps, r.get_float("rms_norm_eps", 1e-6));
  if (c.rms_norm_eps <= 0) return make_error(source, ": rms_norm_eps ", c.rms_norm_eps, " must be positive");
  KITE_ASSIGN_OR_RETURN(c.max_position_embeddings, r.get_positive_u32("max_position_embeddings", row->default_context));
  KITE_TRY(parse_rope(r, c));
  if (c.rope_theta <= 0) return make_error(source, ": rope_theta ", c.rope_theta, " must be positive");
  KITE_ASSIGN_OR_RETURN(c.tie_word_embeddings, r.get_bool("tie_word_embeddings", false));
  KITE_ASSIGN_OR_RETURN(c.attention_bias, r.get_bool("attention_bias", false));
  c.attention_bias = c.attention_bias || row->always_qkv_bias;
  KITE_ASSIGN_OR_RETURN(c.mlp_bias, r.get_bool("mlp_bias", false));

  // Sliding window: mistral uses it whenever set; qwen2/qwen3 only with use_sliding_window.
  KITE_ASSIGN_OR_RETURN(bool use_swa, r.get_bool("use_sliding_window", c.model_type == "mistral"));
  if (use_swa && r.find("sliding_window") != nullptr) {
    KITE_ASSIGN_OR_RETURN(int64_t w, r.get_positive_u32("sliding_window"));
    c.sliding_window = w;
  }
  KITE_TRY(parse_experts(r, c));
  KITE_TRY(parse_gemma(r, c));
  KITE_TRY(parse_special_ids(r, c));
  KITE_ASSIGN_OR_RETURN(c.torch_dtype, r.get_string("torch_dtype", ""));
  if (c.torch_dtype.empty()) {
    KITE_ASSIGN_OR_RETURN(c.torch_dtype, r.get_string("dtype", ""));
  }
  return c;
}

Result<Config> load_config(const std::string& config_json_path) {
  KITE_ASSIGN_OR_RETURN(auto map, MappedFile::open(config_json_path));
  return parse_config(std::string_view(reinterpret_cast<const char*>(map->data()), map->size()), config_json_path);
}

void add_config_metadata(const Config& c, std::string_view model_name, gguf::Metadata& out) {
  const std::string a = c.arch + ".";
  auto u32 = [](int64_t x) { return gguf::Value(static_cast<uint32_t>(x)); };
  auto f32 = [](double x) { return gguf::Value(static_cast<float>(x)); };
  out.set("general.architecture", c.arch);
  out.set("general.name", std::string(model_name));
  out.set(a + "context_length", u32(c.max_position_embeddings));
  out.set(a + "embedding_length", u32(c.hidden_size));
  out.set(a + "block_count", u32(c.num_hidden_layers));
  out.set(a + "feed_forward_length", u32(c.intermediate_size));
  out.set(a + "attention.head_count", u32(c.num_attention_heads));
  out.set(a + "attention.head_count_kv", u32(c.num_key_value_heads));
  out.set(a + "rope.freq_base", f32(c.rope_theta));
  out.set(a + "attention.layer_norm_rms_epsilon", f32(c.rms_norm_eps));
  out.set(a + "rope.dimension_count", u32(c.head_dim));
  // llama.cpp derives head size from n_embd / n_head unless key_length says otherwise;
  // Qwen3's converter always writes it.
  if (c.head_dim_explicit && (c.arch == "qwen3" || c.arch == "qwen3moe" || c.arch == "gemma2" || c.arch == "gemma3" ||
                              c.head_dim * c.num_attention_heads != c.hidden_size)) {
    out.set(a + "attention.key_length", u32(c.head_dim));
    out.set(a + "attention.value_length", u32(c.head_dim));
  }
  out.set(a + "vocab_size", u32(c.vocab_size));
  if (c.num_experts > 0) {
    out.set(a + "expert_count", u32(c.num_experts));
    out.set(a + "expert_used_count", u32(c.num_experts_per_tok));
    if (c.arch == "qwen3moe") out.set(a + "expert_feed_forward_length", u32(c.moe_intermediate_size));
  }

  const Config::Gemma& g = c.gemma;
  if (g.sliding_window > 0) {
    out.set(a + "attention.sliding_window", u32(g.sliding_window));
    if (!g.sliding_layers.empty()) {
      gguf::Array flags{gguf::ValueType::BOOL, {}};
      for (bool f : g.sliding_layers) flags.items.emplace_back(f);
      out.set(a + "attention.sliding_window_pattern", std::move(flags));
    } else {
      out.set(a + "attention.sliding_window_pattern", u32(g.pattern));
    }
  }
  if (g.rope_local_base) out.set(a + "rope.freq_base_swa", f32(*g.rope_local_base));
  if (g.attn_softcap > 0) out.set(a + "attn_logit_softcapping", f32(g.attn_softcap));
  if (g.final_softcap > 0) out.set(a + "final_logit_softcapping", f32(g.final_softcap));

  const RopeScaling& s = c.rope_scaling;
  if (s.type == "linear" || s.type == "yarn") {
    out.set(a + "rope.scaling.type", s.type);
    out.set(a + "rope.scaling.factor", f32(s.factor));
  }
  if (s.type == "yarn") {
    if (s.original_max_position_embeddings > 0)
      out.set(a + "rope.scaling.original_context_length", u32(s.original_max_position_embeddings));
    if (s.attention_factor) out.set(a + "rope.scaling.attn_factor", f32(*s.attention_factor));
    if (s.ext_factor) out.set(a + "rope.scaling.yarn_ext_factor", f32(*s.ext_factor));
    if (s.beta_fast) out.set(a + "rope.scaling.yarn_beta_fast", f32(*s.beta_fast));
    if (s.beta_slow) out.set(a + "rope.scaling.yarn_beta_slow", f32(*s.beta_slow));
  }
}

std::vector<float> llama3_rope_factors(const Config& c) {
  std::vector<float> out;
  const RopeScaling& s = c.rope_scaling;
  if (s.type != "llama3") return out;
  const double old_ctx = static_cast<double>(s.original_max_position_embeddings);
  const double low_wavelen = old_ctx / s.low_freq_factor;
  const double high_wavelen = old_ctx / s.high_freq_factor;
  for (int64_t i = 0; i < c.head_dim; i += 2) {
    // Same arithmetic as the converter: the frequency in float32, the rest in double.
    const float freq =
        1.0f / std::pow(static_cast<float>(c.rope_theta), static_cast<float>(i) / static_cast<float>(c.head_dim));
    const double wavelen = 2.0 * M_PI / freq;
    double factor;
    if (wavelen < high_wavelen) {
      factor = 1.0;
    } else if (wavelen > low_wavelen) {
      factor = s.factor;
    } else {
      const double smooth = (old_ctx / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      factor = 1.0 / ((1.0 - smooth) / s.factor + smooth);
    }
    out.push_back(static_cast<float>(factor));
  }
  return out;
}

}  // namespace kite::hf

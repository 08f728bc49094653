#include "src/model/hparams.h"

#include <climits>
#include <cmath>

namespace kite {
namespace {

const char* const kSupported[] = {"llama", "qwen2", "qwen3", "qwen3moe", "gemma2", "gemma3"};

// gemma2's and gemma3's keys, as llama.cpp reads them (src/models/gemma2.cpp, gemma3.cpp).
Status read_gemma(const WeightSource& src, HParams& hp) {
  const gguf::Metadata& m = src.metadata();
  const std::string p = hp.arch + ".";
  const bool gemma2 = hp.arch == "gemma2";
  hp.gemma = true;
  auto read_float = [&](const std::string& key, float* v) -> Status {
    if (!m.has(key)) return ok_status();
    KITE_ASSIGN_OR_RETURN(const double d, m.get_float(key));
    if (!(d >= 0.0) || !std::isfinite(d)) return make_error(src.path(), ": ", key, " is ", d);
    *v = static_cast<float>(d);
    return ok_status();
  };
  // Soft-capping: gemma2's attention scores and logits (50 and 30 unless the file says),
  // gemma3's logits where the file asks.
  if (gemma2) {
    hp.attn_softcap = 50.f, hp.final_softcap = 30.f;
    KITE_TRY(read_float(p + "attn_logit_softcapping", &hp.attn_softcap));
  }
  KITE_TRY(read_float(p + "final_logit_softcapping", &hp.final_softcap));
  // The 27B models scale queries by their n_embd / n_head, not their head size.
  const bool big = hp.n_layer == (gemma2 ? 46 : 62);
  hp.attn_scale = 1.f / std::sqrt(static_cast<float>(big ? hp.n_embd / hp.n_head : hp.head_dim));
  // Sliding windows: gemma2's on every other layer (4096 unless the file says), gemma3's on 5 of
  // every 6 where the file has a window. gemma2's sliding layers rope as the others, gemma3's
  // with base 10000, unscaled (either: rope.freq_base_swa where the file has it).
  hp.swa_layer.assign(static_cast<size_t>(hp.n_layer), 0);
  hp.rope_swa = hp.rope;
  if (!gemma2) {
    hp.rope_swa.scaling = RopeScaling::kNone;
    hp.rope_swa.factor = 1.f;
    hp.rope_swa.freq_base = 10000.f;
  }
  int64_t window = gemma2 ? 4096 : 0;
  if (m.has(p + "attention.sliding_window")) {
    KITE_ASSIGN_OR_RETURN(window, m.get_int(p + "attention.sliding_window"));
  }
  if (window < 0 || window > INT32_MAX) return make_error(src.path(), ": ", p, "attention.sliding_window is ", window);
  if (window == 0) return ok_status();
  hp.n_swa = static_cast<int32_t>(window);
  // The pattern: a bool per layer, or every n-th layer global (the rest sliding).
  const std::string key = p + "attention.sliding_window_pattern";
  const gguf::Value* v = m.find(key);
  if (v != nullptr && v->get_if<gguf::Array>() != nullptr) {
    KITE_ASSIGN_OR_RETURN(const std::vector<bool> flags, m.get_array<bool>(key));
    if (flags.size() != hp.swa_layer.size())
      return make_error(src.path(), ": ", key, " has ", flags.size(), " entries for ", hp.n_layer, " layers");
    for (size_t il = 0; il < flags.size(); ++il) hp.swa_layer[il] = flags[il] ? 1 : 0;
  } else {
    int64_t every = gemma2 ? 2 : 6;
    if (v != nullptr) {
      KITE_ASSIGN_OR_RETURN(every, m.get_int(key));
    }
    if (every < 0) return make_error(src.path(), ": ", key, " is ", every);
    for (int64_t il = 0; il < hp.n_layer; ++il)
      hp.swa_layer[static_cast<size_t>(il)] = every == 0 || il % every < every - 1;
  }
  return read_float(p + "rope.freq_base_swa", &hp.rope_swa.freq_base);
}

}  // namespace

Result<HParams> HParams::from(const WeightSource& src) {
  const gguf::Metadata& m = src.metadata();
  HParams hp;
  KITE_ASSIGN_OR_RETURN(hp.arch, m.get<std::string>("general.architecture"));
  bool supported = false;
  for (const char* a : kSupported) supported |= hp.arch == a;
  if (!supported)
    return make_error(src.path(), ": architecture '", hp.arch,
                      "' is not supported (supported: llama, qwen2, qwen3, qwen3moe, gemma2, gemma3)");
  const std::string p = hp.arch + ".";
  KITE_ASSIGN_OR_RETURN(hp.n_embd, m.get_int(p + "embedding_length"));
  KITE_ASSIGN_OR_RETURN(hp.n_layer, m.get_int(p + "block_count"));
  KITE_ASSIGN_OR_RETURN(hp.n_head, m.get_int(p + "attention.head_count"));
  if (m.has(p + "expert_count")) {  // (0 in some dense files)
    KITE_ASSIGN_OR_RETURN(hp.n_expert, m.get_int(p + "expert_count"));
    if (hp.n_expert != 0) {
      KITE_ASSIGN_OR_RETURN(hp.n_expert_used, m.get_int(p + "expert_used_count"));
    }
  }
  if (hp.arch == "qwen3moe" && hp.n_expert == 0)
    return make_error(src.path(), ": a qwen3moe model without ", p, "expert_count");
  if (hp.n_expert != 0 && (hp.n_expert < 1 || hp.n_expert_used < 1 || hp.n_expert_used > hp.n_expert ||
                           hp.n_expert_used > kMaxTopK || hp.n_expert > (int64_t{1} << 24)))
    return make_error(src.path(), ": inconsistent experts: ", hp.n_expert_used, " used of ", hp.n_expert, " (at most ",
                      kMaxTopK, " used)");
  // (feed_forward_length: the dense FFN's width; an MoE file may leave it out.)
  if (hp.n_expert == 0 || m.has(p + "feed_forward_length")) {
    KITE_ASSIGN_OR_RETURN(hp.n_ff, m.get_int(p + "feed_forward_length"));
  }
  if (hp.n_expert != 0) {
    hp.n_ff_exp = hp.arch == "qwen3moe" ? hp.n_ff / hp.n_expert_used : hp.n_ff;  // (llama.cpp's defaults)
    if (m.has(p + "expert_feed_forward_length")) {
      KITE_ASSIGN_OR_RETURN(hp.n_ff_exp, m.get_int(p + "expert_feed_forward_length"));
    }
    if (m.has(p + "expert_weights_scale")) {
      KITE_ASSIGN_OR_RETURN(const double scale, m.get_float(p + "expert_weights_scale"));
      hp.expert_weights_scale = static_cast<float>(scale);
    }
  }
  hp.n_head_kv = m.has(p + "attention.head_count_kv") ? *m.get_int(p + "attention.head_count_kv") : hp.n_head;
  hp.n_ctx_train = m.has(p + "context_length") ? *m.get_int(p + "context_length") : 4096;
  if (hp.n_head <= 0 || hp.n_head_kv <= 0 || hp.n_head % hp.n_head_kv != 0 || hp.n_embd <= 0 || hp.n_layer <= 0)
    return make_error(src.path(), ": inconsistent attention shape: ", hp.n_head, " heads, ", hp.n_head_kv,
                      " kv heads, embedding ", hp.n_embd, ", ", hp.n_layer, " layers");
  hp.head_dim = m.has(p + "attention.key_length") ? *m.get_int(p + "attention.key_length") : hp.n_embd / hp.n_head;
  if (m.has(p + "attention.layer_norm_rms_epsilon"))
    hp.rms_eps = static_cast<float>(*m.get_float(p + "attention.layer_norm_rms_epsilon"));

  // Vocabulary: the embedding's row count is the truth; the key is optional.
  const TensorInfo* emb = src.find_tensor("token_embd.weight");
  if (emb == nullptr) return make_error(src.path(), ": missing tensor 'token_embd.weight'");
  hp.n_vocab = emb->ne.size() >= 2 ? emb->ne[1] : 0;

  RopeParams& r = hp.rope;
  r.n_rot = static_cast<int32_t>(m.has(p + "rope.dimension_count") ? *m.get_int(p + "rope.dimension_count") : hp.head_dim);
  if (m.has(p + "rope.freq_base")) r.freq_base = static_cast<float>(*m.get_float(p + "rope.freq_base"));
  // llama.cpp permutes llama's Q/K rows for the interleaved rope; HF order uses neox.
  r.mode = (hp.arch == "llama" && !src.qk_hf_order()) ? RopeMode::kNorm : RopeMode::kNeox;
  if (auto type = m.get<std::string>(p + "rope.scaling.type")) {
    const std::string& t = *type;
    if (m.has(p + "rope.scaling.factor")) r.factor = static_cast<float>(*m.get_float(p + "rope.scaling.factor"));
    if (m.has(p + "rope.scaling.original_context_length"))
      r.original_ctx = static_cast<int32_t>(*m.get_int(p + "rope.scaling.original_context_length"));
    if (t == "linear") {
      r.scaling = RopeScaling::kLinear;
    } else if (t == "yarn") {
      r.scaling = RopeScaling::kYarn;
      if (m.has(p + "rope.scaling.yarn_beta_fast")) r.beta_fast = static_cast<float>(*m.get_float(p + "rope.scaling.yarn_beta_fast"));
      if (m.has(p + "rope.scaling.yarn_beta_slow")) r.beta_slow = static_cast<float>(*m.get_float(p + "rope.scaling.yarn_beta_slow"));
      if (m.has(p + "rope.scaling.attn_factor")) r.attn_factor = static_cast<float>(*m.get_float(p + "rope.scaling.attn_factor"));
    } else if (t == "llama3") {
      r.scaling = RopeScaling::kLlama3;
      if (m.has(p + "rope.scaling.low_freq_factor")) r.low_freq_factor = static_cast<float>(*m.get_float(p + "rope.scaling.low_freq_factor"));
      if (m.has(p + "rope.scaling.high_freq_factor")) r.high_freq_factor = static_cast<float>(*m.get_float(p + "rope.scaling.high_freq_factor"));
    } else if (t != "none") {
      return make_error(src.path(), ": unsupported rope scaling type '", t, "'");
    }
  }
  if (hp.arch == "gemma2" || hp.arch == "gemma3") KITE_TRY(read_gemma(src, hp));
  return hp;
}

}  // namespace kite

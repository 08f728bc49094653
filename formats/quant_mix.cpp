#include "formats/quant_mix.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <regex>

#include "formats/quant/iq_grids.h"

namespace kite::quant {
namespace {

// llama_ftype ids (general.file_type).
// clang-format off
enum FileType : uint32_t {
  kAllF32 = 0, kF16 = 1, kQ4_0 = 2, kQ4_1 = 3, kQ8_0 = 7, kQ5_0 = 8, kQ5_1 = 9, kQ2_K = 10,
  kQ3_K_S = 11, kQ3_K_M = 12, kQ3_K_L = 13, kQ4_K_S = 14, kQ4_K_M = 15, kQ5_K_S = 16, kQ5_K_M = 17,
  kQ6_K = 18, kIQ2_XXS = 19, kIQ2_XS = 20, kQ2_K_S = 21, kIQ3_XS = 22, kIQ3_XXS = 23, kIQ1_S = 24,
  kIQ4_NL = 25, kIQ3_S = 26, kIQ3_M = 27, kIQ2_S = 28, kIQ2_M = 29, kIQ4_XS = 30, kIQ1_M = 31,
  kBF16 = 32, kGuessed = 1024,
};

constexpr std::array kMixes = {
    Mix{"Q2_K", kQ2_K, Type::Q2_K, false},     Mix{"Q3_K_S", kQ3_K_S, Type::Q3_K, false},
    Mix{"Q3_K_M", kQ3_K_M, Type::Q3_K, false}, Mix{"Q3_K_L", kQ3_K_L, Type::Q3_K, false},
    Mix{"Q4_K_S", kQ4_K_S, Type::Q4_K, false}, Mix{"Q4_K_M", kQ4_K_M, Type::Q4_K, false},
    Mix{"Q5_K_S", kQ5_K_S, Type::Q5_K, false}, Mix{"Q5_K_M", kQ5_K_M, Type::Q5_K, false},
    Mix{"Q6_K", kQ6_K, Type::Q6_K, false},     Mix{"Q4_0", kQ4_0, Type::Q4_0, false},
    Mix{"Q4_1", kQ4_1, Type::Q4_1, false},     Mix{"Q5_0", kQ5_0, Type::Q5_0, false},
    Mix{"Q5_1", kQ5_1, Type::Q5_1, false},     Mix{"Q8_0", kQ8_0, Type::Q8_0, false},
    Mix{"IQ4_NL", kIQ4_NL, Type::IQ4_NL, false}, Mix{"IQ4_XS", kIQ4_XS, Type::IQ4_XS, false},
    Mix{"Q2_K_S", kQ2_K_S, Type::Q2_K, false},
    // The codebook mixes. As in llama.cpp, IQ2_S is mostly IQ2_XS and IQ2_M mostly IQ2_S; IQ3_XS
    // and IQ3_M are IQ3_S with other rules.
    Mix{"IQ1_S", kIQ1_S, Type::IQ1_S, false},   Mix{"IQ1_M", kIQ1_M, Type::IQ1_M, false},
    Mix{"IQ2_XXS", kIQ2_XXS, Type::IQ2_XXS, false}, Mix{"IQ2_XS", kIQ2_XS, Type::IQ2_XS, false},
    Mix{"IQ2_S", kIQ2_S, Type::IQ2_XS, false},  Mix{"IQ2_M", kIQ2_M, Type::IQ2_S, false},
    Mix{"IQ3_XXS", kIQ3_XXS, Type::IQ3_XXS, false}, Mix{"IQ3_XS", kIQ3_XS, Type::IQ3_S, false},
    Mix{"IQ3_S", kIQ3_S, Type::IQ3_S, false},   Mix{"IQ3_M", kIQ3_M, Type::IQ3_S, false},
    Mix{"F16", kF16, Type::F16, false},        Mix{"BF16", kBF16, Type::BF16, false},
    Mix{"F32", kAllF32, Type::F32, false},
    // Plain types (every tensor in the one type): the K types without a mix of that name.
    Mix{"q3_K", kQ3_K_S, Type::Q3_K, true},    Mix{"q4_K", kQ4_K_S, Type::Q4_K, true},
    Mix{"q5_K", kQ5_K_S, Type::Q5_K, true},    Mix{"q8_1", kGuessed, Type::Q8_1, true},
    Mix{"q8_K", kGuessed, Type::Q8_K, true},
};
// clang-format on

bool iequal(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

bool contains(std::string_view s, std::string_view part) { return s.find(part) != std::string_view::npos; }
bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

int n_dims(const std::vector<int64_t>& ne) {
  int n = 1;
  for (size_t i = 0; i < ne.size(); ++i)
    if (ne[i] > 1) n = static_cast<int>(i) + 1;
  return n;
}

// llama-quantize quantizes only 2+-D weights that are not norms, expert gates or position tables.
bool is_quantizable(const gguf::TensorInfo& t) {
  const std::string_view n = t.name;
  return ends_with(n, "weight") && n_dims(t.ne) >= 2 && !contains(n, "_norm.weight") &&
         !contains(n, "ffn_gate_inp.weight") && n != "position_embd.weight" && n != "token_types.weight" &&
         !contains(n, "attn_rel_b.weight") && !contains(n, "ssm_conv1d.weight");
}

bool is_k_or_iq(Type t) {
  switch (t) {
    case Type::Q2_K: case Type::Q3_K: case Type::Q4_K: case Type::Q5_K: case Type::Q6_K: case Type::Q8_K:
    case Type::IQ4_XS: case Type::IQ2_XXS: case Type::IQ2_XS: case Type::IQ2_S: case Type::IQ3_XXS:
    case Type::IQ3_S: case Type::IQ1_S: case Type::IQ1_M:
      return true;
    default:
      return false;
  }
}

// llama.cpp's use_more_bits: the first and last eighth of the layers and every third between.
bool use_more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

struct State {
  uint32_t ftype = 0;
  std::string arch;
  bool has_output = false;
  bool has_imatrix = false;
  int n_gqa = 1;
  int n_expert = 1;
  int n_attention_wv = 0;
  int n_layer = 0;
  int i_attention_wv = 0;
  int i_ffn_down = 0;
  int i_ffn_gate = 0;
  int i_ffn_up = 0;
};

bool is_one_of(uint32_t ft, std::initializer_list<uint32_t> fts) {
  return std::find(fts.begin(), fts.end(), ft) != fts.end();
}

// The 1- and 2-bit codebook mixes share one set of rules.
bool is_low_bit(uint32_t ft) {
  return is_one_of(ft, {kIQ2_XXS, kIQ2_XS, kIQ1_S, kIQ2_S, kIQ2_M, kIQ1_M});
}

// The rules of the low-bit mixes for tensors inside the blocks.
Type low_bit_rule(State& s, Type t, std::string_view name) {
  const uint32_t ft = s.ftype;
  const bool iq2_s_m = ft == kIQ2_S || ft == kIQ2_M;
  if (contains(name, "attn_v.weight")) {
    ++s.i_attention_wv;
    if (s.n_gqa >= 4 || s.n_expert >= 4) return Type::Q4_K;
    return iq2_s_m ? Type::IQ3_S : Type::Q2_K;
  }
  if (s.n_expert == 8 && contains(name, "attn_k.weight")) return Type::Q4_K;
  if (contains(name, "ffn_down")) {
    if (s.i_ffn_down++ < s.n_layer / 8) return iq2_s_m ? Type::IQ3_S : Type::Q2_K;
    return t;
  }
  if (contains(name, "attn_output.weight")) {
    if (s.n_expert == 8) return Type::Q5_K;
    if (ft == kIQ1_S || ft == kIQ1_M) return Type::IQ2_XXS;
    if (iq2_s_m) return Type::IQ3_S;
  }
  return t;
}

// clang-format off
// The per-tensor rules of the mixes (llama_tensor_get_type).
Type rule_type(State& s, Type t, const gguf::TensorInfo& info) {
  const std::string_view name = info.name;
  const uint32_t ft = s.ftype;
  const bool falcon = s.arch == "falcon";
  if (name == "output.weight" || (!s.has_output && name == "token_embd.weight")) {
    if (falcon || info.ne[0] % 256 != 0) return Type::Q8_0;
    if (is_low_bit(ft) || ft == kIQ3_XXS) return Type::Q5_K;
    return t == Type::Q8_0 ? t : Type::Q6_K;
  }
  if (name == "token_embd.weight") {
    if (is_one_of(ft, {kIQ2_XXS, kIQ2_XS, kIQ1_S, kIQ1_M})) return Type::Q2_K;
    if (is_one_of(ft, {kIQ2_S, kIQ2_M, kIQ3_XXS})) return Type::IQ3_S;
    return t;
  }
  if (is_low_bit(ft)) return low_bit_rule(s, t, name);
  if (contains(name, "attn_v.weight")) {
    const int i = s.i_attention_wv++;
    if (ft == kQ2_K) t = s.n_gqa >= 4 ? Type::Q4_K : Type::Q3_K;
    else if (ft == kQ2_K_S && s.n_gqa >= 4) t = Type::Q4_K;
    else if (ft == kIQ3_XXS) t = s.n_gqa >= 4 ? Type::Q4_K : !s.has_imatrix ? Type::IQ3_S : Type::IQ3_XXS;
    else if ((ft == kIQ3_XS || ft == kIQ3_S) && s.n_gqa >= 4) t = Type::Q4_K;
    else if (ft == kIQ3_M) t = Type::Q4_K;
    else if (ft == kQ3_K_M) t = i < 2 ? Type::Q5_K : Type::Q4_K;
    else if (ft == kQ3_K_L) t = Type::Q5_K;
    else if ((ft == kIQ4_NL || ft == kIQ4_XS) && s.n_gqa >= 4) t = Type::Q5_K;
    else if ((ft == kQ4_K_M || ft == kQ5_K_M) && use_more_bits(i, s.n_attention_wv)) t = Type::Q6_K;
    else if (ft == kQ4_K_S && i < 4) t = Type::Q5_K;
    if (s.n_expert == 8) t = Type::Q8_0;
    return t;
  }
  if (contains(name, "attn_k.weight")) {
    if (s.n_expert == 8) return Type::Q8_0;
    if (ft == kIQ3_XS) return Type::IQ3_XXS;
    if (ft == kIQ3_XXS) return Type::IQ2_S;
    return t;
  }
  if (contains(name, "attn_q.weight")) {
    if (ft == kIQ3_XS) return Type::IQ3_XXS;
    if (ft == kIQ3_XXS) return Type::IQ2_S;
    return t;
  }
  if (contains(name, "ffn_down")) {
    const int i = s.i_ffn_down++;
    const int n = s.n_layer;
    if (ft == kQ2_K) t = Type::Q3_K;
    else if (ft == kQ2_K_S) t = i < n / 8 ? Type::Q4_K : t;
    else if (ft == kIQ3_XXS && !s.has_imatrix) t = i < n / 8 ? Type::Q4_K : Type::Q3_K;
    else if (ft == kQ3_K_M) t = i < n / 16 ? Type::Q5_K : (!falcon || use_more_bits(i, n)) ? Type::Q4_K : Type::Q3_K;
    else if (ft == kIQ3_M && (i < n / 8 || (s.n_expert == 8 && use_more_bits(i, n)))) t = Type::Q4_K;
    else if (ft == kQ3_K_L) t = falcon ? Type::Q4_K : Type::Q5_K;
    else if (ft == kQ4_K_M) {
      if (falcon) t = i < n / 16 ? Type::Q6_K : use_more_bits(i, n) ? Type::Q5_K : Type::Q4_K;
      else if (use_more_bits(i, n)) t = Type::Q6_K;
    } else if (i < n / 8 && (ft == kIQ4_NL || ft == kIQ4_XS) && !s.has_imatrix) t = Type::Q5_K;
    else if (ft == kQ5_K_M && use_more_bits(i, n)) t = Type::Q6_K;
    else if (ft == kQ4_K_S && !falcon && i < n / 8) t = Type::Q5_K;
    else if ((ft == kQ4_0 || ft == kQ5_0) && s.has_imatrix && i < n / 8) t = ft == kQ4_0 ? Type::Q4_1 : Type::Q5_1;
    return t;
  }
  if (contains(name, "attn_output.weight")) {
    if (falcon) return ft == kQ3_K_L ? Type::Q4_K : t;
    if (s.n_expert == 8) {
      if (is_one_of(ft, {kQ2_K, kIQ3_XS, kIQ3_XXS, kQ3_K_S, kQ3_K_M, kIQ4_NL, kQ4_K_S, kQ4_K_M, kIQ3_S, kIQ3_M,
                         kIQ4_XS}))
        t = Type::Q5_K;
      return t;
    }
    if (ft == kQ2_K) t = Type::Q3_K;
    else if (ft == kIQ3_XXS) t = Type::IQ3_S;
    else if (ft == kQ3_K_M || ft == kIQ3_M) t = Type::Q4_K;
    else if (ft == kQ3_K_L) t = Type::Q5_K;
    return t;
  }
  if (contains(name, "attn_qkv.weight")) {
    if (ft == kQ3_K_M || ft == kQ3_K_L || ft == kIQ3_M) t = Type::Q4_K;
    else if (ft == kQ4_K_M) t = Type::Q5_K;
    else if (ft == kQ5_K_M) t = Type::Q6_K;
    return t;
  }
  // IQ3_XS: the middle layers' ffn_gate / ffn_up get IQ3_XXS.
  const bool gate = contains(name, "ffn_gate"), up = contains(name, "ffn_up");
  if (gate || up) {
    const int i = gate ? s.i_ffn_gate++ : s.i_ffn_up++;
    if (ft == kIQ3_XS && i >= s.n_layer / 8 && i < 7 * s.n_layer / 8) t = Type::IQ3_XXS;
  }
  return t;
}
// clang-format on

// K/IQ types need rows of whole 256-blocks; llama.cpp falls back to a legacy type of similar size.
PlanEntry fit_row(Type t, int64_t ne0) {
  PlanEntry e{t, false};
  if (is_k_or_iq(t) && ne0 % 256 != 0) {
    e.fallback = true;
    switch (t) {
      case Type::Q4_K: e.type = Type::Q5_0; break;
      case Type::Q5_K: e.type = Type::Q5_1; break;
      case Type::Q6_K: e.type = Type::Q8_0; break;
      case Type::Q8_K: e.type = Type::Q8_0; break;
      case Type::Q2_K:
      case Type::Q3_K:
        e.type = Type::Q4_0;
        break;
      default:
        e.type = Type::IQ4_NL;
        break;  // IQ4_XS and the IQ1..IQ3 types
    }
  }
  const TypeTraits* tr = find_traits(e.type);
  if (tr == nullptr || ne0 % tr->block_size != 0) {
    e.type = Type::F16;
    e.fallback = true;
  }
  return e;
}

}  // namespace

bool needs_importance(const Mix& mix, std::string_view tensor, Type type) {
  if (tensor == "token_embd.weight" || tensor == "output.weight") return false;
  return (is_codebook_type(type) && type != Type::IQ3_S) || (type == Type::Q2_K && mix.file_type == kQ2_K_S);
}

Result<std::pair<std::string, Type>> parse_tensor_type(std::string_view arg) {
  const size_t eq = arg.rfind('=');
  if (eq == std::string_view::npos || eq == 0 || eq + 1 == arg.size())
    return make_error("tensor type '", arg, "': expected PATTERN=TYPE (e.g. attn_v=q8_0)");
  const std::string pattern(arg.substr(0, eq));
  const TypeTraits* tr = find_traits(arg.substr(eq + 1));
  if (tr == nullptr || !can_quantize(tr->type))
    return make_error("tensor type '", arg, "': '", arg.substr(eq + 1), "' is not a type kite can produce");
  try {
    std::regex check(pattern);
  } catch (const std::regex_error& e) {
    return make_error("tensor type '", arg, "': bad pattern: ", e.what());
  }
  return std::pair<std::string, Type>{pattern, tr->type};
}

const Mix* find_mix(std::string_view name) {
  for (const Mix& m : kMixes)
    if (iequal(m.name, name)) return &m;
  return nullptr;
}

std::vector<std::string> known_mix_names() {
  std::vector<std::string> out;
  for (const Mix& m : kMixes) out.emplace_back(m.name);
  return out;
}

Result<std::vector<PlanEntry>> plan_types(const Mix& mix, const std::vector<gguf::TensorInfo>& tensors,
                                          const gguf::Metadata& meta, const PlanOptions& opt) {
  State s;
  s.ftype = mix.file_type;
  s.has_imatrix = opt.has_imatrix;
  if (auto a = meta.get<std::string>("general.architecture")) s.arch = *a;
  const std::string p = s.arch + ".";
  auto get = [&](const std::string& key, int64_t dflt) {
    auto v = meta.get_int(p + key);
    return v ? *v : dflt;
  };
  const int64_t n_head = get("attention.head_count", 1);
  const int64_t n_head_kv = get("attention.head_count_kv", n_head);
  s.n_gqa = n_head_kv > 0 ? static_cast<int>(n_head / n_head_kv) : 1;
  s.n_expert = static_cast<int>(std::max<int64_t>(1, get("expert_count", 1)));
  for (const auto& t : tensors) {
    if (contains(t.name, "attn_v.weight") || contains(t.name, "attn_qkv.weight")) ++s.n_attention_wv;
    if (t.name == "output.weight") s.has_output = true;
  }
  s.n_layer = static_cast<int>(get("block_count", s.n_attention_wv));

  std::vector<std::pair<std::regex, Type>> patterns;
  for (const auto& [pattern, type] : opt.tensor_types) {
    try {
      patterns.emplace_back(std::regex(pattern), type);
    } catch (const std::regex_error& e) {
      return make_error("tensor type pattern '", pattern, "': ", e.what());
    }
  }
  const bool quantized_default = find_traits(mix.default_type)->is_quantized;
  std::vector<PlanEntry> plan;
  plan.reserve(tensors.size());
  for (const auto& t : tensors) {
    if (t.ne.empty()) return make_error(meta.source(), ": tensor '", t.name, "' has no dimensions");
    if (!is_quantizable(t)) {
      Type keep = t.type;
      if (opt.small_tensors_f32 && (keep == Type::F16 || keep == Type::BF16)) keep = Type::F32;
      plan.push_back({keep, false});
      continue;
    }
    Type want = mix.default_type;
    const bool embd = t.name == "token_embd.weight";
    if (embd && opt.token_embedding_type) {
      want = *opt.token_embedding_type;
    } else if (t.name == "output.weight" && opt.output_tensor_type) {
      want = *opt.output_tensor_type;
    } else if (quantized_default) {
      auto manual = std::find_if(patterns.begin(), patterns.end(),
                                 [&](const auto& p) { return std::regex_search(t.name, p.first); });
      if (manual != patterns.end())
        want = manual->second;  // (the rules' layer counters skip it, as llama.cpp's)
      else if (embd && !s.has_output && opt.output_tensor_type && !mix.pure && !opt.pure)
        want = *opt.output_tensor_type;
      else if (!mix.pure && !opt.pure)
        want = rule_type(s, want, t);
    }
    plan.push_back(fit_row(want, t.ne[0]));
  }
  return plan;
}

}  // namespace kite::quant

// Hugging Face folders: config.json, tokenizer files and tensors, checked against the GGUF files
// llama.cpp's tools made from the same models, plus hand-written variants and bad input.
#include <doctest/doctest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "formats/hf_config.h"
#include "formats/hf_names.h"
#include "formats/hf_tokenizer.h"
#include "formats/safetensors.h"
#include "formats/weight_source.h"
#include "src/base/half.h"
#include "tests/testdata.h"

using kite::WeightSource;
using kite::gguf::Value;

namespace {

struct Pair {
  const char* folder;  // models/<folder>
  const char* gguf;    // gguf/<file>
};
// llama-target has no f16 GGUF; its Q4_K_M file carries the same metadata.
const Pair kPairs[] = {
    {"llama-draft", "llama-draft-f16.gguf"},
    {"llama-target", "llama-target-Q4_K_M.gguf"},
    {"qwen2-tiny", "qwen2-tiny-f16.gguf"},
    {"qwen3-tiny", "qwen3-tiny-f16.gguf"},
};

std::unique_ptr<WeightSource> open_source(const std::string& path) {
  auto r = WeightSource::open(path);
  REQUIRE_MESSAGE(r.ok(), (r.ok() ? std::string() : r.error().message));
  return std::move(*r);
}

bool same_value(const Value& a, const Value& b) {
  if (a.type() != b.type()) return false;
  return std::visit(
      [&](const auto& x) -> bool {
        using T = std::decay_t<decltype(x)>;
        const T& y = std::get<T>(b.v);
        if constexpr (std::is_same_v<T, kite::gguf::Array>) {
          if (x.elem_type != y.elem_type || x.items.size() != y.items.size()) return false;
          for (size_t i = 0; i < x.items.size(); ++i)
            if (!same_value(x.items[i], y.items[i])) return false;
          return true;
        } else if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
          return std::memcmp(&x, &y, sizeof(T)) == 0;  // bit-exact
        } else {
          return x == y;
        }
      },
      a.v);
}

std::string show(const Value& v) {
  std::ostringstream os;
  os << kite::gguf::value_type_name(v.type()) << " ";
  std::visit(
      [&](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, kite::gguf::Array>) {
          os << "[" << x.items.size() << " items]";
          for (size_t i = 0; i < x.items.size() && i < 3; ++i) os << " " << show(x.items[i]);
        } else if constexpr (std::is_same_v<T, uint8_t> || std::is_same_v<T, int8_t>) {
          os << static_cast<int>(x);
        } else {
          os << x;
        }
      },
      v.v);
  return os.str();
}

// First index where two arrays differ, for a readable failure.
std::string first_difference(const Value& a, const Value& b) {
  const auto* x = a.get_if<kite::gguf::Array>();
  const auto* y = b.get_if<kite::gguf::Array>();
  if (x == nullptr || y == nullptr) return show(a) + " vs " + show(b);
  for (size_t i = 0; i < std::min(x->items.size(), y->items.size()); ++i)
    if (!same_value(x->items[i], y->items[i]))
      return "item " + std::to_string(i) + ": " + show(x->items[i]) + " vs " + show(y->items[i]);
  return "sizes " + std::to_string(x->items.size()) + " vs " + std::to_string(y->items.size());
}

bool is_tokenizer_key(const std::string& k) {
  return k.rfind("tokenizer.", 0) == 0;
}

// Values of a tensor as floats (f32 / f16 / bf16).
std::vector<float> to_float(const kite::TensorInfo& t) {
  std::vector<float> out(static_cast<size_t>(t.n_elements()));
  for (size_t i = 0; i < out.size(); ++i) {
    uint16_t h;
    switch (t.type) {
      case kite::quant::Type::F32:
        std::memcpy(&out[i], t.data + 4 * i, 4);
        break;
      case kite::quant::Type::F16:
        std::memcpy(&h, t.data + 2 * i, 2);
        out[i] = kite::fp16_to_fp32(h);
        break;
      case kite::quant::Type::BF16:
        std::memcpy(&h, t.data + 2 * i, 2);
        out[i] = kite::bf16_to_fp32(h);
        break;
      default:
        FAIL("unexpected type in ", t.name);
    }
  }
  return out;
}

// A float as stored in `type` and read back (what a converter writing `type` produces).
float round_to(kite::quant::Type type, float x) {
  if (type == kite::quant::Type::F16) return kite::fp16_to_fp32(kite::fp32_to_fp16(x));
  if (type == kite::quant::Type::BF16) return kite::bf16_to_fp32(kite::fp32_to_bf16(x));
  return x;
}

// llama.cpp's converter permutes the rows of llama's Q/K weights: within each head, rows are
// reordered from (two halves) to (interleaved pairs). GGUF row r = h*d + 2*i + j comes from HF
// row h*d + j*(d/2) + i. Returns the GGUF tensor in HF row order.
std::vector<float> unpermute_rows(const std::vector<float>& gguf_rows, int64_t n_rows, int64_t row_len,
                                  int64_t n_head) {
  std::vector<float> hf(gguf_rows.size());
  const int64_t d = n_rows / n_head;
  for (int64_t h = 0; h < n_head; ++h)
    for (int64_t i = 0; i < d / 2; ++i)
      for (int64_t j = 0; j < 2; ++j) {
        const int64_t src = h * d + 2 * i + j, dst = h * d + j * (d / 2) + i;
        std::memcpy(&hf[dst * row_len], &gguf_rows[src * row_len], sizeof(float) * row_len);
      }
  return hf;
}

void write_text(const std::filesystem::path& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary);
  f << s;
  REQUIRE(f.good());
}

std::string config_json(const std::string& extra, const std::string& arch = "LlamaForCausalLM") {
  return R"({"architectures": [")" + arch + R"("], "vocab_size": 1000, "hidden_size": 128,
    "intermediate_size": 256, "num_hidden_layers": 3, "num_attention_heads": 4,
    "max_position_embeddings": 4096, "rms_norm_eps": 1e-6)" +
         (extra.empty() ? "" : ", " + extra) + "}";
}

kite::hf::Config parse_ok(const std::string& json) {
  auto c = kite::hf::parse_config(json, "cfg.json");
  REQUIRE_MESSAGE(c.ok(), (c.ok() ? std::string() : c.error().message));
  return *c;
}

void expect_config_error(const std::string& json, const std::string& what) {
  auto c = kite::hf::parse_config(json, "cfg.json");
  REQUIRE_MESSAGE(!c.ok(), what);
  CHECK_MESSAGE(c.error().message.find("cfg.json") != std::string::npos, c.error().message);
  CHECK_MESSAGE(c.error().message.find(what) != std::string::npos, c.error().message, " / ", what);
}

}  // namespace

TEST_CASE("hf: config hyperparameters equal those in the GGUF files") {
  for (const auto& p : kPairs) {
    CAPTURE(p.folder);
    auto hf = open_source(kite::test::testdata(std::string("models/") + p.folder));
    auto gg = open_source(kite::test::testdata(std::string("gguf/") + p.gguf));
    CHECK(hf->format() == "safetensors");
    CHECK(gg->format() == "gguf");
    CHECK(hf->qk_hf_order());
    CHECK(!gg->qk_hf_order());
    CHECK(hf->arch().value() == gg->arch().value());
    int compared = 0;
    for (const auto& kv : gg->metadata().entries()) {
      if (is_tokenizer_key(kv.key) || kv.key == "general.file_type" || kv.key == "general.quantization_version")
        continue;
      CAPTURE(kv.key);
      const Value* mine = hf->metadata().find(kv.key);
      REQUIRE_MESSAGE(mine != nullptr, "HF folder lacks ", kv.key);
      CHECK_MESSAGE(same_value(*mine, kv.value), show(*mine), " vs GGUF ", show(kv.value));
      ++compared;
    }
    CHECK(compared >= 12);
  }
}

TEST_CASE("hf: tokenizer metadata equals the GGUF files key for key") {
  for (const auto& p : kPairs) {
    CAPTURE(p.folder);
    auto hf = open_source(kite::test::testdata(std::string("models/") + p.folder));
    auto gg = open_source(kite::test::testdata(std::string("gguf/") + p.gguf));
    int compared = 0;
    for (const auto& kv : gg->metadata().entries()) {
      if (!is_tokenizer_key(kv.key)) continue;
      CAPTURE(kv.key);
      const Value* mine = hf->metadata().find(kv.key);
      REQUIRE_MESSAGE(mine != nullptr, "HF folder lacks ", kv.key);
      CHECK_MESSAGE(same_value(*mine, kv.value), first_difference(*mine, kv.value));
      ++compared;
    }
    for (const auto& kv : hf->metadata().entries())
      if (is_tokenizer_key(kv.key)) CHECK_MESSAGE(gg->metadata().has(kv.key), "extra key ", kv.key);
    CHECK(compared == 11);
    CHECK(hf->metadata().get_array<std::string>("tokenizer.ggml.tokens")->size() == 4096);
    CHECK(hf->metadata().get_array<std::string>("tokenizer.ggml.merges")->size() == 3835);
  }
}

TEST_CASE("hf: weight source tensors equal the f16 GGUF tensors") {
  for (const auto& p : kPairs) {
    if (std::string(p.gguf).find("f16") == std::string::npos) continue;
    CAPTURE(p.folder);
    auto hf = open_source(kite::test::testdata(std::string("models/") + p.folder));
    auto gg = open_source(kite::test::testdata(std::string("gguf/") + p.gguf));
    const bool llama = hf->arch().value() == "llama";
    const int64_t n_head = hf->metadata().get_int("llama.attention.head_count").ok()
                               ? *hf->metadata().get_int("llama.attention.head_count")
                               : 0;
    const int64_t n_head_kv = hf->metadata().get_int("llama.attention.head_count_kv").ok()
                                  ? *hf->metadata().get_int("llama.attention.head_count_kv")
                                  : 0;
    CHECK(hf->tensors().size() == gg->tensors().size());
    int permuted = 0;
    for (const auto& g : gg->tensors()) {
      CAPTURE(g.name);
      const kite::TensorInfo* h = hf->find_tensor(g.name);
      REQUIRE_MESSAGE(h != nullptr, "HF source lacks ", g.name);
      CHECK(h->ne == g.ne);
      CHECK(h->nbytes == static_cast<uint64_t>(h->n_elements()) * (h->type == kite::quant::Type::F32 ? 4 : 2));
      std::vector<float> hv = to_float(*h), gv = to_float(g);
      REQUIRE(hv.size() == gv.size());
      const bool is_q = g.name.find("attn_q.weight") != std::string::npos;
      const bool is_k = g.name.find("attn_k.weight") != std::string::npos;
      if (llama && (is_q || is_k)) {
        gv = unpermute_rows(gv, g.ne[1], g.ne[0], is_q ? n_head : n_head_kv);
        ++permuted;
      }
      size_t mismatches = 0, first = 0;
      for (size_t i = 0; i < hv.size(); ++i) {
        const float want = round_to(g.type, hv[i]);
        if (std::memcmp(&gv[i], &want, 4) != 0 && mismatches++ == 0) first = i;
      }
      CHECK_MESSAGE(mismatches == 0, mismatches, " of ", hv.size(), " values differ; first at ", first, ": HF ",
                    hv[first], " GGUF ", gv[first]);
    }
    CHECK(permuted == (llama ? 4 : 0));
  }
}

TEST_CASE("hf: weight source errors name the folder and the problem") {
  const auto dir = kite::test::scratch_dir("hf-errors");
  auto expect = [](const std::string& path, const std::string& what) {
    auto r = WeightSource::open(path);
    REQUIRE_MESSAGE(!r.ok(), what);
    CHECK_MESSAGE(r.error().message.find(what) != std::string::npos, r.error().message, " / ", what);
  };
  expect((dir / "nothing-here").string(), "no such file or folder");
  expect(dir.string(), "no config.json");
  write_text(dir / "config.json", config_json("", "GPT2LMHeadModel"));
  expect(dir.string(),
         "unsupported architecture GPT2LMHeadModel (supported: LlamaForCausalLM, MistralForCausalLM, "
         "Qwen2ForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM, MixtralForCausalLM, Gemma2ForCausalLM, "
         "Gemma3ForCausalLM, Gemma3ForConditionalGeneration)");
  write_text(dir / "config.json", config_json(""));
  expect(dir.string(), "no tokenizer.json");
  std::filesystem::copy_file(kite::test::testdata("models/llama-draft/tokenizer.json"), dir / "tokenizer.json");
  write_text(dir / "config.json", config_json("").replace(config_json("").find("1000"), 4, "4096"));
  expect(dir.string(), "no model.safetensors");
  write_text(dir / "model.safetensors.index.json", R"({"weight_map": {"model.norm.weight": "model-1.safetensors"}})");
  expect(dir.string(), "model-1.safetensors");
  std::filesystem::remove(dir / "model.safetensors.index.json");
  // A checkpoint with a tensor the llama table does not know.
  const std::string header = R"({"model.embed_tokens.weight":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},
    "model.layers.0.mystery.weight":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})";
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  write_text(dir / "model.safetensors", bytes + header + std::string(8, '\0'));
  expect(dir.string(), "tensor 'model.layers.0.mystery.weight' has no known GGUF name for architecture 'llama'");
  // A layer beyond block_count.
  std::string h2 = header;
  h2.replace(h2.find("0.mystery"), 9, "7.mlp.up_proj");
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((h2.size() >> (8 * i)) & 0xff);
  write_text(dir / "model.safetensors", bytes + h2 + std::string(8, '\0'));
  expect(dir.string(), "is in layer 7 but config.json has 3 layers");
  // A file of the folder instead of the folder.
  expect(kite::test::testdata("models/qwen2-tiny/model.safetensors"), "pass the Hugging Face model folder");
}

TEST_CASE("hf: config.json variants") {
  using kite::gguf::Metadata;
  SUBCASE("defaults, top-level rope_theta, llama-style keys") {
    auto c = parse_ok(config_json(R"("rope_theta": 500000.0, "eos_token_id": [7, 9], "bos_token_id": 5)"));
    CHECK(c.arch == "llama");
    CHECK(c.num_key_value_heads == 4);
    CHECK(c.head_dim == 32);
    CHECK(!c.head_dim_explicit);
    CHECK(c.rope_theta == 500000.0);
    CHECK(c.rope_scaling.type == "none");
    CHECK(c.eos_token_ids == std::vector<int64_t>{7, 9});
    CHECK(c.bos_token_id == 5);
    CHECK(!c.attention_bias);
    Metadata m;
    kite::hf::add_config_metadata(c, "x", m);
    CHECK(m.get<uint32_t>("llama.block_count").value() == 3);
    CHECK(m.get<float>("llama.rope.freq_base").value() == 500000.0f);
    CHECK(m.get<float>("llama.attention.layer_norm_rms_epsilon").value() == 1e-6f);
    CHECK(m.get<uint32_t>("llama.rope.dimension_count").value() == 32);
    CHECK(!m.has("llama.attention.key_length"));
    CHECK(!m.has("llama.rope.scaling.type"));
    CHECK(m.get<std::string>("general.name").value() == "x");
  }
  SUBCASE("mistral is llama; sliding window kept") {
    auto c = parse_ok(config_json(R"("sliding_window": 4096, "num_key_value_heads": 2)", "MistralForCausalLM"));
    CHECK(c.arch == "llama");
    CHECK(c.model_type == "mistral");
    CHECK(c.sliding_window == 4096);
    CHECK(c.num_key_value_heads == 2);
  }
  SUBCASE("qwen2 always has q/k/v bias; sliding window only when used") {
    auto c = parse_ok(config_json(R"("sliding_window": 4096, "use_sliding_window": false)", "Qwen2ForCausalLM"));
    CHECK(c.arch == "qwen2");
    CHECK(c.attention_bias);
    CHECK(!c.sliding_window.has_value());
    auto d = parse_ok(config_json(R"("sliding_window": 1024, "use_sliding_window": true)", "Qwen2ForCausalLM"));
    CHECK(d.sliding_window == 1024);
  }
  SUBCASE("explicit head_dim different from hidden/heads writes key_length") {
    auto c = parse_ok(config_json(R"("head_dim": 64, "attention_bias": true)", "Qwen3ForCausalLM"));
    Metadata m;
    kite::hf::add_config_metadata(c, "x", m);
    CHECK(c.attention_bias);
    CHECK(m.get<uint32_t>("qwen3.attention.key_length").value() == 64);
    CHECK(m.get<uint32_t>("qwen3.attention.value_length").value() == 64);
    CHECK(m.get<uint32_t>("qwen3.rope.dimension_count").value() == 64);
  }
  SUBCASE("linear rope scaling") {
    auto c = parse_ok(config_json(R"("rope_scaling": {"type": "linear", "factor": 4.0})"));
    Metadata m;
    kite::hf::add_config_metadata(c, "x", m);
    CHECK(m.get<std::string>("llama.rope.scaling.type").value() == "linear");
    CHECK(m.get<float>("llama.rope.scaling.factor").value() == 4.0f);
    CHECK(kite::hf::llama3_rope_factors(c).empty());
  }
  SUBCASE("yarn in transformers 5 rope_parameters") {
    auto c = parse_ok(config_json(R"("rope_parameters": {"rope_type": "yarn", "rope_theta": 1000000.0,
        "factor": 4.0, "original_max_position_embeddings": 32768, "beta_fast": 32, "beta_slow": 1})",
                                  "Qwen3ForCausalLM"));
    CHECK(c.rope_theta == 1000000.0);
    Metadata m;
    kite::hf::add_config_metadata(c, "x", m);
    CHECK(m.get<std::string>("qwen3.rope.scaling.type").value() == "yarn");
    CHECK(m.get<float>("qwen3.rope.scaling.factor").value() == 4.0f);
    CHECK(m.get<uint32_t>("qwen3.rope.scaling.original_context_length").value() == 32768);
    CHECK(m.get<float>("qwen3.rope.scaling.yarn_beta_fast").value() == 32.0f);
    CHECK(m.get<float>("qwen3.rope.scaling.yarn_beta_slow").value() == 1.0f);
  }
  SUBCASE("llama3 rope scaling becomes rope_freqs factors") {
    auto c = parse_ok(config_json(R"("head_dim": 128, "rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3",
        "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})"));
    Metadata m;
    kite::hf::add_config_metadata(c, "x", m);
    CHECK(!m.has("llama.rope.scaling.type"));  // llama.cpp stores the factors as a tensor instead
    const auto f = kite::hf::llama3_rope_factors(c);
    REQUIRE(f.size() == 64);
    CHECK(f[0] == 1.0f);   // high frequencies untouched
    CHECK(f[63] == 8.0f);  // low frequencies scaled by factor
    int smooth = 0;
    for (float x : f) smooth += (x > 1.0f && x < 8.0f);
    CHECK(smooth > 0);
    for (size_t i = 1; i < f.size(); ++i) CHECK(f[i] >= f[i - 1]);
  }
  SUBCASE("Mixtral's experts: num_local_experts of intermediate_size") {
    auto c = parse_ok(config_json(R"("num_local_experts": 8, "num_experts_per_tok": 2)", "MixtralForCausalLM"));
    CHECK(c.arch == "llama");
    Metadata m;
    kite::hf::add_config_metadata(c, "x", m);
    CHECK(m.get<uint32_t>("llama.expert_count").value() == 8);
    CHECK(m.get<uint32_t>("llama.expert_used_count").value() == 2);
    CHECK(!m.has("llama.expert_feed_forward_length"));  // (the experts' width is feed_forward_length)
  }
  SUBCASE("bad configs") {
    expect_config_error(config_json(R"("num_local_experts": 2, "num_experts_per_tok": 3)", "MixtralForCausalLM"),
                        "num_experts_per_tok 3 is more than the 2 experts");
    expect_config_error(config_json(R"("num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
        "norm_topk_prob": false)",
                                    "Qwen3MoeForCausalLM"),
                        "a Qwen3-MoE layout kite does not run");
    expect_config_error(config_json(R"("num_experts": 8, "num_experts_per_tok": 2)", "Qwen3MoeForCausalLM"),
                        "missing required key 'moe_intermediate_size'");
    expect_config_error("{", "malformed JSON");
    expect_config_error("[]", "not an object");
    expect_config_error(R"({"architectures": ["BertModel"]})", "unsupported architecture BertModel (supported: ");
    expect_config_error(R"({"model_type": "gpt2"})", "unsupported architecture model_type gpt2");
    expect_config_error(R"({"architectures": []})", "'architectures' must be a non-empty array");
    expect_config_error(R"({"architectures": ["LlamaForCausalLM"]})", "missing required key 'vocab_size'");
    expect_config_error(config_json(R"("num_key_value_heads": 3)"), "not a multiple of num_key_value_heads");
    expect_config_error(config_json(R"("num_attention_heads": 5)"), "hidden_size 128 is not a multiple");
    expect_config_error(config_json(R"("head_dim": 33)"), "head_dim 33 must be even");
    expect_config_error(config_json(R"("rope_scaling": {"type": "longrope", "factor": 2})"),
                        "unsupported rope scaling type 'longrope'");
    expect_config_error(config_json(R"("rope_scaling": {"type": "linear", "factor": -2})"), "must be positive");
    expect_config_error(config_json(R"("tie_word_embeddings": "yes")"), "'tie_word_embeddings' must be a boolean");
    expect_config_error(config_json(R"("eos_token_id": -1)"), "negative");
    expect_config_error(R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 1e30})",
                        "'vocab_size' must be an integer");
    expect_config_error(R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 0})", "out of range");
  }
}

TEST_CASE("hf: tensor name tables") {
  auto name = [](const char* arch, const char* hf) -> std::string {
    auto r = kite::hf::gguf_tensor_name(arch, hf);
    REQUIRE_MESSAGE(r.ok(), (r.ok() ? std::string() : r.error().message));
    return r->has_value() ? **r : std::string("<skip>");
  };
  CHECK(name("llama", "model.embed_tokens.weight") == "token_embd.weight");
  CHECK(name("llama", "model.norm.weight") == "output_norm.weight");
  CHECK(name("llama", "lm_head.weight") == "output.weight");
  CHECK(name("llama", "model.layers.0.self_attn.q_proj.weight") == "blk.0.attn_q.weight");
  CHECK(name("llama", "model.layers.12.self_attn.k_proj.weight") == "blk.12.attn_k.weight");
  CHECK(name("llama", "model.layers.3.self_attn.v_proj.weight") == "blk.3.attn_v.weight");
  CHECK(name("llama", "model.layers.3.self_attn.o_proj.weight") == "blk.3.attn_output.weight");
  CHECK(name("qwen2", "model.layers.1.self_attn.q_proj.bias") == "blk.1.attn_q.bias");
  CHECK(name("llama", "model.layers.1.input_layernorm.weight") == "blk.1.attn_norm.weight");
  CHECK(name("llama", "model.layers.1.post_attention_layernorm.weight") == "blk.1.ffn_norm.weight");
  CHECK(name("llama", "model.layers.1.mlp.gate_proj.weight") == "blk.1.ffn_gate.weight");
  CHECK(name("llama", "model.layers.1.mlp.up_proj.weight") == "blk.1.ffn_up.weight");
  CHECK(name("llama", "model.layers.1.mlp.down_proj.weight") == "blk.1.ffn_down.weight");
  CHECK(name("qwen3", "model.layers.1.self_attn.q_norm.weight") == "blk.1.attn_q_norm.weight");
  CHECK(name("qwen3", "model.layers.1.self_attn.k_norm.weight") == "blk.1.attn_k_norm.weight");
  CHECK(name("llama", "model.layers.1.self_attn.rotary_emb.inv_freq") == "<skip>");
  for (const char* bad : {"model.layers.1.self_attn.q_norm.weight", "model.layers.x.mlp.up_proj.weight",
                          "model.layers.01.mlp.up_proj.weight", "model.layers..mlp.up_proj.weight",
                          "model.layers.1.mlp.up_proj", "transformer.wte.weight", ""}) {
    CAPTURE(bad);
    auto r = kite::hf::gguf_tensor_name("llama", bad);
    REQUIRE(!r.ok());
    CHECK(r.error().message.find(std::string("'") + bad + "'") != std::string::npos);
  }
  CHECK(!kite::hf::gguf_tensor_name("gpt2", "model.norm.weight").ok());
  // Mixture of experts: the routers by name, the experts' matrices as pieces of a stacked tensor.
  CHECK(name("qwen3moe", "model.layers.2.mlp.gate.weight") == "blk.2.ffn_gate_inp.weight");
  CHECK(name("qwen3moe", "model.layers.2.self_attn.k_norm.weight") == "blk.2.attn_k_norm.weight");
  CHECK(name("llama", "model.layers.2.block_sparse_moe.gate.weight") == "blk.2.ffn_gate_inp.weight");
  auto piece = [](const char* arch, const char* hf) {
    auto p = kite::hf::expert_piece(arch, hf);
    return p ? p->gguf_name + " #" + std::to_string(p->expert) : std::string("-");
  };
  CHECK(piece("qwen3moe", "model.layers.3.mlp.experts.17.gate_proj.weight") == "blk.3.ffn_gate_exps.weight #17");
  CHECK(piece("qwen3moe", "model.layers.3.mlp.experts.0.up_proj.weight") == "blk.3.ffn_up_exps.weight #0");
  CHECK(piece("qwen3moe", "model.layers.30.mlp.experts.127.down_proj.weight") == "blk.30.ffn_down_exps.weight #127");
  CHECK(piece("llama", "model.layers.1.block_sparse_moe.experts.7.w1.weight") == "blk.1.ffn_gate_exps.weight #7");
  CHECK(piece("llama", "model.layers.1.block_sparse_moe.experts.7.w3.weight") == "blk.1.ffn_up_exps.weight #7");
  CHECK(piece("llama", "model.layers.1.block_sparse_moe.experts.7.w2.weight") == "blk.1.ffn_down_exps.weight #7");
  for (const char* no :
       {"model.layers.3.mlp.experts.01.up_proj.weight", "model.layers.3.mlp.experts.x.up_proj.weight",
        "model.layers.3.mlp.experts.1.up_proj.bias", "model.layers.3.mlp.up_proj.weight",
        "model.layers.3.mlp.experts.1.w1.weight", "model.layers.3.block_sparse_moe.experts.1.w4.weight"})
    CHECK_MESSAGE(piece("qwen3moe", no) == "-", no);
  CHECK(piece("qwen3", "model.layers.3.mlp.experts.1.up_proj.weight") == "-");
}

TEST_CASE("hf: tokenizer variants") {
  using kite::gguf::Metadata;
  auto convert = [](const std::string& tok, const std::string& cfg, kite::hf::TokenizerHints hints = {}) {
    kite::hf::TokenizerFiles files;
    files.tokenizer_json = tok;
    files.tokenizer_config_json = cfg;
    files.source = "tok";
    Metadata m("tok");
    auto st = kite::hf::add_tokenizer_metadata(files, hints, m);
    REQUIRE_MESSAGE(st.ok(), (st.ok() ? std::string() : st.error().message));
    return m;
  };
  auto convert_error = [](const std::string& tok, const std::string& what) {
    kite::hf::TokenizerFiles files;
    files.tokenizer_json = tok;
    files.source = "tok";
    Metadata m("tok");
    auto st = kite::hf::add_tokenizer_metadata(files, {}, m);
    REQUIRE_MESSAGE(!st.ok(), what);
    CHECK_MESSAGE(st.error().message.find(what) != std::string::npos, st.error().message, " / ", what);
  };
  const std::string gpt2 = R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "a b": 3},
      "merges": [["a", "b"], ["a", " b"]]},
    "added_tokens": [{"id": 4, "content": "<|im_end|>", "special": false},
                     {"id": 5, "content": "<tool>", "special": false},
                     {"id": 6, "content": "<eos>", "special": true}],
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false},
    "decoder": {"type": "ByteLevel"},
    "post_processor": {"type": "TemplateProcessing", "single": [{"Sequence": {"id": "A"}}, {"SpecialToken": {"id": "<eos>"}}]}})";
  SUBCASE("byte-level BPE: gpt-2 regex, pair merges, token types, holes") {
    kite::hf::TokenizerHints hints;
    hints.n_vocab = 9;
    Metadata m = convert(gpt2, R"({"eos_token": {"content": "<eos>"}, "chat_template": [
        {"name": "default", "template": "D"}, {"name": "tool_use", "template": "T"}]})",
                         hints);
    CHECK(m.get<std::string>("tokenizer.ggml.model").value() == "gpt2");
    CHECK(m.get<std::string>("tokenizer.ggml.pre").value() == "gpt-2");
    auto tokens = m.get_array<std::string>("tokenizer.ggml.tokens").value();
    REQUIRE(tokens.size() == 9);
    CHECK(tokens[5] == "<tool>");
    CHECK(tokens[7] == "[PAD7]");
    auto types = m.get_array<int32_t>("tokenizer.ggml.token_type").value();
    CHECK(types == std::vector<int32_t>{1, 1, 1, 1, 3, 4, 3, 5, 5});
    auto merges = m.get_array<std::string>("tokenizer.ggml.merges").value();
    CHECK(merges == std::vector<std::string>{"a b",
                                             "a \xc4\xa0"
                                             "b"});
    CHECK(m.get<uint32_t>("tokenizer.ggml.eos_token_id").value() == 6);
    CHECK(m.get<uint32_t>("tokenizer.ggml.eot_token_id").value() == 4);
    CHECK(m.get<bool>("tokenizer.ggml.add_eos_token").value() == true);
    CHECK(!m.has("tokenizer.ggml.add_bos_token"));
    CHECK(m.get<std::string>("tokenizer.chat_template").value() == "D");
    CHECK(m.get<std::string>("tokenizer.chat_template.tool_use").value() == "T");
  }
  SUBCASE("qwen2 regex") {
    std::string t = gpt2;
    const std::string old = R"({"type": "ByteLevel", "add_prefix_space": false})";
    t.replace(
        t.find(old), old.size(),
        R"({"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}}, {"type": "ByteLevel", "use_regex": false}]})");
    Metadata m = convert(t, "");
    CHECK(m.get<std::string>("tokenizer.ggml.pre").value() == "qwen2");
    CHECK(m.get_array<std::string>("tokenizer.ggml.tokens")->size() == 7);
  }
  SUBCASE("BPE with byte fallback is the llama (SentencePiece) model") {
    const std::string spm = R"({"model": {"type": "BPE", "byte_fallback": true, "unk_token": "<unk>",
        "vocab": {"<unk>": 0, "<s>": 1, "</s>": 2, "<0x0A>": 3, "\u2581": 4, "t": 5, "\u2581t": 6, "th": 7, "h": 8},
        "merges": ["\u2581 t", "t h"]},
      "added_tokens": [{"id": 0, "content": "<unk>", "special": true}, {"id": 1, "content": "<s>", "special": true},
                       {"id": 2, "content": "</s>", "special": true}],
      "normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "\u2581"}]},
      "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>"}}, {"Sequence": {"id": "A"}}]}})";
    Metadata m =
        convert(spm, R"({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "add_eos_token": false})");
    CHECK(m.get<std::string>("tokenizer.ggml.model").value() == "llama");
    CHECK(m.get<std::string>("tokenizer.ggml.pre").value() == "default");
    CHECK(m.get_array<int32_t>("tokenizer.ggml.token_type").value() == std::vector<int32_t>{3, 3, 3, 6, 1, 1, 1, 1, 1});
    CHECK(m.get_array<float>("tokenizer.ggml.scores").value() == std::vector<float>{0, 0, 0, 0, 0, 0, -1, -2, 0});
    CHECK(!m.has("tokenizer.ggml.merges"));
    CHECK(m.get<bool>("tokenizer.ggml.add_space_prefix").value());
    CHECK(m.get<uint32_t>("tokenizer.ggml.bos_token_id").value() == 1);
    CHECK(m.get<uint32_t>("tokenizer.ggml.eos_token_id").value() == 2);
    CHECK(m.get<uint32_t>("tokenizer.ggml.unknown_token_id").value() == 0);
    CHECK(m.get<bool>("tokenizer.ggml.add_bos_token").value());
    CHECK(!m.get<bool>("tokenizer.ggml.add_eos_token").value());
  }
  SUBCASE("errors") {
    convert_error("{", "malformed JSON");
    convert_error(R"({"model": {"type": "WordPiece", "vocab": {}}})", "'WordPiece' is not supported");
    convert_error(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}})", "BPE without byte-level");
    convert_error(R"({"model": {"type": "BPE", "vocab": {"a": -1}}})", "non-negative integer id");
    convert_error(
        R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 0}}, "decoder": {"type": "ByteLevel"}, "pre_tokenizer": {"type": "ByteLevel"}})",
        "share id 0");
    convert_error(
        R"({"model": {"type": "BPE", "vocab": {"a": 4000000000}}, "decoder": {"type": "ByteLevel"}, "pre_tokenizer": {"type": "ByteLevel"}})",
        "far beyond");
    convert_error(
        R"({"model": {"type": "BPE", "vocab": {"a": 0}}, "pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": "\\s+"}}, {"type": "ByteLevel"}]}})",
        "unknown pre-tokenizer regex '\\s+'");
    kite::hf::TokenizerFiles files;
    files.tokenizer_json = gpt2;
    files.source = "tok";
    Metadata m;
    kite::hf::TokenizerHints small;
    small.n_vocab = 3;
    auto st = kite::hf::add_tokenizer_metadata(files, small, m);
    REQUIRE(!st.ok());
    CHECK(st.error().message.find("does not fit the vocabulary size 3") != std::string::npos);
  }
  CHECK(kite::hf::tokenizer_json_path("/m") == "/m/tokenizer.json");
}

namespace {

// Writes a safetensors file holding `tensors` (copied from another checkpoint).
void write_safetensors(const std::filesystem::path& p, const std::vector<const kite::safetensors::Tensor*>& tensors) {
  std::string header = "{";
  std::string data;
  for (const auto* t : tensors) {
    if (header.size() > 1) header += ",";
    header += "\"" + t->name + "\":{\"dtype\":\"" + t->dtype + "\",\"shape\":[";
    for (size_t i = 0; i < t->shape.size(); ++i) {
      if (i > 0) header += ',';
      header += std::to_string(t->shape[i]);
    }
    header +=
        "],\"data_offsets\":[" + std::to_string(data.size()) + "," + std::to_string(data.size() + t->nbytes) + "]}";
    data.append(reinterpret_cast<const char*>(t->data), t->nbytes);
  }
  header += "}";
  std::string len(8, '\0');
  for (int i = 0; i < 8; ++i) len[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  write_text(p, len + header + data);
}

}  // namespace

TEST_CASE("hf: sharded folder gives the same source as the single file") {
  const std::string model = kite::test::testdata("models/llama-draft");
  const auto dir = kite::test::scratch_dir("hf-sharded");
  for (const char* f : {"config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"})
    std::filesystem::copy_file(std::filesystem::path(model) / f, dir / f);
  auto single = kite::safetensors::File::open(model + "/model.safetensors");
  REQUIRE(single.ok());
  std::vector<const kite::safetensors::Tensor*> a, b;
  std::string weight_map;
  for (const auto& t : single->tensors()) {
    const bool first = t.name.find("layers.1.") == std::string::npos;
    (first ? a : b).push_back(&t);
    weight_map += std::string(weight_map.empty() ? "" : ",") + "\"" + t.name + "\":\"model-0000" + (first ? "1" : "2") +
                  "-of-00002.safetensors\"";
  }
  write_safetensors(dir / "model-00001-of-00002.safetensors", a);
  write_safetensors(dir / "model-00002-of-00002.safetensors", b);
  write_text(dir / "model.safetensors.index.json", "{\"metadata\":{},\"weight_map\":{" + weight_map + "}}");

  auto sharded = open_source(dir.string());
  auto ref = open_source(model);
  REQUIRE(sharded->tensors().size() == ref->tensors().size());
  for (const auto& t : ref->tensors()) {
    CAPTURE(t.name);
    const kite::TensorInfo* s = sharded->find_tensor(t.name);
    REQUIRE(s != nullptr);
    CHECK(s->type == t.type);
    CHECK(s->ne == t.ne);
    REQUIRE(s->nbytes == t.nbytes);
    CHECK(std::memcmp(s->data, t.data, t.nbytes) == 0);
  }
  CHECK(sharded->metadata().size() == ref->metadata().size());
  // general.name comes from the folder name.
  CHECK(sharded->metadata().get<std::string>("general.name").value() == "hf-sharded");

  // llama3 rope scaling in config.json adds rope_freqs.weight, as llama.cpp's converter does.
  std::string cfg = kite::test::read_file(model + "/config.json");
  const std::string old = R"("rope_type": "default")";
  REQUIRE(cfg.find(old) != std::string::npos);
  cfg.replace(cfg.find(old), old.size(),
              R"("rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                 "original_max_position_embeddings": 512)");
  write_text(dir / "config.json", cfg);
  auto scaled = open_source(dir.string());
  const kite::TensorInfo* rf = scaled->find_tensor("rope_freqs.weight");
  REQUIRE(rf != nullptr);
  CHECK(rf->type == kite::quant::Type::F32);
  CHECK(rf->ne == std::vector<int64_t>{32});
  const std::vector<float> f = to_float(*rf);
  CHECK(f.front() == 1.0f);
  CHECK(f.back() == 8.0f);
  CHECK(scaled->tensors().size() == ref->tensors().size() + 1);
}

// Synthetic benchmark models (src/model/synthetic): the shapes are the real models', and a
// llama.cpp mix gives each tensor the type llama-quantize would. The 8B model is checked through
// its plan (names, shapes, types, bytes) only: building it takes gigabytes.
#include <doctest/doctest.h>

#include <cmath>
#include <map>
#include <nlohmann/json.hpp>

#include "backends/cpu/cpu_features.h"
#include "formats/quant/types.h"
#include "src/model/model.h"
#include "src/model/synthetic.h"
#include "src/runtime/context.h"
#include "tests/process.h"

using namespace kite;
using kite::test::run_kite;

namespace {

std::map<quant::Type, int> type_counts(const SyntheticPlan& p) {
  std::map<quant::Type, int> n;
  for (const auto& t : p.tensors) ++n[t.type];
  return n;
}

const gguf::TensorInfo& find(const SyntheticPlan& p, const std::string& name) {
  for (const auto& t : p.tensors)
    if (t.name == name) return t;
  FAIL("no tensor ", name);
  return p.tensors.front();
}

// llama.cpp's use_more_bits(i, n): the layers whose attn_v and ffn_down Q4_K_M puts in Q6_K.
bool more_bits(int i, int n) {
  return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

}  // namespace

TEST_CASE("synthetic: llama-8b is Llama-3-8B, and q4_K_M gives llama.cpp's Q4_K_M tensor types") {
  auto plan = plan_synthetic("llama-8b", "q4_K_M");
  REQUIRE_MESSAGE(plan.ok(), (plan.ok() ? std::string() : plan.error().message));
  const SyntheticShape& s = *plan->shape;
  CHECK(s.n_vocab == 128256);
  CHECK(s.n_embd == 4096);
  CHECK(s.n_layer == 32);
  CHECK(s.n_ff == 14336);
  CHECK(s.n_head == 32);
  CHECK(s.n_head_kv == 8);
  CHECK(s.rope_theta == 500000.f);
  CHECK(plan->name == "synthetic-llama-8b-Q4_K_M");

  // Meta-Llama-3-8B has 8,030,261,248 parameters in 291 tensors.
  int64_t params = 0;
  for (const auto& t : plan->tensors) params += t.n_elements();
  CHECK(params == 8030261248);
  REQUIRE(plan->tensors.size() == 291);
  CHECK(find(*plan, "token_embd.weight").ne == std::vector<int64_t>{4096, 128256});
  CHECK(find(*plan, "output.weight").ne == std::vector<int64_t>{4096, 128256});
  CHECK(find(*plan, "blk.0.attn_k.weight").ne == std::vector<int64_t>{4096, 1024});
  CHECK(find(*plan, "blk.31.ffn_down.weight").ne == std::vector<int64_t>{14336, 4096});

  // llama.cpp's log of its Q4_K_M Llama-3-8B: "type f32: 65 tensors, type q4_K: 193, type q6_K: 33".
  const auto n = type_counts(*plan);
  CHECK(n.size() == 3);
  CHECK(n.at(quant::Type::F32) == 65);
  CHECK(n.at(quant::Type::Q4_K) == 193);
  CHECK(n.at(quant::Type::Q6_K) == 33);
  CHECK(find(*plan, "output.weight").type == quant::Type::Q6_K);
  CHECK(find(*plan, "token_embd.weight").type == quant::Type::Q4_K);
  CHECK(find(*plan, "output_norm.weight").type == quant::Type::F32);
  for (int l = 0; l < 32; ++l) {
    CAPTURE(l);
    const std::string b = "blk." + std::to_string(l) + ".";
    const quant::Type more = more_bits(l, 32) ? quant::Type::Q6_K : quant::Type::Q4_K;
    CHECK(find(*plan, b + "attn_v.weight").type == more);
    CHECK(find(*plan, b + "ffn_down.weight").type == more);
    for (const char* w : {"attn_q", "attn_k", "attn_output", "ffn_gate", "ffn_up"})
      CHECK(find(*plan, b + w + ".weight").type == quant::Type::Q4_K);
    CHECK(find(*plan, b + "attn_norm.weight").type == quant::Type::F32);
  }
  // Bytes: 4.58 GiB of tensor data, as in llama.cpp's file of the real model (4.58 GiB, 4.89 BPW).
  uint64_t bytes = 0;
  for (const auto& t : plan->tensors) bytes += t.nbytes;
  CHECK(bytes == plan->total_bytes);
  const double gib = static_cast<double>(bytes) / double(1ull << 30);
  MESSAGE("llama-8b q4_K_M: ", gib, " GiB, ", 8.0 * static_cast<double>(bytes) / static_cast<double>(params), " BPW");
  CHECK(gib == doctest::Approx(4.58).epsilon(0.005));
}

TEST_CASE("synthetic: qwen2-7b and qwen3-8b are Qwen2.5-7B and Qwen3-8B, with their biases and head norms") {
  struct Want {
    const char* shape;
    int64_t n_layer, n_embd, q_rows, kv_rows, n_ff, n_vocab;
    double gib;  // Q4_K_M: the size of the published Q4_K_M files (4.68 and 5.03 GB)
  };
  for (const Want& w : {Want{"qwen2-7b", 28, 3584, 3584, 512, 18944, 152064, 4.36},
                        Want{"qwen3-8b", 36, 4096, 4096, 1024, 12288, 151936, 4.68}}) {
    const std::string shape = w.shape;
    CAPTURE(shape);
    auto plan = plan_synthetic(shape, "q4_K_M");
    REQUIRE_MESSAGE(plan.ok(), (plan.ok() ? std::string() : plan.error().message));
    const bool qwen2 = shape == "qwen2-7b";
    CHECK(plan->shape->arch == (qwen2 ? "qwen2" : "qwen3"));
    CHECK(plan->shape->n_layer == w.n_layer);
    CHECK(find(*plan, "blk.0.attn_q.weight").ne == std::vector<int64_t>{w.n_embd, w.q_rows});
    CHECK(find(*plan, "blk.0.attn_k.weight").ne == std::vector<int64_t>{w.n_embd, w.kv_rows});
    CHECK(find(*plan, "blk.0.ffn_down.weight").ne == std::vector<int64_t>{w.n_ff, w.n_embd});
    CHECK(find(*plan, "output.weight").ne == std::vector<int64_t>{w.n_embd, w.n_vocab});
    // F32 1-D tensors: the two norms a layer, the output norm, and qwen2's three biases or
    // qwen3's two head norms (of the head dimension, 128) a layer.
    CHECK(type_counts(*plan).at(quant::Type::F32) == (qwen2 ? 5 : 4) * w.n_layer + 1);
    if (qwen2) {
      CHECK(find(*plan, "blk.27.attn_v.bias").ne == std::vector<int64_t>{w.kv_rows});
    } else {
      CHECK(find(*plan, "blk.35.attn_k_norm.weight").ne == std::vector<int64_t>{128});
    }
    const double gib = static_cast<double>(plan->total_bytes) / double(1ull << 30);
    MESSAGE(shape, " q4_K_M: ", gib, " GiB");
    CHECK(gib == doctest::Approx(w.gib).epsilon(0.01));
  }
}

TEST_CASE("synthetic: qwen3-30b-a3b is Qwen3-30B-A3B: 128 experts of 768, 8 a token, heads of 128") {
  auto plan = plan_synthetic("qwen3-30b-a3b", "q4_K_M");
  REQUIRE_MESSAGE(plan.ok(), (plan.ok() ? std::string() : plan.error().message));
  CHECK(plan->shape->arch == "qwen3moe");
  CHECK(find(*plan, "blk.0.attn_q.weight").ne == std::vector<int64_t>{2048, 4096});
  CHECK(find(*plan, "blk.0.attn_k.weight").ne == std::vector<int64_t>{2048, 512});
  CHECK(find(*plan, "blk.0.attn_k_norm.weight").ne == std::vector<int64_t>{128});
  CHECK(find(*plan, "blk.47.ffn_gate_inp.weight").type == quant::Type::F32);
  CHECK(find(*plan, "blk.47.ffn_gate_inp.weight").ne == std::vector<int64_t>{2048, 128});
  CHECK(find(*plan, "blk.0.ffn_up_exps.weight").ne == std::vector<int64_t>{2048, 768, 128});
  CHECK(find(*plan, "blk.0.ffn_down_exps.weight").ne == std::vector<int64_t>{768, 2048, 128});
  int64_t params = 0;
  for (const auto& t : plan->tensors) params += t.n_elements();
  CHECK(static_cast<double>(params) == doctest::Approx(30.53e9).epsilon(0.005));
  // The published Q4_K_M file is 18.6 GB.
  const double gb = static_cast<double>(plan->total_bytes) / 1e9;
  MESSAGE("qwen3-30b-a3b q4_K_M: ", gb, " GB");
  CHECK(gb == doctest::Approx(18.6).epsilon(0.02));
}

TEST_CASE("synthetic: gemma3-4b is Gemma-3-4B's text model: heads of 256, post-norms, tied embedding, windows") {
  auto plan = plan_synthetic("gemma3-4b", "q4_K_M");
  REQUIRE_MESSAGE(plan.ok(), (plan.ok() ? std::string() : plan.error().message));
  CHECK(plan->shape->arch == "gemma3");
  CHECK(find(*plan, "blk.0.attn_q.weight").ne == std::vector<int64_t>{2560, 2048});
  CHECK(find(*plan, "blk.33.attn_k.weight").ne == std::vector<int64_t>{2560, 1024});
  CHECK(find(*plan, "blk.0.post_attention_norm.weight").ne == std::vector<int64_t>{2560});
  CHECK(find(*plan, "blk.0.post_ffw_norm.weight").type == quant::Type::F32);
  for (const auto& t : plan->tensors) CHECK(t.name != "output.weight");
  int64_t params = 0;
  for (const auto& t : plan->tensors) params += t.n_elements();
  CHECK(static_cast<double>(params) == doctest::Approx(3.88e9).epsilon(0.005));
  MESSAGE("gemma3-4b q4_K_M: ", static_cast<double>(plan->total_bytes) / 1e9, " GB");
}

TEST_CASE("synthetic: a ggml type puts every matrix in it, unknown shapes and types are errors") {
  for (const char* shape : {"llama-1b", "llama-3b", "llama-8b"}) {
    for (const auto& [name, type] : {std::pair{"q4_0", quant::Type::Q4_0}, std::pair{"Q8_0", quant::Type::Q8_0},
                                     std::pair{"q4_K", quant::Type::Q4_K}}) {
      CAPTURE(shape);
      CAPTURE(name);
      auto plan = plan_synthetic(shape, name);
      REQUIRE_MESSAGE(plan.ok(), (plan.ok() ? std::string() : plan.error().message));
      const int64_t n_layer = plan->shape->n_layer;
      const auto n = type_counts(*plan);
      CHECK(n.size() == 2);
      CHECK(n.at(quant::Type::F32) == 2 * n_layer + 1);
      CHECK(n.at(type) == 7 * n_layer + 2);
      const quant::TypeTraits* tr = quant::find_traits(type);
      const auto& out = find(*plan, "output.weight");
      CHECK(out.nbytes == static_cast<uint64_t>(out.n_elements() / tr->block_size) * tr->type_size);
    }
  }
  // The 1B and 3B shapes keep the 32000-token vocabulary of bench/RESULTS.md's numbers.
  auto b1 = plan_synthetic("llama-1b", "f16");
  REQUIRE(b1.ok());
  CHECK(b1->shape->n_vocab == 32000);
  CHECK(b1->shape->n_embd == 2048);
  CHECK(b1->shape->n_layer == 16);
  CHECK(b1->total_bytes == 2ull * 32000 * 2048 * 2 + 16ull * (2 * 2048 * 2048 + 2 * 2048 * 512 + 3 * 2048 * 8192) * 2 +
                               (2 * 16 + 1) * 2048 * 4);

  auto bad_shape = plan_synthetic("llama-2b", "q4_0");
  REQUIRE_FALSE(bad_shape.ok());
  CHECK(bad_shape.error().message ==
        "unknown synthetic model 'llama-2b' (known: tiny, llama-1b, llama-3b, llama-8b, qwen2-7b, qwen3-8b, "
        "qwen3-30b-a3b, gemma3-4b)");
  auto bad_type = plan_synthetic("llama-1b", "q9_9");
  REQUIRE_FALSE(bad_type.ok());
  CHECK(bad_type.error().message.find("unknown weight type 'q9_9'") == 0);
  CHECK(bad_type.error().message.find("Q4_K_M") != std::string::npos);
}

TEST_CASE("synthetic: a tiny q4_K_M model is built as planned and runs, in kite bench too") {
  auto plan = plan_synthetic("tiny", "q4_K_M");
  REQUIRE(plan.ok());
  auto src = make_synthetic("tiny", "q4_K_M");
  REQUIRE_MESSAGE(src.ok(), (src.ok() ? std::string() : src.error().message));
  const auto& ts = (*src)->tensors();
  REQUIRE(ts.size() == plan->tensors.size());
  for (size_t i = 0; i < ts.size(); ++i) {
    CAPTURE(ts[i].name);
    CHECK(ts[i].name == plan->tensors[i].name);
    CHECK(ts[i].type == plan->tensors[i].type);
    CHECK(ts[i].ne == plan->tensors[i].ne);
    CHECK(ts[i].nbytes == plan->tensors[i].nbytes);
  }
  // Rows of 128 are not whole 256-blocks: llama.cpp's fallbacks (Q4_K -> Q5_0, Q6_K -> Q8_0).
  const auto n = type_counts(*plan);
  CHECK(n.at(quant::Type::Q5_0) > 0);
  CHECK(n.at(quant::Type::Q8_0) > 0);
  CHECK(n.count(quant::Type::Q4_K) == 0);
  CHECK(*(*src)->metadata().get_int("general.file_type") == 15);  // LLAMA_FTYPE_MOSTLY_Q4_K_M

  auto model = Model::from_source(std::move(*src));
  REQUIRE_MESSAGE(model.ok(), (model.ok() ? std::string() : model.error().message));
  ContextOptions o;
  o.n_threads = 2;
  o.n_ctx = 64;
  auto ctx = Context::create(*model, o);
  REQUIRE_MESSAGE(ctx.ok(), (ctx.ok() ? std::string() : ctx.error().message));
  const std::vector<int32_t> prompt = {1, 300, 301, 302, 303};
  REQUIRE((*ctx)->eval(prompt).ok());
  const auto logits = (*ctx)->logits(0);
  REQUIRE(logits.size() == 512);
  float lo = logits[0], hi = logits[0];
  for (float x : logits) {
    REQUIRE(std::isfinite(x));
    lo = std::min(lo, x), hi = std::max(hi, x);
  }
  CHECK(hi > lo);

  // kite bench on it: one JSON line, the bandwidth given compared against.
  const auto r = run_kite({"bench", "--synthetic", "tiny", "--type", "q4_K_M", "-p", "16", "-n", "4", "-r", "1", "-t",
                           "2", "--json", "--bandwidth", "123.5"});
  REQUIRE_MESSAGE(r.exit_code == 0, r.err);
  const auto j = nlohmann::json::parse(r.out);
  CHECK(j["model"] == "synthetic-tiny-Q4_K_M");
  CHECK(j["device"] == "cpu");
  // The CPU kernels that ran, by the level's name (this process's level: the same environment).
  cpu::SimdLevel level;
  CHECK(cpu::parse_simd_level(j["cpu_kernels"].get<std::string>(), &level));
  CHECK(level == cpu::active_simd_level());
  CHECK(j["read_gbs"].get<double>() == doctest::Approx(123.5));
  CHECK(j["bytes"].get<uint64_t>() == plan->total_bytes);
  CHECK(j["pp_ts"].get<double>() > 0);
  CHECK(j["tg_ts"].get<double>() > 0);
  CHECK(r.err.find("built synthetic-tiny-Q4_K_M in ") != std::string::npos);
  // --and-parallel: the batched test follows on the same model, with its own sizes.
  const auto both = run_kite({"bench",
                              "--synthetic",
                              "tiny",
                              "--type",
                              "q8_0",
                              "-p",
                              "8",
                              "-n",
                              "2",
                              "-r",
                              "1",
                              "-t",
                              "2",
                              "--json",
                              "--bandwidth",
                              "10",
                              "--and-parallel",
                              "1,3",
                              "--parallel-prompt",
                              "6",
                              "--parallel-gen",
                              "5"});
  REQUIRE_MESSAGE(both.exit_code == 0, both.err);
  const std::string first_line = both.out.substr(0, both.out.find('\n'));
  CHECK(nlohmann::json::parse(first_line)["tg"] == 2);
  CHECK(both.out.find("\n|    1 |    6 |    5 |") != std::string::npos);
  CHECK(both.out.find("\n|    3 |    6 |    5 |") != std::string::npos);
  CHECK(both.err.find("built synthetic-tiny-q8_0") == both.err.rfind("built synthetic-tiny-q8_0"));  // built once
  // -d: pp and tg after that many tokens in the context, labelled as llama-bench labels them.
  const auto deep = run_kite({"bench", "--synthetic", "tiny", "--type", "q8_0", "-p", "8", "-n", "3", "-d", "300",
                              "-r", "2", "-t", "2", "--bandwidth", "10"});
  REQUIRE_MESSAGE(deep.exit_code == 0, deep.err);
  CHECK_MESSAGE(deep.out.find("| pp8 @ d300 |") != std::string::npos, deep.out);
  CHECK(deep.out.find("| tg3 @ d300 |") != std::string::npos);
  CHECK(deep.err.find("filling the context with 300 tokens") != std::string::npos);
  const auto deep_json = run_kite({"bench", "--synthetic", "tiny", "--type", "q8_0", "-p", "0", "-n", "2", "-d", "16",
                                   "-r", "1", "-t", "2", "--json", "--bandwidth", "10"});
  REQUIRE_MESSAGE(deep_json.exit_code == 0, deep_json.err);
  CHECK(nlohmann::json::parse(deep_json.out)["depth"] == 16);
  CHECK(nlohmann::json::parse(deep_json.out)["kv_type"] == "f16");
  // --kv-type: the cache in another type, in the JSON and named in the table's label.
  const auto q8kv = run_kite({"bench", "--synthetic", "tiny", "--type", "q8_0", "-p", "8", "-n", "2", "-d", "64",
                              "-r", "1", "-t", "2", "--json", "--bandwidth", "10", "--kv-type", "q8_0"});
  REQUIRE_MESSAGE(q8kv.exit_code == 0, q8kv.err);
  CHECK(nlohmann::json::parse(q8kv.out)["kv_type"] == "q8_0");
  const auto q8kv_table = run_kite({"bench", "--synthetic", "tiny", "--type", "q8_0", "-p", "8", "-n", "0", "-d", "64",
                                    "-r", "1", "-t", "2", "--kv-type", "q8_0"});
  REQUIRE_MESSAGE(q8kv_table.exit_code == 0, q8kv_table.err);
  CHECK_MESSAGE(q8kv_table.out.find("| pp8 @ d64 kv q8_0 |") != std::string::npos, q8kv_table.out);
  const auto bad_kv = run_kite({"bench", "--synthetic", "tiny", "--kv-type", "q4", "-p", "0", "-n", "0"});
  CHECK(bad_kv.exit_code == 2);
  CHECK(bad_kv.err.find("--kv-type: q4 not in") != std::string::npos);
  const auto deep_batched = run_kite({"bench", "--synthetic", "tiny", "--parallel", "2", "-d", "16"});
  CHECK(deep_batched.exit_code == 2);
  CHECK(deep_batched.err.find("--n-depth excludes --parallel") != std::string::npos);
  const auto bad = run_kite({"bench", "--synthetic", "tiny", "--type", "q9_9", "-p", "0", "-n", "0"});
  CHECK(bad.exit_code == 2);
  CHECK(bad.err.find("unknown weight type 'q9_9'") != std::string::npos);
  // --top-p sets the OpenAI-style requests' nucleus: alone it would be ignored, so it is refused.
  const auto lone = run_kite({"bench", "--synthetic", "tiny", "--parallel", "2", "-p", "4", "-n", "2", "--top-p", "0.9"});
  CHECK(lone.exit_code == 2);
  CHECK(lone.err.find("--top-p requires --openai-sampling") != std::string::npos);
  const auto top_p = run_kite(
      {"bench", "--synthetic", "tiny", "--parallel", "2", "-p", "4", "-n", "2", "--openai-sampling", "--top-p", "0.9"});
  REQUIRE_MESSAGE(top_p.exit_code == 0, top_p.err);
  CHECK(top_p.err.find("steps brought back top-64 rows") != std::string::npos);
}

TEST_CASE("model: a bias or head norm of the wrong length is a load error naming the tensor") {
  // The kernels read a bias or a norm weight as long as the rows it applies to: a short one
  // would be read past its end. (The tiny shape: q rows 128, heads of 32.)
  for (const auto& [name, n] :
       {std::pair{"blk.0.attn_q.bias", int64_t{7}}, std::pair{"blk.1.attn_k_norm.weight", int64_t{31}}}) {
    CAPTURE(std::string(name));
    auto src = make_synthetic("tiny", "q8_0");
    REQUIRE(src.ok());
    REQUIRE((*src)->add_tensor(name, quant::Type::F32, {n}).ok());
    auto model = Model::from_source(std::move(*src));
    REQUIRE_FALSE(model.ok());
    CHECK(model.error().message.find(std::string("tensor '") + name + "' has shape [" + std::to_string(n) + ", 1]") !=
          std::string::npos);
  }
}

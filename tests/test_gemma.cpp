// gemma2 and gemma3 models against llama.cpp on the same files: the test models made from the
// trained qwen3-tiny and llama-draft (tests/gemma_model.h: a sliding window on one layer, linear
// rope scaling (gemma3) or soft-capping (gemma2), gelu-gated FFN, post-norms, scaled embedding),
// whose llama.cpp numbers are in tests/data/gemma-reference.json. (The ops: test_ops.cpp,
// test_ops_attention.cpp; on the GPU backends: gpu_checks.h's check_gemma.)
#include <doctest/doctest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>

#include "formats/gguf.h"
#include "src/model/model.h"
#include "tests/gemma_model.h"
#include "tests/gpu_checks.h"
#include "tests/moe_model.h"
#include "tests/process.h"

using namespace kite;
using namespace kite::test;

std::string kite::test::gemma_reference_path() {
  return std::string(KITE_SOURCE_DIR) + "/tests/data/gemma-reference.json";
}

std::string kite::test::gemma_test_file(const std::string& name) {
  const std::string from = nlohmann::json::parse(read_file(gemma_reference_path()))[name]["made_from"];
  return derived_test_file(gemma_reference_path(), name, [&](const std::string& path) {
    GemmaOptions o;
    o.arch = name.substr(0, name.find('-'));
    return make_gemma(testdata(from), path, o);
  });
}

namespace {

nlohmann::json gemma_reference() { return nlohmann::json::parse(read_file(gemma_reference_path())); }

// A gemma3 file like the test model with one metadata key changed (removed: no value).
std::string gemma_with(const std::string& name, const std::string& key, std::optional<gguf::Value> value) {
  auto in = gguf::File::open(gemma_test_file("gemma3-tiny.gguf"));
  REQUIRE(in.ok());
  gguf::Writer w;
  for (const gguf::KeyValue& kv : in->metadata().entries()) w.metadata().set(kv.key, kv.value);
  if (value) w.metadata().set(key, std::move(*value));
  else w.metadata().remove(key);
  for (const gguf::TensorInfo& t : in->tensors()) REQUIRE(w.add_tensor(t.name, t.type, t.ne).ok());
  const std::string path = (scratch_dir("gemma-bad-" + std::to_string(getpid())) / name).string();
  REQUIRE(w.begin(path).ok());
  for (const gguf::TensorInfo& t : in->tensors()) REQUIRE(w.write_tensor_data(t.data, t.nbytes).ok());
  REQUIRE(w.finish().ok());
  return path;
}

}  // namespace

TEST_CASE("gemma: the gemma2 and gemma3 test models give llama.cpp's perplexity and greedy text") {
  for (const char* name : {"gemma3-tiny.gguf", "gemma2-tiny.gguf"})
    check_llama_cpp_numbers(gemma_test_file(name), name, gemma_reference()[name]);
}

TEST_CASE("gemma3: hyperparameters as llama.cpp reads them: the window, its layers, their rope") {
  const LoadedModel l = load_model_at(gemma_test_file("gemma3-tiny.gguf"), "gemma3-tiny");
  const HParams& hp = l.model->hparams();
  CHECK(hp.gemma);
  CHECK(hp.n_swa == 48);
  CHECK(hp.is_swa(0));
  CHECK_FALSE(hp.is_swa(1));
  CHECK(hp.rope.scaling == RopeScaling::kLinear);
  CHECK(hp.rope.factor == 2.f);
  CHECK(hp.rope_swa.scaling == RopeScaling::kNone);
  CHECK(hp.rope_swa.freq_base == 10000.f);
  CHECK(hp.attn_scale == doctest::Approx(1 / std::sqrt(64.0)));
  // An explicit per-layer pattern (a bool array) and the swa rope base.
  auto f = gguf::Value(gguf::Array{gguf::ValueType::BOOL, {gguf::Value(false), gguf::Value(true)}});
  const LoadedModel flags =
      load_model_at(gemma_with("flags.gguf", "gemma3.attention.sliding_window_pattern", f), "flags");
  CHECK_FALSE(flags.model->hparams().is_swa(0));
  CHECK(flags.model->hparams().is_swa(1));
  const LoadedModel base = load_model_at(gemma_with("base.gguf", "gemma3.rope.freq_base_swa", 5000.f), "base");
  CHECK(base.model->hparams().rope_swa.freq_base == 5000.f);
  // No pattern: llama.cpp's default, every 6th layer global (here both of the 2 slide).
  const LoadedModel six =
      load_model_at(gemma_with("six.gguf", "gemma3.attention.sliding_window_pattern", std::nullopt), "six");
  CHECK(six.model->hparams().is_swa(0));
  CHECK(six.model->hparams().is_swa(1));
  // No window: every layer global.
  const LoadedModel none =
      load_model_at(gemma_with("none.gguf", "gemma3.attention.sliding_window", uint32_t{0}), "none");
  CHECK_FALSE(none.model->hparams().is_swa(0));
}

TEST_CASE("gemma3: kite quantize's Q4_K_M within 1% of llama-quantize's perplexity") {
  const auto ref = gemma_reference()["gemma3-tiny-Q4_K_M.gguf"];
  const std::string out = (scratch_dir("gemma-q4km-" + std::to_string(getpid())) / "q4km.gguf").string();
  auto q = run_kite({"quantize", gemma_test_file("gemma3-tiny.gguf"), out, "Q4_K_M"});
  REQUIRE_MESSAGE(q.exit_code == 0, q.err);
  const double ppl = kite_perplexity(out), want = ref["ppl_ctx256"].get<double>();
  MESSAGE("kite's Q4_K_M: ppl ", ppl, " (llama-quantize's, by llama.cpp: ", want, ")");
  CHECK(std::fabs(ppl / want - 1) < 0.01);
}

TEST_CASE("gemma: Hugging Face Gemma2, Gemma3 and Gemma3ForConditionalGeneration folders run as their GGUF and convert back") {
  struct Case {
    const char* gguf;
    const char* dense_hf;
    bool multimodal;
  };
  for (const Case& c : {Case{"gemma3-tiny.gguf", "models/qwen3-tiny", false},
                        Case{"gemma3-tiny.gguf", "models/qwen3-tiny", true},
                        Case{"gemma2-tiny.gguf", "models/llama-draft", false}}) {
    const std::string what = std::string(c.gguf) + (c.multimodal ? " (multimodal)" : "");
    INFO(what);
    const std::string gguf_path = gemma_test_file(c.gguf);
    const std::string dir =
        scratch_dir("gemma-hf-" + std::to_string(getpid()) + "-" + c.gguf + (c.multimodal ? "-mm" : "")).string();
    const std::string hf = dir + "/hf";
    const Status st = gemma_gguf_to_hf(gguf_path, testdata(c.dense_hf), hf, c.multimodal);
    REQUIRE_MESSAGE(st.ok(), (st.ok() ? std::string() : st.error().message));
    // (Gemma's norms are weight - 1 there: kite adds the 1 back, in float.)
    const double a = kite_perplexity(gguf_path), b = kite_perplexity(hf);
    MESSAGE(what, ": ppl ", b, " from the folder, ", a, " from the GGUF");
    CHECK(std::fabs(b / a - 1) < 1e-4);
    auto conv = run_kite({"convert", hf, "-o", dir + "/converted.gguf"});
    REQUIRE_MESSAGE(conv.exit_code == 0, conv.err);
    auto x = gguf::File::open(gguf_path), y = gguf::File::open(dir + "/converted.gguf");
    REQUIRE(x.ok());
    REQUIRE(y.ok());
    const std::string arch = *x->metadata().get<std::string>("general.architecture");
    for (const char* key : {"attention.sliding_window", "block_count", "attn_logit_softcapping",
                            "final_logit_softcapping", "rope.scaling.factor"}) {
      INFO(key);
      CHECK(x->metadata().has(arch + "." + key) == y->metadata().has(arch + "." + key));
      if (x->metadata().has(arch + "." + key))
        CHECK(*y->metadata().get_float(arch + "." + key) == *x->metadata().get_float(arch + "." + key));
    }
    CHECK(y->tensors().size() == x->tensors().size());
    for (const gguf::TensorInfo& t : x->tensors()) {
      INFO(t.name);
      const gguf::TensorInfo* u = y->find_tensor(t.name);
      REQUIRE(u != nullptr);
      CHECK(u->type == t.type);
      CHECK(u->ne == t.ne);
      if (!t.name.ends_with("norm.weight")) {
        CHECK((u->nbytes == t.nbytes && std::memcmp(u->data, t.data, t.nbytes) == 0));
        continue;
      }
      for (int64_t i = 0; i < t.ne[0]; ++i)
        CHECK(reinterpret_cast<const float*>(u->data)[i] ==
              doctest::Approx(reinterpret_cast<const float*>(t.data)[i]).epsilon(1e-6));
    }
  }
}

TEST_CASE("gemma: Hugging Face configs kite cannot run as llama.cpp does are errors naming the key") {
  const std::string hf = scratch_dir("gemma-hf-bad-" + std::to_string(getpid())).string() + "/hf";
  REQUIRE(gemma_gguf_to_hf(gemma_test_file("gemma3-tiny.gguf"), testdata("models/qwen3-tiny"), hf).ok());
  const nlohmann::json good = nlohmann::json::parse(read_file(hf + "/config.json"));
  auto expect = [&](const char* key, nlohmann::json value, const std::string& what) {
    nlohmann::json c = good;
    c[key] = std::move(value);
    std::ofstream(hf + "/config.json") << c.dump();
    auto r = run_kite({"run", "-m", hf, "-p", "hi", "-n", "1"});
    CHECK(r.exit_code == 1);
    CHECK_MESSAGE(r.err.find(what) != std::string::npos, r.err);
  };
  expect("attn_logit_softcapping", 50.0, "gemma3 with attn_logit_softcapping is not supported");
  expect("layer_types", nlohmann::json::array({"sliding_attention"}), "'layer_types' must list the 2 layers");
  expect("layer_types", nlohmann::json::array({"sliding_attention", "chunked"}), "'layer_types' has '\"chunked\"'");
}

TEST_CASE("gemma: a sequence's greedy tokens do not depend on what shares its batch (past the window)") {
  for (const char* name : {"gemma3-tiny.gguf", "gemma2-tiny.gguf"})
    check_batch_invariance("cpu", load_model_at(gemma_test_file(name), name), 60);
}

TEST_CASE("gemma2: hyperparameters as llama.cpp reads them: soft-capping, every other layer sliding") {
  const LoadedModel l = load_model_at(gemma_test_file("gemma2-tiny.gguf"), "gemma2-tiny");
  const HParams& hp = l.model->hparams();
  CHECK(hp.gemma);
  CHECK(hp.attn_softcap == 5.f);
  CHECK(hp.final_softcap == 10.f);
  CHECK(hp.n_swa == 48);
  CHECK(hp.is_swa(0));
  CHECK_FALSE(hp.is_swa(1));
  CHECK(hp.rope_swa.freq_base == hp.rope.freq_base);  // (gemma2's sliding layers rope as the others)
}

TEST_CASE("gemma3: bad metadata is an error naming the key") {
  auto f = gguf::Value(gguf::Array{gguf::ValueType::BOOL, {gguf::Value(true)}});
  auto r = run_kite({"run", "-m", gemma_with("short.gguf", "gemma3.attention.sliding_window_pattern", f), "-p", "hi",
                     "-n", "1"});
  CHECK(r.exit_code == 1);
  CHECK(r.err.find("sliding_window_pattern has 1 entries for 2 layers") != std::string::npos);
  r = run_kite({"run", "-m", gemma_with("cap.gguf", "gemma3.final_logit_softcapping", -30.f), "-p", "hi", "-n", "1"});
  CHECK(r.exit_code == 1);
  CHECK(r.err.find("gemma3.final_logit_softcapping is -30") != std::string::npos);
}

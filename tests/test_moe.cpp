// Mixture-of-experts models (qwen3moe; llama with experts, Mixtral's layout) against llama.cpp
// on the same files: the test models upcycled from the trained dense ones (tests/moe_model.h),
// whose llama.cpp numbers are in tests/data/moe-reference.json. (The ops themselves:
// test_ops.cpp; on the GPU backends: gpu_checks.h's check_moe.)
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "src/runtime/context.h"
#include "src/runtime/imatrix.h"
#include "tests/gpu_checks.h"
#include "tests/moe_model.h"
#include "tests/process.h"

using namespace kite;
using namespace kite::test;

namespace {

nlohmann::json moe_reference() {
  return nlohmann::json::parse(read_file(moe_reference_path()));
}

std::string fnv1a64(const std::string& bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char b : bytes) h = (h ^ b) * 0x100000001b3ull;
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

}  // namespace

std::string kite::test::moe_reference_path() {
  return std::string(KITE_SOURCE_DIR) + "/tests/data/moe-reference.json";
}

std::string kite::test::derived_test_file(const std::string& reference_path, const std::string& name,
                                          const std::function<Status(const std::string& path)>& make) {
  static std::map<std::string, std::string> made;
  if (auto it = made.find(name); it != made.end()) return it->second;
  const auto ref = nlohmann::json::parse(read_file(reference_path))[name];
  const std::string path = (scratch_dir("derived-" + std::to_string(getpid()) + "-" + name) / name).string();
  const Status st = make(path);
  REQUIRE_MESSAGE(st.ok(), name, ": ", (st.ok() ? std::string() : st.error().message));
  const std::string hash = fnv1a64(read_file(path));
  REQUIRE_MESSAGE(hash == ref["fnv1a64"].get<std::string>(), name, " is not the file ", reference_path,
                  " measured (", hash, "): remake the reference (tests/data/README.md)");
  return made[name] = path;
}

std::string kite::test::moe_test_file(const std::string& name) {
  const std::string from = moe_reference()[name]["upcycled_from"];
  return derived_test_file(moe_reference_path(), name,
                           [&](const std::string& path) { return upcycle_to_moe(testdata(from), path); });
}

double kite::test::kite_perplexity(const std::string& path) {
  auto r = run_kite({"perplexity", "-m", path, "-f", testdata("heldout.txt"), "-c", "256"});
  REQUIRE_MESSAGE(r.exit_code == 0, path, ": ", r.err);
  const size_t at = r.out.find("perplexity: ");
  REQUIRE_MESSAGE(at != std::string::npos, r.out);
  return std::stod(r.out.substr(at + 12));
}

void kite::test::check_llama_cpp_numbers(const std::string& path, const std::string& name, const nlohmann::json& ref) {
  const double ppl = kite_perplexity(path), want = ref["ppl_ctx256"].get<double>();
  MESSAGE(name, ": ppl ", ppl, " (llama.cpp ", want, ")");
  CHECK_MESSAGE(std::fabs(ppl / want - 1) < 0.001, name);
  auto out = run_kite({"run", "-m", path, "-p", ref["greedy32_prompt"], "-n", "32", "--temp", "0"});
  REQUIRE_MESSAGE(out.exit_code == 0, out.err);
  std::string text = ref["greedy32_output"];  // (llama-simple prints the BOS; kite run does not)
  const std::string bos = "<|begin_of_text|>";
  if (text.rfind(bos, 0) == 0) text = text.substr(bos.size());
  CHECK_MESSAGE(out.out == text, name);
}

TEST_CASE("moe: qwen3moe and llama with experts give llama.cpp's perplexity and greedy text") {
  const auto ref = moe_reference();
  for (const char* name : {"qwen3moe-tiny.gguf", "llama-draft-moe.gguf"})
    check_llama_cpp_numbers(moe_test_file(name), name, ref[name]);
}

TEST_CASE("moe: kite quantize makes llama-quantize's Q4_K_M of an MoE model, perplexity within 1%") {
  const auto ref = moe_reference()["qwen3moe-tiny-Q4_K_M.gguf"];
  const std::string src = moe_test_file("qwen3moe-tiny.gguf");
  const std::string out = (scratch_dir("moe-q4km-" + std::to_string(getpid())) / "q4km.gguf").string();
  auto q = run_kite({"quantize", src, out, "Q4_K_M"});
  REQUIRE_MESSAGE(q.exit_code == 0, q.err);
  auto f = gguf::File::open(out);
  REQUIRE(f.ok());
  CHECK(f->file_size() == ref["bytes"].get<uint64_t>());
  CHECK(*f->metadata().get_int("general.file_type") == ref["file_type"].get<int64_t>());
  CHECK(f->tensors().size() == ref["tensor_types"].size());
  for (const auto& t : f->tensors()) {
    INFO(t.name);
    REQUIRE(ref["tensor_types"].contains(t.name));
    std::string want = ref["tensor_types"][t.name];
    std::string got(quant::find_traits(t.type)->name);
    std::transform(want.begin(), want.end(), want.begin(), ::tolower);
    std::transform(got.begin(), got.end(), got.begin(), ::tolower);
    CHECK(got == want);
  }
  const double ppl = kite_perplexity(out), want = ref["ppl_ctx256"].get<double>();
  MESSAGE("kite's Q4_K_M: ppl ", ppl, " (llama-quantize's, by llama.cpp: ", want, ")");
  CHECK(std::fabs(ppl / want - 1) < 0.01);
}

TEST_CASE("moe: a sequence's greedy tokens do not depend on what shares its batch") {
  check_batch_invariance("cpu", load_model_at(moe_test_file("qwen3moe-tiny.gguf"), "qwen3moe-tiny"), 12);
}

TEST_CASE("moe: inconsistent experts are errors naming the problem") {
  const std::string dir = scratch_dir("moe-bad-" + std::to_string(getpid())).string();
  MoeUpcycle o;
  o.n_expert = 2;
  o.n_used = 3;
  REQUIRE(upcycle_to_moe(testdata("gguf/qwen3-tiny-f16.gguf"), dir + "/bad.gguf", o).ok());
  auto r = run_kite({"run", "-m", dir + "/bad.gguf", "-p", "hi", "-n", "1"});
  CHECK(r.exit_code == 1);
  CHECK(r.err.find("inconsistent experts: 3 used of 2") != std::string::npos);
  // Tensor parallelism does not split experts (yet): refused at load, not a wrong answer.
  auto tp =
      run_kite({"run", "-m", moe_test_file("qwen3moe-tiny.gguf"), "-p", "hi", "-n", "1", "--tensor-parallel", "2"});
  CHECK(tp.exit_code != 0);
  CHECK(tp.err.find("mixture-of-experts") != std::string::npos);
}

TEST_CASE("moe: a Hugging Face Qwen3-MoE folder runs as its GGUF, and kite convert stacks its experts back") {
  const std::string gguf_path = moe_test_file("qwen3moe-tiny.gguf");
  const std::string dir = scratch_dir("moe-hf-" + std::to_string(getpid())).string();
  const std::string hf = dir + "/qwen3moe-tiny";
  const Status st = moe_gguf_to_hf(gguf_path, testdata("models/qwen3-tiny"), hf);
  REQUIRE_MESSAGE(st.ok(), (st.ok() ? std::string() : st.error().message));
  // The same weights: the same perplexity, to the digits printed.
  CHECK(kite_perplexity(hf) == kite_perplexity(gguf_path));
  // Converted back to GGUF: every tensor of the upcycled file, byte for byte.
  auto c = run_kite({"convert", hf, "-o", dir + "/converted.gguf"});
  REQUIRE_MESSAGE(c.exit_code == 0, c.err);
  auto a = gguf::File::open(gguf_path), b = gguf::File::open(dir + "/converted.gguf");
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(*b->metadata().get<std::string>("general.architecture") == "qwen3moe");
  for (const char* key : {"qwen3moe.expert_count", "qwen3moe.expert_used_count", "qwen3moe.expert_feed_forward_length"})
    CHECK(*b->metadata().get_int(key) == *a->metadata().get_int(key));
  CHECK(b->tensors().size() == a->tensors().size());
  for (const auto& t : a->tensors()) {
    INFO(t.name);
    const gguf::TensorInfo* u = b->find_tensor(t.name);
    REQUIRE(u != nullptr);
    CHECK(u->type == t.type);
    CHECK(u->ne == t.ne);
    CHECK((u->nbytes == t.nbytes && std::memcmp(u->data, t.data, t.nbytes) == 0));
  }
  // A missing expert, and a layout kite does not run, are errors naming them.
  std::filesystem::copy(hf, dir + "/dense-layers", std::filesystem::copy_options::recursive);
  auto cfg = nlohmann::json::parse(read_file(dir + "/dense-layers/config.json"));
  cfg["mlp_only_layers"] = {1};
  std::ofstream(dir + "/dense-layers/config.json") << cfg.dump();
  auto r = run_kite({"run", "-m", dir + "/dense-layers", "-p", "hi", "-n", "1"});
  CHECK(r.exit_code == 1);
  CHECK(r.err.find("a Qwen3-MoE layout kite does not run") != std::string::npos);
  cfg["mlp_only_layers"] = nlohmann::json::array();
  cfg["num_experts"] = 5;
  std::ofstream(dir + "/dense-layers/config.json") << cfg.dump();
  r = run_kite({"run", "-m", dir + "/dense-layers", "-p", "hi", "-n", "1"});
  CHECK(r.exit_code == 1);
  CHECK(r.err.find("expert 4 of 'blk.0.ffn_") != std::string::npos);
  CHECK(r.err.find("is missing from the checkpoint") != std::string::npos);
}

TEST_CASE("moe: kite imatrix gives each expert llama-imatrix's count and sums, and IQ2_XS with them llama-quantize's types") {
  const std::string model = moe_test_file("qwen3moe-tiny.gguf");
  const std::string dir = scratch_dir("moe-imatrix-" + std::to_string(getpid())).string();
  const std::string llama_imatrix = std::string(KITE_SOURCE_DIR) + "/tests/data/qwen3moe-tiny-imatrix.gguf";
  auto r = run_kite({"imatrix", "-m", model, "-f", testdata("heldout.txt"), "-c", "256", "-o", dir + "/kite.gguf"});
  REQUIRE_MESSAGE(r.exit_code == 0, r.err);
  auto mine = load_imatrix(dir + "/kite.gguf"), theirs = load_imatrix(llama_imatrix);
  REQUIRE_MESSAGE(mine.ok(), (mine.ok() ? std::string() : mine.error().message));
  REQUIRE_MESSAGE(theirs.ok(), (theirs.ok() ? std::string() : theirs.error().message));
  CHECK(mine->entries.size() == theirs->entries.size());
  for (const auto& [name, t] : theirs->entries) {
    INFO(name);
    REQUIRE(mine->entries.count(name) == 1);
    const ImatrixEntry& m = mine->entries.at(name);
    REQUIRE(m.counts.size() == t.counts.size());
    CHECK(m.counts.size() == (name.find("_exps.") != std::string::npos ? 4u : 1u));
    // A router's near-tie may send a token to another expert than llama.cpp's float math did.
    for (size_t e = 0; e < t.counts.size(); ++e) CHECK(std::abs(m.counts[e] - t.counts[e]) <= 2 + t.counts[e] / 1000);
    REQUIRE(m.sum2.size() == t.sum2.size());
    double num = 0, den = 0;
    for (size_t j = 0; j < t.sum2.size(); ++j) num += std::fabs(m.sum2[j] - t.sum2[j]), den += std::fabs(t.sum2[j]);
    CHECK(num / den < 1e-3);
  }
  // Two tokens' experts a token: the expert counts add up to twice the tokens.
  int64_t routed = 0;
  for (int64_t c : mine->entries.at("blk.1.ffn_up_exps.weight").counts) routed += c;
  CHECK(routed == 2 * mine->entries.at("blk.1.attn_q.weight").counts[0]);

  // IQ2_XS needs importance for every expert; with llama-imatrix's file kite's quantization
  // has llama-quantize's types and no worse perplexity (1.5%, the low-bit mixes' bound).
  const auto ref = moe_reference()["qwen3moe-tiny-IQ2_XS.gguf"];
  auto q = run_kite({"quantize", "--imatrix", llama_imatrix, model, dir + "/iq2_xs.gguf", "IQ2_XS"});
  REQUIRE_MESSAGE(q.exit_code == 0, q.err);
  auto f = gguf::File::open(dir + "/iq2_xs.gguf");
  REQUIRE(f.ok());
  for (const auto& t : f->tensors()) {
    INFO(t.name);
    std::string got(quant::find_traits(t.type)->name);
    std::transform(got.begin(), got.end(), got.begin(), ::tolower);
    std::string want = ref["tensor_types"][t.name];
    std::transform(want.begin(), want.end(), want.begin(), ::tolower);
    CHECK(got == want);
  }
  const double ppl = kite_perplexity(dir + "/iq2_xs.gguf"), want = ref["ppl_ctx256"].get<double>();
  MESSAGE("kite's IQ2_XS: ppl ", ppl, " (llama-quantize's, by llama.cpp: ", want, ")");
  CHECK(ppl < want * 1.015);
  auto no_imatrix = run_kite({"quantize", model, dir + "/no.gguf", "IQ2_XS"});
  CHECK(no_imatrix.exit_code != 0);
  CHECK(no_imatrix.err.find("needs an importance matrix") != std::string::npos);
}

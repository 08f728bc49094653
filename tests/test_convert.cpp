// kite convert / kite quantize: HF folders to f16 against llama.cpp's files, quantizing
// llama-draft-f16.gguf to each llama.cpp type against llama-quantize's files, and error paths.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "formats/convert.h"
#include "formats/gguf.h"
#include "formats/quant_mix.h"
#include "src/model/model.h"
#include "src/runtime/perplexity.h"
#include "src/runtime/tokenizer.h"
#include "tests/process.h"
#include "tests/testdata.h"

using namespace kite;
using namespace kite::test;
namespace fs = std::filesystem;

namespace {

std::string convert_with(const std::string& in, const fs::path& out, const std::string& type, bool hf, bool quantize_order) {
  auto src = WeightSource::open(in);
  REQUIRE_MESSAGE(src.ok(), src.error().message);
  ConvertOptions opt;
  opt.type = type;
  opt.threads = 2;
  opt.small_tensors_f32 = hf;
  opt.llama_quantize_order = quantize_order;
  auto st = convert_model(**src, out.string(), opt);
  REQUIRE_MESSAGE(st.ok(), in, " -> ", type, ": ", st.error().message);
  return out.string();
}

std::string convert_to(const std::string& in, const fs::path& out, const std::string& type, bool hf) {
  return convert_with(in, out, type, hf, false);
}

// llama.cpp's perplexity (-c 256) over the first `max_bytes` of heldout.txt (all of it for 0).
double ppl(const std::string& model_path, size_t max_bytes) {
  auto src = WeightSource::open(model_path);
  REQUIRE_MESSAGE(src.ok(), src.error().message);
  auto tok = Tokenizer::load((*src)->metadata());
  REQUIRE_MESSAGE(tok.ok(), tok.error().message);
  auto model = Model::from_source(std::move(*src));
  REQUIRE_MESSAGE(model.ok(), model.error().message);
  ContextOptions co;
  co.n_ctx = 256;
  auto ctx = Context::create(*model, co);
  REQUIRE_MESSAGE(ctx.ok(), ctx.error().message);
  std::string text = read_file(testdata("heldout.txt"));
  if (max_bytes > 0) text.resize(std::min(text.size(), max_bytes));
  EncodeOptions eo;
  eo.add_special = false;
  std::vector<TokenId> ids = (*tok)->encode(text, eo);
  ids.insert(ids.begin(), (*tok)->bos());
  auto r = perplexity_llama_cpp(**ctx, ids, (*tok)->bos(), 256);
  REQUIRE_MESSAGE(r.ok(), r.error().message);
  return r->ppl;
}

std::string greedy(const std::string& model_path) {
  auto r = run_kite({"run", "-m", model_path, "--temp", "0", "-n", "32", "-p", "Prince Andrew looked at Pierre and said"});
  REQUIRE_MESSAGE(r.exit_code == 0, r.err);
  REQUIRE(r.out.size() > 40);
  return r.out;
}

gguf::File open_gguf(const std::string& path) {
  auto f = gguf::File::open(path);
  REQUIRE_MESSAGE(f.ok(), f.error().message);
  return std::move(*f);
}

bool same_value(const gguf::Value& a, const gguf::Value& b) {
  if (a.type() != b.type()) return false;
  if (const auto* x = a.get_if<gguf::Array>()) {
    const auto* y = b.get_if<gguf::Array>();
    if (x->elem_type != y->elem_type || x->items.size() != y->items.size()) return false;
    for (size_t i = 0; i < x->items.size(); ++i)
      if (!same_value(x->items[i], y->items[i])) return false;
    return true;
  }
  return std::visit(
      [&](const auto& xv) {
        using T = std::decay_t<decltype(xv)>;
        if constexpr (std::is_same_v<T, gguf::Array>) return false;
        else return xv == *b.get_if<T>();
      },
      a.v);
}

bool dir_has_temp_files(const fs::path& dir) {
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().find(".tmp.") != std::string::npos) return true;
  return false;
}

}  // namespace

TEST_CASE("convert: llama.cpp's Q/K permutation maps rows as convert_hf_to_gguf does") {
  // head_dim 4: HF rows [a0 a1 b0 b1] (halves a, b) -> llama.cpp [a0 b0 a1 b1].
  CHECK(qk_permuted_source_row(0, 8, 2) == 0);
  CHECK(qk_permuted_source_row(1, 8, 2) == 2);
  CHECK(qk_permuted_source_row(2, 8, 2) == 1);
  CHECK(qk_permuted_source_row(3, 8, 2) == 3);
  CHECK(qk_permuted_source_row(5, 8, 2) == 6);
}

TEST_CASE("convert: HF folders to f16 equal llama.cpp's f16 files byte for byte, same greedy text and perplexity") {
  const fs::path dir = scratch_dir("convert-f16");
  for (const char* name : {"llama-draft", "qwen2-tiny", "qwen3-tiny"}) {
    CAPTURE(name);
    const std::string out = convert_to(testdata(std::string("models/") + name), dir / (std::string(name) + ".gguf"), "f16", true);
    const std::string peer_path = testdata(std::string("gguf/") + name + "-f16.gguf");
    gguf::File mine = open_gguf(out), peer = open_gguf(peer_path);
    REQUIRE(mine.tensors().size() == peer.tensors().size());
    size_t same_bytes = 0;
    for (const auto& pt : peer.tensors()) {
      const TensorInfo* mt = mine.find_tensor(pt.name);
      REQUIRE_MESSAGE(mt != nullptr, "missing tensor ", pt.name);
      CHECK_MESSAGE(mt->type == pt.type, pt.name);
      CHECK_MESSAGE(mt->ne == pt.ne, pt.name);
      if (mt->type == pt.type && mt->nbytes == pt.nbytes) {
        const bool eq = std::equal(mt->data, mt->data + mt->nbytes, pt.data);
        CHECK_MESSAGE(eq, pt.name, " differs from llama.cpp's bytes");
        same_bytes += eq;
      }
    }
    CHECK(same_bytes == peer.tensors().size());
    // Every key llama.cpp wrote, with the same value.
    for (const auto& kv : peer.metadata().entries()) {
      const gguf::Value* v = mine.metadata().find(kv.key);
      REQUIRE_MESSAGE(v != nullptr, "missing key ", kv.key);
      CHECK_MESSAGE(same_value(*v, kv.value), kv.key);
    }
    CHECK(greedy(out) == greedy(peer_path));
    CHECK(ppl(out, 8000) == doctest::Approx(ppl(peer_path, 8000)).epsilon(1e-6));
  }
}

TEST_CASE("convert: llama-target (no peer f16 file) behaves as the HF folder") {
  const fs::path dir = scratch_dir("convert-target");
  const std::string hf = testdata("models/llama-target");
  // f32 keeps the bf16 weights exactly: only the Q/K permutation and rope layout differ.
  const std::string f32 = convert_to(hf, dir / "target-f32.gguf", "f32", true);
  const std::string f16 = convert_to(hf, dir / "target-f16.gguf", "f16", true);
  CHECK(greedy(f32) == greedy(hf));
  const double p_hf = ppl(hf, 12000);
  const double p32 = ppl(f32, 12000), p16 = ppl(f16, 12000);
  MESSAGE("llama-target ppl: HF ", p_hf, ", f32 ", p32, ", f16 ", p16);
  CHECK(p32 == doctest::Approx(p_hf).epsilon(1e-4));
  CHECK(p16 == doctest::Approx(p_hf).epsilon(2e-3));

  // Straight to a mix (separate output tensor, 4 layers): llama-quantize's types and size.
  const std::string q4 = convert_to(hf, dir / "target-q4_k_m.gguf", "q4_k_m", true);
  const std::string peer_path = testdata("gguf/llama-target-Q4_K_M.gguf");
  gguf::File mine = open_gguf(q4), peer = open_gguf(peer_path);
  REQUIRE(mine.tensors().size() == peer.tensors().size());
  for (const auto& pt : peer.tensors()) {
    const TensorInfo* mt = mine.find_tensor(pt.name);
    REQUIRE_MESSAGE(mt != nullptr, pt.name);
    CHECK_MESSAGE(mt->type == pt.type, pt.name);
  }
  CHECK(std::fabs(static_cast<double>(fs::file_size(q4)) / static_cast<double>(fs::file_size(peer_path)) - 1) < 0.01);
}

// Every type: llama.cpp's per-tensor types, file type and a size within 1%. Perplexity on all of
// heldout.txt (llama-perplexity -c 256's definition) against peer-reference.json's ppl_ctx256
// costs seconds per file, so CI checks four types: Q8_0 (ggml's exact rounding rule), the common
// Q4_K_M, and Q4_1 and Q2_K, the two whose perplexity is furthest from llama.cpp's (kite's
// scale searches give lower perplexity than ggml's rules there: see the MESSAGE lines).
// kite's quantizers search each block's scale (formats/quant), where ggml rounds by a fixed rule
// without an importance matrix, so kite's files may score better than llama.cpp's (Q4_1 -0.7%,
// Q2_K -1.2% here): the bound is one-sided, no worse than llama.cpp's file by more than 0.5%.
TEST_CASE("quantize: mixes give llama.cpp's per-tensor types, size within 1%, perplexity no worse than 0.5% over") {
  const fs::path dir = scratch_dir("quantize-mixes");
  const auto peer_ref = nlohmann::json::parse(read_file(testdata("gguf/peer-reference.json")));
  const std::string f16 = testdata("gguf/llama-draft-f16.gguf");
  const std::vector<std::string> ppl_types = {"Q8_0", "Q4_K_M", "Q4_1", "Q2_K"};
  for (std::string type : {"Q8_0", "Q6_K", "Q5_K_M", "Q5_K_S", "Q5_0", "Q5_1", "Q4_K_M", "Q4_0", "Q4_1", "Q3_K_M", "Q2_K"}) {
    CAPTURE(type);
    const std::string peer_name = "llama-draft-" + type + ".gguf";
    const std::string peer_path = testdata("gguf/" + peer_name);
    const std::string out = convert_with(f16, dir / peer_name, type, false, true);
    {
      gguf::File mine = open_gguf(out), peer = open_gguf(peer_path);
      REQUIRE(mine.tensors().size() == peer.tensors().size());
      for (size_t i = 0; i < peer.tensors().size(); ++i) {
        CHECK(mine.tensors()[i].name == peer.tensors()[i].name);
        CHECK_MESSAGE(mine.tensors()[i].type == peer.tensors()[i].type, peer.tensors()[i].name);
      }
      CHECK(*mine.metadata().get_int("general.file_type") == *peer.metadata().get_int("general.file_type"));
      CHECK(*mine.metadata().get_int("general.quantization_version") == 2);
    }
    const double size = static_cast<double>(fs::file_size(out));
    const double peer_size = peer_ref[peer_name]["bytes"].get<double>();
    MESSAGE(type, ": size ", size, " (llama.cpp ", peer_size, ")");
    CHECK(std::fabs(size / peer_size - 1) < 0.01);
    if (std::find(ppl_types.begin(), ppl_types.end(), type) != ppl_types.end()) {
      const double p = ppl(out, 0), want = peer_ref[peer_name]["ppl_ctx256"].get<double>();
      MESSAGE(type, ": ppl ", p, " (llama.cpp ", want, ", ", 100 * (p / want - 1), "%)");
      CHECK(p / want - 1 < 0.005);
      CHECK(p / want - 1 > -0.05);  // far better would mean a broken comparison, not a better quantizer
    }
    fs::remove(out);
  }
}

TEST_CASE("quantize: plan rules for tensors whose rows are not whole 256-blocks") {
  gguf::Metadata meta("synthetic");
  meta.set("general.architecture", "llama");
  meta.set("llama.block_count", uint32_t{1});
  meta.set("llama.attention.head_count", uint32_t{4});
  meta.set("llama.attention.head_count_kv", uint32_t{4});
  std::vector<gguf::TensorInfo> ts(4);
  ts[0].name = "token_embd.weight", ts[0].type = quant::Type::F16, ts[0].ne = {96, 100};
  ts[1].name = "blk.0.attn_norm.weight", ts[1].type = quant::Type::F16, ts[1].ne = {96};
  ts[2].name = "blk.0.attn_v.weight", ts[2].type = quant::Type::F16, ts[2].ne = {96, 96};
  ts[3].name = "blk.0.ffn_down.weight", ts[3].type = quant::Type::F16, ts[3].ne = {512, 96};
  auto plan = quant::plan_types(*quant::find_mix("q4_k_m"), ts, meta, {.small_tensors_f32 = true});
  REQUIRE(plan.ok());
  CHECK((*plan)[0].type == quant::Type::Q8_0);  // tied output, rows not 256-blocks
  CHECK((*plan)[1].type == quant::Type::F32);   // 1-D stays unquantized
  CHECK((*plan)[2].type == quant::Type::Q8_0);  // Q6_K (last layer) -> Q8_0
  CHECK((*plan)[2].fallback);
  CHECK((*plan)[3].type == quant::Type::Q6_K);  // ffn_down of the last layer
  auto q4 = quant::plan_types(*quant::find_mix("Q4_K_S"), ts, meta);
  REQUIRE(q4.ok());
  CHECK((*q4)[1].type == quant::Type::F16);     // quantize keeps unquantized tensors as they are
  CHECK((*q4)[2].type == quant::Type::Q5_1);    // Q5_K (attn_v, i < 4) -> Q5_1
  CHECK(quant::find_mix("q4_k") != nullptr);
  CHECK(quant::find_mix("q4_k")->pure);
  CHECK(quant::find_mix("q9_9") == nullptr);
}

TEST_CASE("quantize: CLI errors leave no output file behind") {
  const fs::path dir = scratch_dir("quantize-errors");
  const std::string f16 = testdata("gguf/llama-draft-f16.gguf");
  const std::string q4 = testdata("gguf/llama-draft-Q4_0.gguf");
  const fs::path out = dir / "out.gguf";

  auto r = run_kite({"quantize", q4, out.string(), "Q4_K_M"});
  CHECK(r.exit_code == 1);
  CHECK(r.err.find("--allow-requantize") != std::string::npos);
  CHECK(r.err.find("already quantized") != std::string::npos);
  CHECK(!fs::exists(out));

  r = run_kite({"quantize", f16, out.string(), "Q7_X"});
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("unknown type 'Q7_X'") != std::string::npos);
  CHECK(r.err.find("Q4_K_M") != std::string::npos);
  CHECK(!fs::exists(out));

  r = run_kite({"quantize", (dir / "missing.gguf").string(), out.string(), "Q8_0"});
  CHECK(r.exit_code == 1);
  CHECK(r.err.find("missing.gguf") != std::string::npos);
  CHECK(!fs::exists(out));

  const std::string bytes = read_file(f16);
  const fs::path truncated = dir / "truncated.gguf";
  std::ofstream(truncated, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size() / 2));
  r = run_kite({"quantize", truncated.string(), out.string(), "Q8_0"});
  CHECK(r.exit_code == 1);
  CHECK(r.err.find("truncated.gguf") != std::string::npos);
  CHECK(!fs::exists(out));

  const fs::path nowhere = dir / "no-such-folder" / "out.gguf";
  r = run_kite({"quantize", f16, nowhere.string(), "Q8_0"});
  CHECK(r.exit_code == 1);
  CHECK(r.err.find("no-such-folder") != std::string::npos);
  CHECK(!fs::exists(nowhere));

  r = run_kite({"convert", (dir / "no-hf").string(), "-o", out.string()});
  CHECK(r.exit_code == 1);
  CHECK(!fs::exists(out));

  // An existing output survives a failed run untouched, and no temp file is left anywhere.
  std::ofstream(out) << "keep";
  r = run_kite({"quantize", q4, out.string(), "Q8_0"});
  CHECK(r.exit_code == 1);
  CHECK(read_file(out.string()) == "keep");
  CHECK(!dir_has_temp_files(dir));

  // The refusal is lifted by the flag; the result loads.
  r = run_kite({"quantize", q4, out.string(), "Q8_0", "--allow-requantize", "-t", "2"});
  CHECK_MESSAGE(r.exit_code == 0, r.err);
  CHECK(r.out.find("wrote") != std::string::npos);
  CHECK(open_gguf(out.string()).tensors().size() == open_gguf(f16).tensors().size());
  CHECK(!dir_has_temp_files(dir));

  // kite convert end to end: a loadable file with the mix's file type.
  const fs::path conv = dir / "draft-q8_0.gguf";
  r = run_kite({"convert", testdata("models/llama-draft"), "-o", conv.string(), "--type", "q8_0", "-t", "2"});
  CHECK_MESSAGE(r.exit_code == 0, r.err);
  CHECK(r.out.find("4 Q/K permuted") != std::string::npos);
  const gguf::File cf = open_gguf(conv.string());
  CHECK(*cf.metadata().get_int("general.file_type") == 7);
  CHECK(cf.find_tensor("blk.0.attn_q.weight")->type == quant::Type::Q8_0);
  CHECK(cf.find_tensor("blk.0.attn_norm.weight")->type == quant::Type::F32);
  CHECK(!dir_has_temp_files(dir));
}

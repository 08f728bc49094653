// kite convert / kite quantize: HF folders to f16 against llama.cpp's files, quantizing
// llama-draft-f16.gguf to each llama.cpp type against llama-quantize's files, and error paths.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <tuple>

#include "formats/convert.h"
#include "formats/gguf.h"
#include "formats/quant_mix.h"
#include "src/model/model.h"
#include "src/runtime/imatrix.h"
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
  REQUIRE_MESSAGE(src.ok(), (src.ok() ? std::string() : src.error().message));
  ConvertOptions opt;
  opt.type = type;
  opt.threads = 2;
  opt.small_tensors_f32 = hf;
  opt.llama_quantize_order = quantize_order;
  auto st = convert_model(**src, out.string(), opt);
  REQUIRE_MESSAGE(st.ok(), in, " -> ", type, ": ", (st.ok() ? std::string() : st.error().message));
  return out.string();
}

std::string convert_to(const std::string& in, const fs::path& out, const std::string& type, bool hf) {
  return convert_with(in, out, type, hf, false);
}

// llama.cpp's perplexity (-c 256) over the first `max_bytes` of heldout.txt (all of it for 0).
double ppl(const std::string& model_path, size_t max_bytes) {
  auto src = WeightSource::open(model_path);
  REQUIRE_MESSAGE(src.ok(), (src.ok() ? std::string() : src.error().message));
  auto tok = Tokenizer::load((*src)->metadata());
  REQUIRE_MESSAGE(tok.ok(), (tok.ok() ? std::string() : tok.error().message));
  auto model = Model::from_source(std::move(*src));
  REQUIRE_MESSAGE(model.ok(), (model.ok() ? std::string() : model.error().message));
  ContextOptions co;
  co.n_ctx = 256;
  auto ctx = Context::create(*model, co);
  REQUIRE_MESSAGE(ctx.ok(), (ctx.ok() ? std::string() : ctx.error().message));
  std::string text = read_file(testdata("heldout.txt"));
  if (max_bytes > 0) text.resize(std::min(text.size(), max_bytes));
  EncodeOptions eo;
  eo.add_special = false;
  std::vector<TokenId> ids = (*tok)->encode(text, eo);
  ids.insert(ids.begin(), (*tok)->bos());
  auto r = perplexity_llama_cpp(**ctx, ids, (*tok)->bos(), 256);
  REQUIRE_MESSAGE(r.ok(), (r.ok() ? std::string() : r.error().message));
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
  REQUIRE_MESSAGE(f.ok(), (f.ok() ? std::string() : f.error().message));
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

// The codebook mixes (IQ1_S .. IQ3_M, and Q2_K_S) with an importance matrix, through the CLI as a
// user runs them, against llama-quantize's files of the same f16 source made with the same
// imatrix (tests/data/iq-mixes-reference.json, tests/data/README.md): the same per-tensor types
// and file type, size within 1%, and held-out perplexity no worse than llama.cpp's by more than
// 1.5%. Measured (kite / llama.cpp - 1): IQ1_S +0.95%, IQ1_M +0.5%, IQ2_XXS +0.9%, the others
// -0.1% to -0.8%; over four models the 1-bit means are +0.4% and -0.3% (bench/RESULTS.md).
TEST_CASE("quantize: IQ mixes with an imatrix give llama.cpp's types and size, perplexity within 1.5%") {
  const fs::path dir = scratch_dir("quantize-iq-mixes");
  const std::string data = std::string(KITE_SOURCE_DIR) + "/tests/data/";
  const auto ref = nlohmann::json::parse(read_file(data + "iq-mixes-reference.json"));
  const std::string f16 = testdata("gguf/llama-draft-f16.gguf");
  REQUIRE(ref.size() == 11);
  for (const auto& [mix, want] : ref.items()) {
    CAPTURE(mix);
    const fs::path out = dir / (mix + ".gguf");
    const auto r = run_kite({"quantize", f16, out.string(), mix, "--imatrix", data + "llama-draft-imatrix.gguf"});
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    {
      gguf::File mine = open_gguf(out.string());
      CHECK(mine.tensors().size() == want["tensor_types"].size());
      for (const auto& t : mine.tensors())
        CHECK_MESSAGE(std::string(quant::find_traits(t.type)->name) == want["tensor_types"].value(t.name, "(none)"),
                      t.name);
      CHECK(*mine.metadata().get_int("general.file_type") == want["file_type"].get<int64_t>());
    }
    const double size = static_cast<double>(fs::file_size(out)), peer_size = want["bytes"].get<double>();
    CHECK(std::fabs(size / peer_size - 1) < 0.01);
    const double p = ppl(out.string(), 0), peer = want["ppl_ctx256"].get<double>();
    MESSAGE(mix, ": ppl ", p, " (llama.cpp ", peer, ", ", 100 * (p / peer - 1), "%)");
    CHECK(p / peer - 1 < 0.015);
    CHECK(p / peer - 1 > -0.05);
    fs::remove(out);
  }
}

// llama-quantize's overrides: the command that made tests/data/llama-draft-iq-mix.gguf
// (tests/data/README.md), given to kite quantize, gives its tensor types, its size and (kite's
// quantizers, the same importance matrix) a perplexity no worse than 1.5% over its own. Measured
// -5.6%: mostly the IQ3_S token embedding, which has no importance data (kite minimizes its plain
// error; put into llama.cpp's file alone it takes 81.4 to 77.6).
TEST_CASE("quantize: --token-embedding-type, --output-tensor-type and --tensor-type as llama-quantize's") {
  const fs::path dir = scratch_dir("quantize-overrides");
  const std::string data = std::string(KITE_SOURCE_DIR) + "/tests/data/";
  const fs::path out = dir / "iq-mix.gguf";
  std::vector<std::string> args = {"quantize",
                                   "--imatrix",
                                   data + "llama-draft-imatrix.gguf",
                                   "--token-embedding-type",
                                   "iq3_s",
                                   "--output-tensor-type",
                                   "iq2_s"};
  for (const char* tt :
       {"blk.0.attn_q=iq2_xxs", "blk.0.attn_k=iq2_xs", "blk.0.attn_v=iq2_s", "blk.0.attn_output=iq3_xxs",
        "blk.0.ffn_gate=iq1_s", "blk.0.ffn_up=iq1_m", "blk.0.ffn_down=iq3_s", "blk.1.attn_q=iq1_m",
        "blk.1.attn_k=iq1_s", "blk.1.attn_v=iq3_xxs", "blk.1.attn_output=iq2_s", "blk.1.ffn_gate=iq2_xs",
        "blk.1.ffn_up=iq3_s", "blk.1.ffn_down=iq2_xxs"})
    args.insert(args.end(), {"--tensor-type", tt});
  args.insert(args.end(), {testdata("gguf/llama-draft-f16.gguf"), out.string(), "IQ2_M"});
  const auto r = run_kite(args);
  REQUIRE_MESSAGE(r.exit_code == 0, r.err);
  const std::string peer_path = data + "llama-draft-iq-mix.gguf";
  {
    gguf::File mine = open_gguf(out.string()), peer = open_gguf(peer_path);
    REQUIRE(mine.tensors().size() == peer.tensors().size());
    for (const auto& pt : peer.tensors()) {
      const TensorInfo* mt = mine.find_tensor(pt.name);
      REQUIRE_MESSAGE(mt != nullptr, pt.name);
      CHECK_MESSAGE(mt->type == pt.type, pt.name);
    }
  }
  CHECK(std::fabs(static_cast<double>(fs::file_size(out)) / static_cast<double>(fs::file_size(peer_path)) - 1) < 0.01);
  const auto ref = nlohmann::json::parse(read_file(data + "iq-mix-reference.json"))["llama-draft-iq-mix.gguf"];
  const double p = ppl(out.string(), 0), peer = ref["ppl_ctx256"].get<double>();
  MESSAGE("iq-mix: ppl ", p, " (llama.cpp ", peer, ", ", 100 * (p / peer - 1), "%)");
  CHECK(p / peer - 1 < 0.015);

  // Bad overrides: usage errors naming the flag and the problem, no file.
  fs::remove(out);
  const std::string f16 = testdata("gguf/llama-draft-f16.gguf");
  for (const auto& [flag, value, want] :
       {std::tuple{"--tensor-type", "attn_v", "expected PATTERN=TYPE"},
        std::tuple{"--tensor-type", "attn_v=q9_9", "'q9_9' is not a type"},
        std::tuple{"--tensor-type", "blk.(=q4_0", "bad pattern"},
        std::tuple{"--output-tensor-type", "tq1_0", "'tq1_0' is not a type kite can produce"}}) {
    const auto bad = run_kite({"quantize", f16, out.string(), "Q4_K_M", flag, value});
    CHECK(bad.exit_code == 2);
    CHECK_MESSAGE(bad.err.find(want) != std::string::npos, bad.err);
    CHECK_MESSAGE(bad.err.find(flag) != std::string::npos, bad.err);
    CHECK(!fs::exists(out));
  }
}

// llama.cpp's rules for the codebook mixes on a deeper model than the test files (16 layers, no
// grouped-query attention, a separate output), where the per-layer rules show.
TEST_CASE("quantize: plan rules of the IQ mixes") {
  gguf::Metadata meta("synthetic");
  meta.set("general.architecture", "llama");
  meta.set("llama.block_count", uint32_t{16});
  meta.set("llama.attention.head_count", uint32_t{8});
  meta.set("llama.attention.head_count_kv", uint32_t{8});
  std::vector<gguf::TensorInfo> ts;
  auto add = [&](const std::string& name) {
    gguf::TensorInfo t;
    t.name = name, t.type = quant::Type::F16, t.ne = {512, 512};
    ts.push_back(t);
  };
  add("token_embd.weight");
  add("output.weight");
  for (int l = 0; l < 16; ++l)
    for (const char* n : {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"})
      add("blk." + std::to_string(l) + "." + n + ".weight");
  auto type_of = [&](const std::vector<quant::PlanEntry>& plan, const std::string& name) {
    for (size_t i = 0; i < ts.size(); ++i)
      if (ts[i].name == name) return std::string(quant::find_traits(plan[i].type)->name);
    return std::string("(none)");
  };
  auto plan = [&](const char* mix, bool imatrix) {
    auto p = quant::plan_types(*quant::find_mix(mix), ts, meta, {.has_imatrix = imatrix});
    REQUIRE(p.ok());
    return *p;
  };
  const auto xxs = plan("IQ2_XXS", true);
  CHECK(type_of(xxs, "token_embd.weight") == "q2_K");
  CHECK(type_of(xxs, "output.weight") == "q5_K");
  CHECK(type_of(xxs, "blk.3.attn_v.weight") == "q2_K");
  CHECK(type_of(xxs, "blk.1.ffn_down.weight") == "q2_K");  // the first eighth of the layers
  CHECK(type_of(xxs, "blk.2.ffn_down.weight") == "iq2_xxs");
  CHECK(type_of(xxs, "blk.5.attn_output.weight") == "iq2_xxs");
  const auto m = plan("IQ2_M", true);
  CHECK(type_of(m, "token_embd.weight") == "iq3_s");
  CHECK(type_of(m, "blk.0.attn_v.weight") == "iq3_s");
  CHECK(type_of(m, "blk.0.ffn_down.weight") == "iq3_s");
  CHECK(type_of(m, "blk.9.attn_output.weight") == "iq3_s");
  CHECK(type_of(m, "blk.9.ffn_up.weight") == "iq2_s");
  CHECK(type_of(plan("IQ1_S", true), "blk.9.attn_output.weight") == "iq2_xxs");
  CHECK(type_of(plan("IQ2_S", true), "blk.9.ffn_up.weight") == "iq2_xs");  // IQ2_S is mostly IQ2_XS
  const auto xs = plan("IQ3_XS", true);
  CHECK(type_of(xs, "blk.1.ffn_gate.weight") == "iq3_s");  // first and last eighth keep IQ3_S
  CHECK(type_of(xs, "blk.2.ffn_gate.weight") == "iq3_xxs");
  CHECK(type_of(xs, "blk.13.ffn_up.weight") == "iq3_xxs");
  CHECK(type_of(xs, "blk.14.ffn_up.weight") == "iq3_s");
  CHECK(type_of(xs, "blk.4.attn_q.weight") == "iq3_xxs");
  // IQ3_XXS chooses differently without an importance matrix (attn_v, ffn_down).
  const auto x3 = plan("IQ3_XXS", true), x3_plain = plan("IQ3_XXS", false);
  CHECK(type_of(x3, "blk.4.attn_v.weight") == "iq3_xxs");
  CHECK(type_of(x3_plain, "blk.4.attn_v.weight") == "iq3_s");
  CHECK(type_of(x3, "blk.4.ffn_down.weight") == "iq3_xxs");
  CHECK(type_of(x3_plain, "blk.0.ffn_down.weight") == "q4_K");
  CHECK(type_of(x3_plain, "blk.4.ffn_down.weight") == "q3_K");
  CHECK(type_of(x3, "blk.4.attn_k.weight") == "iq2_s");
  CHECK(type_of(x3, "blk.4.attn_output.weight") == "iq3_s");
  const auto im = plan("IQ3_M", true);
  CHECK(type_of(im, "blk.4.attn_v.weight") == "q4_K");
  CHECK(type_of(im, "blk.1.ffn_down.weight") == "q4_K");
  CHECK(type_of(im, "blk.4.ffn_down.weight") == "iq3_s");
  CHECK(type_of(im, "blk.4.attn_output.weight") == "q4_K");
  // --pure: the default type everywhere.
  auto pure = quant::plan_types(*quant::find_mix("IQ2_M"), ts, meta, {.pure = true});
  REQUIRE(pure.ok());
  for (const auto& e : *pure) CHECK(e.type == quant::Type::IQ2_S);
  // Rows that are not whole 256-blocks: IQ4_NL, as llama.cpp; Q2_K / Q3_K fall back to Q4_0.
  std::vector<gguf::TensorInfo> odd(1);
  odd[0].name = "blk.0.ffn_up.weight", odd[0].type = quant::Type::F16, odd[0].ne = {96, 64};
  auto o = quant::plan_types(*quant::find_mix("IQ2_XXS"), odd, meta);
  REQUIRE(o.ok());
  CHECK((*o)[0].type == quant::Type::IQ4_NL);
  o = quant::plan_types(*quant::find_mix("Q2_K"), odd, meta, {.pure = true});
  REQUIRE(o.ok());
  CHECK((*o)[0].type == quant::Type::Q4_0);
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
  for (const char* iq : {"IQ2_M", "iq2_xxs", "IQ1_S"}) {  // as llama.cpp: not without an importance matrix
    r = run_kite({"quantize", f16, out.string(), iq});
    CHECK(r.exit_code == 1);
    CHECK_MESSAGE(r.err.find("needs an importance matrix: pass --imatrix") != std::string::npos, r.err);
    CHECK_MESSAGE(r.err.find("tensor 'blk.0.") != std::string::npos, r.err);
    CHECK(!fs::exists(out));
  }
  {  // one whose importance matrix lacks a tensor
    auto src = WeightSource::open(f16);
    REQUIRE(src.ok());
    const std::map<std::string, std::vector<float>> partial = {{"blk.0.attn_q.weight", std::vector<float>(256, 1.0f)}};
    ConvertOptions opt;
    opt.type = "IQ2_XS";
    opt.importance = &partial;
    auto st = convert_model(**src, out.string(), opt);
    REQUIRE(!st.ok());
    CHECK_MESSAGE(st.error().message.find("the one given has no data for it") != std::string::npos, st.error().message);
    CHECK(!fs::exists(out));
  }

  r = run_kite({"quantize", f16, out.string(), "Q4_0", "-t", "-3"});
  CHECK(r.exit_code == 2);
  CHECK_MESSAGE(r.err.find("--threads: must be >= 0, got -3") != std::string::npos, r.err);
  CHECK(!fs::exists(out));
  r = run_kite({"imatrix", "-m", f16, "-f", testdata("heldout.txt"), "-c", "-5", "-o", out.string()});
  CHECK(r.exit_code == 2);
  CHECK_MESSAGE(r.err.find("--ctx: must be >= 4, got -5") != std::string::npos, r.err);
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

// --- Importance matrices (kite imatrix, quantize --imatrix, --sensitivity) ----------------------

namespace {

// Tokens of the first `bytes` of the training corpus (Shakespeare), BOS first.
std::vector<TokenId> corpus_tokens(const Tokenizer& tok, size_t bytes) {
  std::string text = read_file(testdata("corpus/tinyshakespeare.txt"));
  text.resize(std::min(text.size(), bytes));
  EncodeOptions eo;
  eo.add_special = false;
  std::vector<TokenId> ids = tok.encode(text, eo);
  ids.insert(ids.begin(), tok.bos());
  return ids;
}

ImatrixRun draft_imatrix(int64_t chunks, int64_t n_ctx, bool include_output) {
  auto src = WeightSource::open(testdata("gguf/llama-draft-f16.gguf"));
  REQUIRE_MESSAGE(src.ok(), (src.ok() ? std::string() : src.error().message));
  auto tok = Tokenizer::load((*src)->metadata());
  REQUIRE_MESSAGE(tok.ok(), (tok.ok() ? std::string() : tok.error().message));
  auto model = Model::from_source(std::move(*src));
  REQUIRE_MESSAGE(model.ok(), (model.ok() ? std::string() : model.error().message));
  const std::vector<TokenId> ids = corpus_tokens(**tok, static_cast<size_t>(chunks * n_ctx * 6));
  REQUIRE(static_cast<int64_t>(ids.size()) >= chunks * n_ctx);
  ImatrixOptions opt;
  opt.n_ctx = n_ctx;
  opt.max_chunks = chunks;
  opt.n_threads = 2;
  opt.include_output = include_output;
  opt.dataset = "tinyshakespeare.txt";
  auto run = compute_imatrix(*model, ids, (*tok)->bos(), opt);
  REQUIRE_MESSAGE(run.ok(), (run.ok() ? std::string() : run.error().message));
  return std::move(*run);
}

}  // namespace

TEST_CASE("imatrix: llama-draft over a corpus slice gives every matmul weight, its token count and positive sums, and round-trips") {
  const ImatrixRun run = draft_imatrix(4, 128, /*include_output=*/true);
  const Imatrix& m = run.imatrix;
  // 2 layers x 7 matmul weights, plus the tied output projection (token_embd).
  CHECK(m.entries.size() == 15);
  for (int l = 0; l < 2; ++l)
    for (const char* w : {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"}) {
      const std::string name = "blk." + std::to_string(l) + "." + w + ".weight";
      auto it = m.entries.find(name);
      REQUIRE_MESSAGE(it != m.entries.end(), name);
      CHECK(it->second.counts == std::vector<int64_t>{4 * 128});
      CHECK(it->second.sum2.size() == (std::string(w) == "ffn_down" ? 768u : 256u));
      for (double v : it->second.sum2) REQUIRE_MESSAGE((std::isfinite(v) && v > 0), name);
    }
  REQUIRE(m.entries.count("token_embd.weight") == 1);
  CHECK(m.entries.at("token_embd.weight").counts == std::vector<int64_t>{4 * 128});
  // q, k and v read the same normed input: the same sums.
  CHECK(m.entries.at("blk.1.attn_q.weight").sum2 == m.entries.at("blk.1.attn_v.weight").sum2);
  CHECK(m.chunk_count == 4);
  CHECK(m.chunk_size == 128);
  CHECK(run.ppl > 1.0);
  CHECK(run.ppl < 100.0);

  // Saved in llama.cpp's layout and read back.
  const fs::path dir = scratch_dir("imatrix-roundtrip");
  const std::string path = (dir / "draft.imatrix.gguf").string();
  REQUIRE(save_imatrix(m, path).ok());
  const gguf::File f = open_gguf(path);
  CHECK(*f.metadata().get<std::string>("general.type") == "imatrix");
  CHECK(*f.metadata().get_int("imatrix.chunk_count") == 4);
  CHECK(*f.metadata().get_int("imatrix.chunk_size") == 128);
  CHECK(f.metadata().get_array<std::string>("imatrix.datasets")->at(0) == "tinyshakespeare.txt");
  CHECK(f.tensors().size() == 30);
  CHECK(f.tensors()[0].name == "blk.0.attn_k.weight.in_sum2");  // name order
  CHECK(f.tensors()[1].name == "blk.0.attn_k.weight.counts");
  CHECK(f.find_tensor("blk.0.ffn_down.weight.in_sum2")->ne == std::vector<int64_t>{768, 1});
  auto back = load_imatrix(path);
  REQUIRE_MESSAGE(back.ok(), (back.ok() ? std::string() : back.error().message));
  CHECK(back->entries.size() == m.entries.size());
  for (const auto& [name, e] : m.entries) {
    const ImatrixEntry& b = back->entries.at(name);
    CHECK(b.counts == e.counts);
    REQUIRE(b.sum2.size() == e.sum2.size());
    for (size_t j = 0; j < e.sum2.size(); ++j) CHECK(b.sum2[j] == static_cast<double>(static_cast<float>(e.sum2[j])));
  }
  const auto imp = back->importance();
  CHECK(imp.at("blk.0.ffn_down.weight")[5] ==
        doctest::Approx(m.entries.at("blk.0.ffn_down.weight").sum2[5] / 512).epsilon(1e-6));

  // Files that are not importance matrices are refused with the reason.
  auto bad = load_imatrix(testdata("gguf/llama-draft-f16.gguf"));
  REQUIRE(!bad.ok());
  CHECK(bad.error().message.find("in_sum2") != std::string::npos);
  CHECK(!load_imatrix((dir / "missing.gguf").string()).ok());
}

// The direction of the gain, on real data: llama-draft quantized to q2_K (every matrix, where
// the gain is largest) with an importance matrix from 16 chunks of the training corpus scores a
// lower perplexity on the first 20 KB of the held-out text than without. Measured: 39.19 plain,
// 38.78 weighted (-1.05%); the margin asserted (-0.5%) is about half of it.
TEST_CASE("quantize: --imatrix lowers held-out perplexity at q2_K") {
  const ImatrixRun run = draft_imatrix(16, 256, /*include_output=*/true);
  const auto importance = run.imatrix.importance();
  const fs::path dir = scratch_dir("quantize-imatrix");
  const std::string f16 = testdata("gguf/llama-draft-f16.gguf");
  auto src = WeightSource::open(f16);
  REQUIRE(src.ok());
  auto quantize = [&](const std::string& out, const std::map<std::string, std::vector<float>>* imp) {
    ConvertOptions opt;
    opt.type = "q2_K";
    opt.threads = 2;
    opt.llama_quantize_order = true;
    opt.importance = imp;
    auto st = convert_model(**src, (dir / out).string(), opt);
    REQUIRE_MESSAGE(st.ok(), (st.ok() ? std::string() : st.error().message));
    return *st;
  };
  const ConvertStats plain = quantize("plain.gguf", nullptr);
  const ConvertStats weighted = quantize("weighted.gguf", &importance);
  CHECK(plain.n_weighted == 0);
  CHECK(weighted.n_weighted == 15);  // 14 block matrices + token_embd (the tied output)
  CHECK(weighted.bytes_out == plain.bytes_out);
  const double p_plain = ppl((dir / "plain.gguf").string(), 20000);
  const double p_weighted = ppl((dir / "weighted.gguf").string(), 20000);
  MESSAGE("llama-draft q2_K, held-out[0:20000] ppl: plain ", p_plain, ", with imatrix ", p_weighted);
  CHECK(p_weighted < p_plain * 0.995);

  // An importance matrix of another shape is refused, naming the tensor.
  std::map<std::string, std::vector<float>> wrong = importance;
  wrong["blk.0.ffn_up.weight"].resize(100, 1.0f);
  ConvertOptions opt;
  opt.type = "q4_K";
  opt.importance = &wrong;
  auto bad = convert_model(**src, (dir / "bad.gguf").string(), opt);
  REQUIRE(!bad.ok());
  CHECK(bad.error().message.find("blk.0.ffn_up.weight") != std::string::npos);
  CHECK(!fs::exists(dir / "bad.gguf"));
}

TEST_CASE("imatrix and quantize --imatrix / --sensitivity from the command line") {
  const fs::path dir = scratch_dir("imatrix-cli");
  const std::string f16 = testdata("gguf/llama-draft-f16.gguf");
  const std::string imat = (dir / "draft.imatrix.gguf").string();
  auto r = run_kite({"imatrix", "-m", f16, "-f", testdata("corpus/tinyshakespeare.txt"), "--chunks", "2", "-c", "128",
                     "-t", "2", "-o", imat});
  REQUIRE_MESSAGE(r.exit_code == 0, r.err);
  CHECK(r.out.find("14 weights, 2 chunks of 128 tokens") != std::string::npos);
  r = run_kite({"quantize", f16, (dir / "q3.gguf").string(), "Q3_K_M", "--imatrix", imat, "-t", "2"});
  CHECK_MESSAGE(r.exit_code == 0, r.err);
  CHECK(r.err.find("14 tensors quantized with importance, 1 without") != std::string::npos);
  r = run_kite({"quantize", f16, (dir / "q3.gguf").string(), "Q3_K_M", "--imatrix", f16});
  CHECK(r.exit_code == 1);
  CHECK(r.err.find("in_sum2") != std::string::npos);

  // One row per group (llama-draft ties the output to token_embd: 8 groups), sorted by cost.
  const std::string text = testdata("heldout.txt");
  r = run_kite({"quantize", "--sensitivity", "-f", text, f16, "q2_K", "--chunks", "2", "-c", "128", "-t", "2"});
  REQUIRE_MESSAGE(r.exit_code == 0, r.err);
  MESSAGE(r.out);
  int rows = 0;
  double last = INFINITY;
  for (const char* g : {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down", "token_embd"}) {
    const size_t at = r.out.find(std::string("\n") + g + " ");
    CHECK_MESSAGE(at != std::string::npos, g);
    rows += at != std::string::npos;
  }
  CHECK(rows == 8);
  CHECK(r.out.find("base ") != std::string::npos);
  std::istringstream lines(r.out);
  std::string line;
  int data_rows = 0;
  while (std::getline(lines, line)) {
    char name[64];
    int n = 0;
    double p = 0;
    if (std::sscanf(line.c_str(), "%63s %d %lf", name, &n, &p) != 3) continue;
    CHECK(p <= last);  // costliest first
    last = p;
    ++data_rows;
  }
  CHECK(data_rows == 8);
  r = run_kite({"quantize", "--sensitivity", "--per-layer", "-f", text, f16, "q4_K", "--chunks", "1", "-c", "64"});
  REQUIRE_MESSAGE(r.exit_code == 0, r.err);
  CHECK(r.out.find("\nblk.1.ffn_down ") != std::string::npos);
  CHECK(r.out.find("\nblk.0.attn_q ") != std::string::npos);
  r = run_kite({"quantize", "--sensitivity", f16, "q4_K"});
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("-f") != std::string::npos);
}

// Tokenizer tests on the real vocabularies: llama.cpp's vocab test files (expected ids made by
// the Hugging Face tokenizers), the reference prompts of the test models, round trips over the
// corpus, streaming decode, errors, speed, and the `kite tokenize` command.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "formats/gguf.h"
#include "formats/weight_source.h"
#include "src/runtime/tokenizer.h"
#include "tests/testdata.h"

namespace {

using kite::TokenId;
using kite::Tokenizer;
using kite::test::read_file;
using kite::test::testdata;

std::shared_ptr<const Tokenizer> load_gguf_tokenizer(const std::string& path) {
  auto f = kite::gguf::File::open(path);
  REQUIRE_MESSAGE(f.ok(), (f.ok() ? "" : f.error().message));
  auto tok = Tokenizer::load(f->metadata());
  REQUIRE_MESSAGE(tok.ok(), (tok.ok() ? "" : tok.error().message));
  return *tok;
}

std::shared_ptr<const Tokenizer> load_folder_tokenizer(const std::string& path) {
  auto src = kite::WeightSource::open(path);
  REQUIRE_MESSAGE(src.ok(), (src.ok() ? "" : src.error().message));
  auto tok = Tokenizer::load((*src)->metadata());
  REQUIRE_MESSAGE(tok.ok(), (tok.ok() ? "" : tok.error().message));
  return *tok;
}

std::string ids_text(const std::vector<TokenId>& ids) {
  std::string s;
  for (TokenId id : ids) {
    if (!s.empty()) s += ' ';
    s += std::to_string(id);
  }
  return s;
}

// llama.cpp's tests/test-tokenizer-0.cpp reads the pairs this way: inputs split on
// "\n__ggml_vocab_test__\n" (nothing else stripped), one line of ids per input.
std::vector<std::pair<std::string, std::vector<TokenId>>> read_vocab_tests(const std::string& gguf) {
  const std::string inp = read_file(gguf + ".inp");
  const std::string out = read_file(gguf + ".out");
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> inputs;
  for (size_t pos = 0; pos < inp.size();) {
    size_t next = inp.find(sep, pos);
    if (next == std::string::npos) {
      inputs.push_back(inp.substr(pos));
      break;
    }
    inputs.push_back(inp.substr(pos, next - pos));
    pos = next + sep.size();
  }
  std::vector<std::vector<TokenId>> expected;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream is(line);
    std::vector<TokenId> ids;
    for (long x; is >> x;) ids.push_back(static_cast<TokenId>(x));
    expected.push_back(ids);
  }
  REQUIRE_MESSAGE(inputs.size() == expected.size(), gguf, ": ", inputs.size(), " inputs, ", expected.size(),
                  " outputs");
  std::vector<std::pair<std::string, std::vector<TokenId>>> tests;
  for (size_t i = 0; i < inputs.size(); ++i) tests.emplace_back(inputs[i], expected[i]);
  return tests;
}

void check_vocab(const std::string& name) {
  const std::string path = testdata("vocab/ggml-vocab-" + name + ".gguf");
  auto tok = load_gguf_tokenizer(path);
  auto tests = read_vocab_tests(path);
  int failed = 0;
  for (const auto& [text, want] : tests) {
    std::vector<TokenId> got = tok->encode(text, {.add_special = false, .parse_special = false});
    if (got != want) {
      ++failed;
      FAIL_CHECK(name, ": '", text, "'\n  want ", ids_text(want), "\n  got  ", ids_text(got));
    }
  }
  MESSAGE(name, ": ", tests.size() - failed, "/", tests.size(), " cases match");
  CHECK(failed == 0);
  CHECK(tests.size() >= 40);
}

}  // namespace

TEST_CASE("tokenizer: vocab llama-spm") {
  check_vocab("llama-spm");
}
TEST_CASE("tokenizer: vocab phi-3") {
  check_vocab("phi-3");
}
TEST_CASE("tokenizer: vocab llama-bpe") {
  check_vocab("llama-bpe");
}
TEST_CASE("tokenizer: vocab gpt-2") {
  check_vocab("gpt-2");
}
TEST_CASE("tokenizer: vocab qwen2") {
  check_vocab("qwen2");
}
TEST_CASE("tokenizer: vocab deepseek-llm") {
  check_vocab("deepseek-llm");
}
TEST_CASE("tokenizer: vocab deepseek-coder") {
  check_vocab("deepseek-coder");
}
TEST_CASE("tokenizer: vocab falcon") {
  check_vocab("falcon");
}
TEST_CASE("tokenizer: vocab mpt") {
  check_vocab("mpt");
}
TEST_CASE("tokenizer: vocab starcoder") {
  check_vocab("starcoder");
}
TEST_CASE("tokenizer: vocab refact") {
  check_vocab("refact");
}
TEST_CASE("tokenizer: vocab bert-bge") {
  check_vocab("bert-bge");
}

TEST_CASE("tokenizer: every vocab test file has a test case") {
  const std::vector<std::string> covered = {"llama-spm", "phi-3",        "llama-bpe",      "gpt-2",
                                            "qwen2",     "deepseek-llm", "deepseek-coder", "falcon",
                                            "mpt",       "starcoder",    "refact",         "bert-bge"};
  for (const std::string& inp : kite::test::testdata_files("vocab", ".gguf.inp")) {
    const std::string file = std::filesystem::path(inp).filename().string();
    const std::string name =
        file.substr(std::string("ggml-vocab-").size(),
                    file.size() - std::string("ggml-vocab-").size() - std::string(".gguf.inp").size());
    CHECK_MESSAGE(std::find(covered.begin(), covered.end(), name) != covered.end(), "no test case for ", file);
  }
}

TEST_CASE("tokenizer: baichuan (SPM, no test file) loads and round-trips") {
  auto tok = load_gguf_tokenizer(testdata("vocab/ggml-vocab-baichuan.gguf"));
  CHECK(tok->type() == kite::VocabType::kSpm);
  CHECK(tok->bos() == 1);
  const std::string text = "Hello world, 你好世界! \t tabs\nand 🦙 emoji";
  auto ids = tok->encode(text, {.add_special = true});
  REQUIRE(ids.size() > 5);
  CHECK(ids[0] == 1);
  CHECK(tok->decode(ids, {.render_special = false}) == text);
}

namespace {

// The GGUF file each test model's tokenizer was converted into (llama-target shares
// llama-draft's tokenizer and has its own Q4_K_M file).
std::string gguf_for_model(const std::string& model) {
  if (model == "llama-target") return testdata("gguf/llama-target-Q4_K_M.gguf");
  return testdata("gguf/" + model + "-f16.gguf");
}

void check_reference_prompts(const Tokenizer& tok, const std::string& model_dir, const std::string& what) {
  auto ref = nlohmann::json::parse(read_file(model_dir + "/reference.json"));
  REQUIRE(ref["prompts"].size() >= 4);
  for (const auto& p : ref["prompts"]) {
    const std::string text = p["text"];
    const std::vector<TokenId> want = p["ids"].get<std::vector<TokenId>>();
    const std::vector<TokenId> got = tok.encode(text, {.add_special = true});
    CHECK_MESSAGE(got == want, what, ": '", text, "'\n  want ", ids_text(want), "\n  got  ", ids_text(got));
    CHECK(tok.decode(got, {.render_special = false}) == text);
    // transformers' decode of the 48 greedy tokens; the streaming decoder must agree too.
    const std::vector<TokenId> greedy = p["greedy_48"].get<std::vector<TokenId>>();
    const std::string want_text = p["greedy_48_text"];
    CHECK_MESSAGE(tok.decode(greedy) == want_text, what, ": decode of greedy_48 after '", text, "'");
    kite::StreamDecoder dec(tok, {.strip_leading_space = false});
    std::string streamed;
    for (TokenId id : greedy) streamed += dec.push(id);
    CHECK(streamed + dec.flush() == want_text);
  }
}

const char* const kModels[] = {"llama-draft", "llama-target", "qwen2-tiny", "qwen3-tiny"};

}  // namespace

TEST_CASE("tokenizer: reference prompt ids from the GGUF files") {
  for (const char* m : kModels) {
    auto tok = load_gguf_tokenizer(gguf_for_model(m));
    check_reference_prompts(*tok, testdata(std::string("models/") + m), gguf_for_model(m));
  }
}

TEST_CASE("tokenizer: reference prompt ids from the Hugging Face folders") {
  for (const char* m : kModels) {
    const std::string dir = testdata(std::string("models/") + m);
    auto tok = load_folder_tokenizer(dir);
    check_reference_prompts(*tok, dir, dir);
    CHECK(tok->bos() == 0);
    CHECK(tok->eos() == 1);
    CHECK(tok->is_eog(1));
    CHECK(tok->is_eog(4));  // <|eot_id|>
  }
}

namespace {

std::vector<std::string> corpus_files() {
  auto files = kite::test::testdata_files("corpus", ".txt");
  files.push_back(testdata("heldout.txt"));
  return files;
}

// decode(encode(text)) == text, and the streaming decoder gives the same text.
void check_round_trip(const Tokenizer& tok, const std::string& label) {
  for (const std::string& path : corpus_files()) {
    const std::string text = read_file(path);
    auto ids = tok.encode(text, {.add_special = false});
    REQUIRE(!ids.empty());
    const std::string back = tok.decode(ids);
    CHECK_MESSAGE(back == text, label, ": round trip of ", path, " differs");
    kite::StreamDecoder dec(tok);
    std::string streamed;
    for (TokenId id : ids) streamed += dec.push(id);
    streamed += dec.flush();
    CHECK_MESSAGE(streamed == text, label, ": streamed decode of ", path, " differs");
  }
}

}  // namespace

TEST_CASE("tokenizer: corpus round trip, llama-bpe vocab") {
  check_round_trip(*load_gguf_tokenizer(testdata("vocab/ggml-vocab-llama-bpe.gguf")), "llama-bpe");
}

TEST_CASE("tokenizer: corpus round trip, test model tokenizer") {
  check_round_trip(*load_gguf_tokenizer(testdata("gguf/llama-draft-f16.gguf")), "llama-draft gguf");
}

TEST_CASE("tokenizer: corpus round trip, SPM vocab") {
  check_round_trip(*load_gguf_tokenizer(testdata("vocab/ggml-vocab-llama-spm.gguf")), "llama-spm");
}

TEST_CASE("tokenizer: streaming decoder holds back incomplete UTF-8") {
  auto tok = load_gguf_tokenizer(testdata("vocab/ggml-vocab-llama-spm.gguf"));
  auto byte = [&](const char* hex) {
    auto id = tok->find_token(std::string("<0x") + hex + ">");
    REQUIRE(id.has_value());
    return *id;
  };
  const std::string repl = "\xEF\xBF\xBD";  // U+FFFD
  kite::StreamDecoder dec(*tok);
  // "🦙" = F0 9F A6 99, one byte token at a time: nothing until the last byte.
  CHECK(dec.push(byte("F0")) == "");
  CHECK(dec.push(byte("9F")) == "");
  CHECK(dec.push(byte("A6")) == "");
  CHECK(dec.push(byte("99")) == "\xF0\x9F\xA6\x99");
  // A byte that can never start a character comes out as U+FFFD at once.
  CHECK(dec.push(byte("FF")) == repl);
  // A lead byte followed by a non-continuation: U+FFFD, then the next character.
  CHECK(dec.push(byte("E2")) == "");
  auto hello = tok->find_token("\xE2\x96\x81Hello");
  REQUIRE(hello.has_value());
  CHECK(dec.push(*hello) == repl + " Hello");
  // An unfinished character at the end is flushed as U+FFFD.
  CHECK(dec.push(byte("C3")) == "");
  CHECK(dec.flush() == repl);
  CHECK(dec.flush() == "");
  // The first piece of a stream loses the SPM space prefix; later pieces keep their space.
  dec.reset();
  CHECK(dec.push(*hello) == "Hello");
  CHECK(dec.push(*hello) == " Hello");
  // Full decode never returns broken UTF-8 either.
  std::vector<TokenId> ids = {byte("F0"), byte("9F"), *hello};
  CHECK(tok->decode(ids) == repl + " Hello");
}

TEST_CASE("tokenizer: special tokens, BOS and EOS") {
  auto tok = load_gguf_tokenizer(testdata("vocab/ggml-vocab-llama-bpe.gguf"));
  CHECK(tok->type() == kite::VocabType::kBpe);
  CHECK(tok->bos() == 128000);
  CHECK(tok->add_bos());
  CHECK(tok->is_eog(128009));  // <|eot_id|>
  const std::string text = "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>";
  auto parsed = tok->encode(text, {.add_special = true, .parse_special = true});
  REQUIRE(parsed.size() >= 6);
  CHECK(parsed[0] == 128000);
  CHECK(parsed[1] == 128006);
  CHECK(parsed.back() == 128009);
  auto plain = tok->encode(text, {.add_special = false, .parse_special = false});
  CHECK(std::find(plain.begin(), plain.end(), 128006) == plain.end());
  CHECK(plain.size() > parsed.size());
  CHECK(tok->decode(plain) == text);
  CHECK(tok->decode(parsed, {.render_special = true}) == "<|begin_of_text|>" + text);
  CHECK(tok->decode(parsed, {.render_special = false}) == "user\n\nHi");
  CHECK(tok->encode("", {.add_special = true}) == std::vector<TokenId>{128000});
  CHECK(tok->encode("", {.add_special = false}).empty());

  auto spm = load_gguf_tokenizer(testdata("vocab/ggml-vocab-llama-spm.gguf"));
  auto ids = spm->encode("Hello world", {.add_special = true});
  CHECK(ids == std::vector<TokenId>{1, 15043, 3186});
  CHECK(spm->decode(ids, {.render_special = false}) == "Hello world");
  // After a special token the SPM space prefix comes back, as in sentencepiece.
  auto with_eos = spm->encode("a</s>b", {.add_special = false, .parse_special = true});
  REQUIRE(with_eos.size() == 3);
  CHECK(with_eos[1] == 2);
  CHECK(with_eos[2] == *spm->find_token("\xE2\x96\x81"
                                        "b"));
}

TEST_CASE("tokenizer: bad metadata is an error naming the key") {
  kite::gguf::Metadata md("bad.gguf");
  auto r = Tokenizer::load(md);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message.find("tokenizer.ggml.model") != std::string::npos);

  md.set("tokenizer.ggml.model", "unigram-x");
  r = Tokenizer::load(md);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message.find("unigram-x") != std::string::npos);

  md.set("tokenizer.ggml.model", "gpt2");
  r = Tokenizer::load(md);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message.find("tokenizer.ggml.tokens") != std::string::npos);

  kite::gguf::Array toks{kite::gguf::ValueType::STRING, {kite::gguf::Value("a"), kite::gguf::Value("b")}};
  md.set("tokenizer.ggml.tokens", toks);
  r = Tokenizer::load(md);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message.find("tokenizer.ggml.merges") != std::string::npos);

  md.set("tokenizer.ggml.merges", kite::gguf::Array{kite::gguf::ValueType::STRING, {kite::gguf::Value("a b")}});
  md.set("tokenizer.ggml.pre", "no-such-pre");
  r = Tokenizer::load(md);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message.find("no-such-pre") != std::string::npos);

  md.set("tokenizer.ggml.pre", "gpt-2");
  md.set("tokenizer.ggml.scores", kite::gguf::Array{kite::gguf::ValueType::F32, {kite::gguf::Value(1.0f)}});
  r = Tokenizer::load(md);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message.find("tokenizer.ggml.scores") != std::string::npos);

  md.remove("tokenizer.ggml.scores");
  r = Tokenizer::load(md);
  REQUIRE(r.ok());
  // Ill-formed UTF-8 input is encoded as U+FFFD, never crashes.
  CHECK_NOTHROW((*r)->encode(std::string("ab\xFF\xC3", 4)));
}

TEST_CASE("tokenizer: one tokenizer shared by threads gives the same ids") {
  auto tok = load_gguf_tokenizer(testdata("vocab/ggml-vocab-qwen2.gguf"));
  const std::string text = read_file(testdata("corpus/tinyshakespeare.txt")).substr(0, 200000);
  const std::vector<TokenId> want = tok->encode(text, {.add_special = false});
  std::vector<std::vector<TokenId>> got(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) threads.emplace_back([&, t] { got[t] = tok->encode(text, {.add_special = false}); });
  for (auto& th : threads) th.join();
  for (const auto& g : got) CHECK(g == want);
  CHECK(tok->decode(want) == text);
}

TEST_CASE("tokenizer: encoding speed, war_and_peace with llama-bpe") {
  auto tok = load_gguf_tokenizer(testdata("vocab/ggml-vocab-llama-bpe.gguf"));
  const std::string text = read_file(testdata("corpus/war_and_peace.txt"));
  std::vector<double> wall, cpu;
  size_t n_tokens = 0;
  for (int run = 0; run < 3; ++run) {
    timespec c0, c1;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
    auto t0 = std::chrono::steady_clock::now();
    n_tokens = tok->encode(text, {.add_special = false}).size();
    wall.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
    cpu.push_back((c1.tv_sec - c0.tv_sec) + (c1.tv_nsec - c0.tv_nsec) * 1e-9);
  }
  std::sort(wall.begin(), wall.end());
  std::sort(cpu.begin(), cpu.end());
  MESSAGE("war_and_peace.txt: ", text.size(), " bytes -> ", n_tokens, " tokens; median of 3: wall ", wall[1] * 1e3,
          " ms = ", n_tokens / wall[1] / 1e6, " M tokens/s; thread cpu ", cpu[1] * 1e3,
          " ms = ", n_tokens / cpu[1] / 1e6, " M tokens/s");
  CHECK(n_tokens > text.size() / 8);
  CHECK(n_tokens < text.size() / 2);
}

TEST_CASE("tokenizer: kite tokenize command") {
  const auto dir = kite::test::scratch_dir("tokenize-cmd");
  const std::string out = (dir / "out.txt").string();
  const std::string model = testdata("gguf/llama-draft-f16.gguf");
  auto run = [&](const std::string& args) {
    const std::string cmd = std::string(KITE_EXE) + " tokenize -m '" + model + "' " + args + " > '" + out + "' 2>&1";
    return std::system(cmd.c_str());
  };
  // The first reference prompt of llama-draft, ids with BOS.
  auto ref = nlohmann::json::parse(read_file(testdata("models/llama-draft/reference.json")));
  const std::string text = ref["prompts"][1]["text"];
  const std::vector<TokenId> want = ref["prompts"][1]["ids"].get<std::vector<TokenId>>();
  REQUIRE(run("--ids-only '" + text + "'") == 0);
  std::string got = read_file(out);
  while (!got.empty() && (got.back() == '\n' || got.back() == ' ')) got.pop_back();
  CHECK(got == ids_text(want));

  REQUIRE(run("--no-bos 'Prince Andrew'") == 0);
  got = read_file(out);
  CHECK(got.find("0\t") == std::string::npos);
  CHECK(got.find("'Prince'") != std::string::npos);
  CHECK(got.find("' Andrew'") != std::string::npos);

  const std::string file = (dir / "in.txt").string();
  {
    std::ofstream f(file);
    f << "<|eot_id|>x";
  }
  REQUIRE(run("--no-bos --parse-special --ids-only --file '" + file + "'") == 0);
  got = read_file(out);
  CHECK(got.rfind("4 ", 0) == 0);
  CHECK(run("--file /no/such/file") != 0);
}

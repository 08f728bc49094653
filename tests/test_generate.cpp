// Generation end to end through the kite binary: greedy text equal to llama.cpp's on the same
// files (peer-reference.json), and perplexity by llama.cpp's definition.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "tests/process.h"

using namespace kite::test;

namespace {

nlohmann::json peer() { return nlohmann::json::parse(read_file(testdata("gguf/peer-reference.json"))); }

// llama.cpp prints the whole sequence with BOS rendered; kite run prints the prompt without it.
std::string without_bos(std::string s, const std::string& bos) {
  if (s.rfind(bos, 0) == 0) s = s.substr(bos.size());
  if (!s.empty() && s[0] == ' ') s = s.substr(1);  // SPM: the space of the first word
  return s;
}

}  // namespace

TEST_CASE("generate: stories260K greedy text equals llama.cpp's (F32, F16, Q8_0)") {
  const auto ref = peer();
  for (const char* file : {"stories260K.gguf", "stories260K-F16.gguf", "stories260K-Q8_0.gguf"}) {
    const auto& r = ref[file];
    auto out = run_kite({"run", "-m", testdata(std::string("gguf/") + file), "-p", r["greedy32_prompt"], "-n", "32",
                         "--temp", "0"});
    REQUIRE_MESSAGE(out.exit_code == 0, file, ": ", out.err);
    CHECK_MESSAGE(out.out == without_bos(r["greedy32_output"], "<s>"), file);
    CHECK(out.err.find("generated 32 tokens") != std::string::npos);
  }
}

TEST_CASE("generate: kite run rejects bad arguments and files") {
  auto no_model = run_kite({"run", "-p", "hi"});
  CHECK(no_model.exit_code == 2);
  auto bad = run_kite({"run", "-m", "/nonexistent.gguf", "-p", "hi"});
  CHECK(bad.exit_code == 1);
  CHECK(bad.err.find("/nonexistent.gguf") != std::string::npos);
  auto vocab_only = run_kite({"run", "-m", testdata("vocab/ggml-vocab-llama-spm.gguf"), "-p", "hi"});
  CHECK(vocab_only.exit_code == 1);
  CHECK(!vocab_only.err.empty());
  auto neg = run_kite({"run", "-m", testdata("gguf/stories260K.gguf"), "-p", "hi", "-n", "-3"});
  CHECK(neg.exit_code == 2);
}

TEST_CASE("generate: sampling is reproducible for a seed") {
  const std::vector<std::string> args = {"run", "-m", testdata("gguf/stories260K.gguf"), "-p", "Once upon a time",
                                         "-n", "24", "--temp", "1.0", "--seed", "42"};
  auto a = run_kite(args);
  auto b = run_kite(args);
  REQUIRE(a.exit_code == 0);
  CHECK(a.out == b.out);
  auto args2 = args;
  args2.back() = "43";
  auto c = run_kite(args2);
  CHECK(c.out != a.out);
}

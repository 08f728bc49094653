// Generation end to end through the kite binary: greedy text equal to llama.cpp's on the same
// files (peer-reference.json), and perplexity by llama.cpp's definition.
#include <doctest/doctest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

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

TEST_CASE("generate: the IQ codebook mix's greedy text equals llama.cpp's") {
  const std::string dir = std::string(KITE_SOURCE_DIR) + "/tests/data";
  const auto ref = nlohmann::json::parse(read_file(dir + "/iq-mix-reference.json"))["llama-draft-iq-mix.gguf"];
  auto out = run_kite(
      {"run", "-m", dir + "/llama-draft-iq-mix.gguf", "-p", ref["greedy32_prompt"], "-n", "32", "--temp", "0"});
  REQUIRE_MESSAGE(out.exit_code == 0, out.err);
  CHECK(out.out == without_bos(ref["greedy32_output"], "<|begin_of_text|>"));
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
  // Numbers out of range: a usage error naming the flag and its bound.
  const std::pair<std::vector<std::string>, std::string> bad_numbers[] = {
      {{"-n", "-3"}, "--n-predict: must be >= 0, got -3"},
      {{"-c", "-1"}, "--ctx: must be >= 0, got -1"},
      {{"--top-p", "1.5"}, "--top-p: must be in [0, 1], got 1.5"},
      {{"-t", "two"}, "'two' is not a number"}};
  for (const auto& [flag, message] : bad_numbers) {
    std::vector<std::string> args = {"run", "-m", testdata("gguf/stories260K.gguf"), "-p", "hi"};
    args.insert(args.end(), flag.begin(), flag.end());
    const auto r = run_kite(args);
    CHECK(r.exit_code == 2);
    CHECK_MESSAGE(r.err.find(message) != std::string::npos, r.err);
  }
}

TEST_CASE("generate: kite run says when the context, not -n, ended a completion") {
  const std::string model = testdata("gguf/stories260K.gguf");
  auto cut = run_kite({"run", "-m", model, "-p", "Once upon a time", "-c", "12", "-n", "50", "--ignore-eos"});
  REQUIRE_MESSAGE(cut.exit_code == 0, cut.err);
  CHECK_MESSAGE(cut.err.find("stopped at the context limit (-c 12: ") != std::string::npos, cut.err);
  CHECK(cut.err.find("before -n 50") != std::string::npos);
  auto whole = run_kite({"run", "-m", model, "-p", "Once upon a time", "-c", "64", "-n", "8", "--ignore-eos"});
  REQUIRE_MESSAGE(whole.exit_code == 0, whole.err);
  CHECK(whole.err.find("context limit") == std::string::npos);
  CHECK(whole.err.find("generated 8 tokens") != std::string::npos);
  CHECK(whole.err.find("warning") == std::string::npos);
  // -c 0: the model's training context (2048 for stories260K), as llama.cpp reads it.
  auto trained = run_kite({"run", "-m", model, "-p", "Once upon a time", "-c", "0", "-n", "3000", "--ignore-eos"});
  REQUIRE_MESSAGE(trained.exit_code == 0, trained.err);
  CHECK_MESSAGE(trained.err.find("stopped at the context limit (-c 2048: ") != std::string::npos, trained.err);
  // Past the model's training context: a warning, and the run goes on.
  auto long_ctx = run_kite({"run", "-m", model, "-p", "Once upon a time", "-c", "4096", "-n", "2"});
  REQUIRE_MESSAGE(long_ctx.exit_code == 0, long_ctx.err);
  CHECK_MESSAGE(long_ctx.err.find("warning: -c 4096 is longer than the 2048 tokens") != std::string::npos, long_ctx.err);
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

TEST_CASE("generate: kite run runs several prompts concurrently, one JSON line each in input order") {
  const std::string model = testdata("models/llama-target");
  const std::vector<std::string> prompts = {"First Citizen:", "MENENIUS:\nWhat", "Hello there, good", "The king"};
  std::vector<std::string> alone;
  for (const auto& p : prompts) {
    auto one = run_kite({"run", "-m", model, "-p", p, "-n", "12", "--temp", "0", "--jsonl"});
    REQUIRE_MESSAGE(one.exit_code == 0, one.err);
    alone.push_back(nlohmann::json::parse(one.out)["text"]);
  }
  std::vector<std::string> args = {"run", "-m", model, "-n", "12", "--temp", "0"};
  for (const auto& p : prompts) args.insert(args.end(), {"-p", p});
  auto all = run_kite(args);
  REQUIRE_MESSAGE(all.exit_code == 0, all.err);
  std::istringstream lines(all.out);
  std::string line;
  size_t i = 0;
  for (; std::getline(lines, line); ++i) {
    auto j = nlohmann::json::parse(line);
    REQUIRE(i < prompts.size());
    CHECK(j["index"] == i);
    CHECK(j["text"] == alone[i]);
    CHECK(j["finish_reason"] == "length");
    CHECK(j["completion_tokens"] == 12);
  }
  CHECK(i == prompts.size());
  CHECK(all.err.find("4 prompt(s)") != std::string::npos);

  // The same prompts from a file, one JSON string per line.
  const auto dir = scratch_dir("run-prompts-file");
  {
    std::ofstream f(dir / "prompts.jsonl");
    for (const auto& p : prompts) f << nlohmann::json(p).dump() << "\n";
  }
  auto from_file = run_kite({"run", "-m", model, "-n", "12", "--temp", "0", "--prompts-file", (dir / "prompts.jsonl").string()});
  REQUIRE(from_file.exit_code == 0);
  CHECK(from_file.out == all.out);
  {
    std::ofstream f(dir / "bad.jsonl");
    f << "\"ok\"\nnot json\n";
  }
  auto bad = run_kite({"run", "-m", model, "--prompts-file", (dir / "bad.jsonl").string()});
  CHECK(bad.exit_code == 2);
  CHECK(bad.err.find("bad.jsonl:2") != std::string::npos);
}

TEST_CASE("generate: kite run --json-schema and --grammar constrain the output") {
  const std::string model = testdata("models/llama-target");
  const auto dir = scratch_dir("run-constrained");
  {
    std::ofstream f(dir / "schema.json");
    f << R"({"type":"object","properties":{"answer":{"enum":["yes","no"]},"n":{"type":"integer"}},"required":["answer","n"]})";
    std::ofstream g(dir / "yesno.gbnf");
    g << "root ::= (\"yes\" | \"no\") \" because \" [a-z ]{1,20} \".\"\n";
    std::ofstream b(dir / "bad.gbnf");
    b << "root ::= root \"x\"\n";
  }
  auto js = run_kite({"run", "-m", model, "-p", "Q:", "-p", "A:", "-n", "80", "--temp", "0.8", "--seed", "3",
                      "--json-schema", (dir / "schema.json").string()});
  REQUIRE_MESSAGE(js.exit_code == 0, js.err);
  std::istringstream lines(js.out);
  std::string line;
  while (std::getline(lines, line)) {
    auto j = nlohmann::json::parse(line);
    if (j["finish_reason"] != "stop") continue;
    auto doc = nlohmann::json::parse(j["text"].get<std::string>());
    CHECK((doc["answer"] == "yes" || doc["answer"] == "no"));
    CHECK(doc["n"].is_number_integer());
  }
  auto gr = run_kite({"run", "-m", model, "-p", "Q:", "-n", "40", "--temp", "0", "--grammar", (dir / "yesno.gbnf").string()});
  REQUIRE_MESSAGE(gr.exit_code == 0, gr.err);
  CHECK((gr.out.find("Q:yes because ") == 0 || gr.out.find("Q:no because ") == 0));
  auto bad = run_kite({"run", "-m", model, "-p", "Q:", "--grammar", (dir / "bad.gbnf").string()});
  CHECK(bad.exit_code == 2);
  CHECK(bad.err.find("recursion") != std::string::npos);
}

TEST_CASE("cli: kite help CMD prints that command's help, --version, unknown commands are usage errors") {
  auto run = run_kite({"help", "run"});
  CHECK(run.exit_code == 0);
  CHECK(run.out.find("Usage: kite run") != std::string::npos);
  CHECK(run.out.find("--json-schema") != std::string::npos);
  CHECK(run.out == run_kite({"run", "--help"}).out);
  auto all = run_kite({"help"});
  CHECK(all.exit_code == 0);
  for (const char* cmd : {"inspect", "convert", "quantize", "run", "chat", "serve", "bench", "perplexity"})
    CHECK_MESSAGE(all.out.find(cmd) != std::string::npos, cmd);
  auto nope = run_kite({"help", "nope"});
  CHECK(nope.exit_code == 2);
  CHECK(nope.err.find("'nope'") != std::string::npos);
  auto version = run_kite({"--version"});
  CHECK(version.exit_code == 0);
  CHECK(version.out.rfind("kite ", 0) == 0);
  CHECK(run_kite({"frobnicate"}).exit_code == 2);
}

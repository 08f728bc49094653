// `kite chat` end to end: scripted turns piped into the real binary on real models.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/process.h"
#include "tests/testdata.h"

namespace {

using kite::test::run_kite;
using kite::test::testdata;

std::string bundled_model() {
  const std::string p = std::string(KITE_SOURCE_DIR) + "/models/llama-draft-Q8_0.gguf";
  REQUIRE_MESSAGE(std::filesystem::exists(p), "missing bundled model " << p);
  return p;
}

std::string qwen_model() {
  return testdata("models/qwen3-tiny");
}

// The prompt token counts of the stats lines ("kite chat: [prompt N tokens ...").
std::vector<long> prompt_counts(const std::string& err) {
  std::vector<long> out;
  const std::string key = "kite chat: [prompt ";
  for (size_t pos = err.find(key); pos != std::string::npos; pos = err.find(key, pos + 1))
    out.push_back(std::strtol(err.c_str() + pos + key.size(), nullptr, 10));
  return out;
}

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t pos = s.find(what); pos != std::string::npos; pos = s.find(what, pos + 1)) ++n;
  return n;
}

void write(const std::filesystem::path& p, const std::string& text) {
  std::ofstream f(p, std::ios::binary);
  f << text;
}

}  // namespace

TEST_CASE("chat: the Done-when script on the bundled model (its own Llama-3 template)") {
  auto r = run_kite({"chat", "-m", bundled_model(), "--temp", "0", "-n", "24"}, "Hello\n/reset\nWho are you?\n");
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.err.find("no chat template") == std::string::npos);
  CHECK(r.err.find("conversation cleared") != std::string::npos);
  const auto counts = prompt_counts(r.err);
  REQUIRE(counts.size() == 2);
  // After /reset the second prompt holds one turn only: "Who are you?" is one token longer
  // than "Hello" at most a few tokens, never the first turn plus its reply.
  CHECK(counts[0] > 5);
  CHECK(counts[1] > 5);
  CHECK(counts[1] < counts[0] + 8);
  CHECK(r.out.find("> ") == std::string::npos);  // no prompt marker when stdin is not a terminal
  CHECK(r.out.size() > 10);
  CHECK(r.err.find("t/s") != std::string::npos);
}

TEST_CASE("chat: a model without a template falls back to chatml, visibly") {
  auto r = run_kite({"chat", "-m", testdata("gguf/stories260K-Q8_0.gguf"), "--temp", "0", "-n", "16"}, "Hello\n");
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.err.find("no chat template; using the built-in chatml") != std::string::npos);
  CHECK(prompt_counts(r.err).size() == 1);
}

TEST_CASE("bundled model: kite convert reproduces models/llama-draft-Q8_0.gguf byte for byte") {
  const auto out = kite::test::scratch_dir("bundled") / "llama-draft-Q8_0.gguf";
  auto r = run_kite({"convert", testdata("models/llama-draft"), "--type", "q8_0", "-o", out.string()});
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(kite::test::read_file(out.string()) == kite::test::read_file(bundled_model()));
}

TEST_CASE("chat: qwen3-tiny uses its template - history grows and /reset clears it") {
  const std::string m = qwen_model();
  auto keep = run_kite({"chat", "-m", m, "--temp", "0", "-n", "16"}, "Hello\nHello\n");
  INFO(keep.err);
  REQUIRE(keep.exit_code == 0);
  CHECK(keep.err.find("no chat template") == std::string::npos);
  const auto kc = prompt_counts(keep.err);
  REQUIRE(kc.size() == 2);
  CHECK(kc[1] > kc[0] + 4);  // the first turn and its reply are in the second prompt
  CHECK(keep.err.find("cached") != std::string::npos);

  auto reset = run_kite({"chat", "-m", m, "--temp", "0", "-n", "16"}, "Hello\n/reset\nHello\n");
  INFO(reset.err);
  REQUIRE(reset.exit_code == 0);
  const auto rc = prompt_counts(reset.err);
  REQUIRE(rc.size() == 2);
  CHECK(rc[0] == kc[0]);
  CHECK(rc[1] == rc[0]);  // after /reset the prompt is the fresh one-turn prompt again
  // Greedy: the same prompt gives the same reply twice.
  const size_t half = reset.out.size() / 2;
  CHECK(reset.out.substr(0, half) == reset.out.substr(half));
}

TEST_CASE("chat: /save and /load round-trip the conversation - multi-line input") {
  const auto dir = kite::test::scratch_dir("chat-save");
  const std::string f1 = (dir / "one.json").string(), f2 = (dir / "two.json").string();
  const std::string script =
      "Hello\n\"\"\"\nfirst line\nsecond line\n\"\"\"\n\"\"\"inline\nblock\"\"\"\ncontinued \\\nhere\n/save " + f1 +
      "\n/reset\n/load " + f1 + "\n/save " + f2 + "\nNext\n";
  auto r = run_kite({"chat", "-m", qwen_model(), "--temp", "0", "-n", "8", "--system", "Be brief."}, script);
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  const std::string j1 = kite::test::read_file(f1), j2 = kite::test::read_file(f2);
  CHECK(j1 == j2);
  auto j = nlohmann::json::parse(j1);
  REQUIRE(j.is_array());
  REQUIRE(j.size() == 9);  // system + 4 x (user, assistant)
  CHECK(j[0]["role"] == "system");
  CHECK(j[0]["content"] == "Be brief.");
  CHECK(j[1]["content"] == "Hello");
  CHECK(j[2]["role"] == "assistant");
  CHECK(j[3]["content"] == "first line\nsecond line");  // bare """ lines open and close the block
  CHECK(j[5]["content"] == "inline\nblock");
  CHECK(j[7]["content"] == "continued \nhere");
  const auto counts = prompt_counts(r.err);
  REQUIRE(counts.size() == 5);
  CHECK(counts[4] > counts[3]);  // the loaded history is in the prompt of the turn after /load
}

TEST_CASE("chat: a small context drops the oldest turns with a notice") {
  auto r = run_kite({"chat", "-m", qwen_model(), "--temp", "0", "-n", "30", "-c", "128"},
                    "Tell me a story\nTell me more\nAnd more\nAgain\n");
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  const auto counts = prompt_counts(r.err);
  REQUIRE(counts.size() == 4);
  CHECK(r.err.find("context full: dropped the") != std::string::npos);
  for (long c : counts) CHECK(c + 30 <= 128);

  // A message that cannot fit even alone is refused; the chat goes on.
  std::string longmsg;
  for (int i = 0; i < 200; ++i) longmsg += "word ";
  r = run_kite({"chat", "-m", qwen_model(), "--temp", "0", "-n", "30", "-c", "128"}, longmsg + "\nHi\n");
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.err.find("the message does not fit") != std::string::npos);
  CHECK(prompt_counts(r.err).size() == 1);
}

TEST_CASE("chat: a greedy reply equals kite run on the rendered prompt") {
  const std::string m = qwen_model();
  const auto dir = kite::test::scratch_dir("chat-greedy");
  auto cfg = nlohmann::json::parse(kite::test::read_file(m + "/tokenizer_config.json"));
  write(dir / "t.jinja", cfg["chat_template"].get<std::string>());
  nlohmann::json ctx = {{"messages", {{{"role", "user"}, {"content", "Hello"}}}},
                        {"add_generation_prompt", true},
                        {"bos_token", cfg["bos_token"]},
                        {"eos_token", cfg["eos_token"]}};
  write(dir / "ctx.json", ctx.dump());
  auto rendered =
      run_kite({"template", "--file", (dir / "t.jinja").string(), "--context", (dir / "ctx.json").string()});
  REQUIRE(rendered.exit_code == 0);
  REQUIRE(rendered.out.rfind("<|begin_of_text|>", 0) == 0);  // the template writes BOS itself

  auto chat = run_kite({"chat", "-m", m, "--temp", "0", "-n", "20"}, "Hello\n");
  INFO(chat.err);
  REQUIRE(chat.exit_code == 0);
  auto run = run_kite({"run", "-m", m, "--temp", "0", "-n", "20", "--no-bos", "-p", rendered.out});
  INFO(run.err);
  REQUIRE(run.exit_code == 0);
  REQUIRE(chat.out.size() > 2);
  const std::string reply = chat.out.substr(0, chat.out.size() - 1);  // without the newline after the reply
  REQUIRE(reply.size() > 5);
  // kite run echoes the prompt (control tokens hidden), then the continuation.
  REQUIRE(run.out.size() >= reply.size() + 1);
  CHECK(run.out.substr(run.out.size() - 1 - reply.size()) == chat.out);
  CHECK(prompt_counts(chat.err).at(0) > 0);
}

TEST_CASE("chat: bad usage gives clear messages and the chat goes on") {
  const auto dir = kite::test::scratch_dir("chat-bad");
  write(dir / "bad.json", "{not json");
  write(dir / "role.json", R"([{"role": "tool", "content": "x"}])");
  const std::string script = "/load " + (dir / "missing.json").string() + "\n/load " + (dir / "bad.json").string() +
                             "\n/load " + (dir / "role.json").string() + "\n/frobnicate\n/save\n/help\nHi\n";
  auto r = run_kite({"chat", "-m", bundled_model(), "--temp", "0", "-n", "8"}, script);
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.err.find("missing.json: cannot open") != std::string::npos);
  CHECK(r.err.find("bad.json: not valid JSON") != std::string::npos);
  CHECK(r.err.find("role 'tool'") != std::string::npos);
  CHECK(r.err.find("unknown command /frobnicate; /help lists the commands") != std::string::npos);
  CHECK(r.err.find("/save needs a file name") != std::string::npos);
  CHECK(r.out.find("/reset") != std::string::npos);  // /help
  CHECK(prompt_counts(r.err).size() == 1);           // the turn after the errors still ran

  auto t = run_kite({"chat", "-m", bundled_model(), "--template", "nope"}, "Hi\n");
  CHECK(t.exit_code == 2);
  CHECK(t.err.find("--template nope: neither a built-in template") != std::string::npos);
  t = run_kite({"chat", "-m", bundled_model(), "--template", "llama3", "-n", "4"}, "Hi\n");
  CHECK(t.exit_code == 0);
  CHECK(t.err.find("no chat template") == std::string::npos);
  CHECK(prompt_counts(t.err).size() == 1);
}

namespace {

// `kite chat` as a child with a pipe on stdin, so that the test can send SIGINT mid-stream.
struct ChatChild {
  pid_t pid = -1;
  int in = -1;
  std::string out_path, err_path;

  ChatChild(const std::string& name, const std::vector<std::string>& args) {
    const auto dir = kite::test::scratch_dir(name);
    out_path = (dir / "out.txt").string();
    err_path = (dir / "err.txt").string();
    int fds[2];
    REQUIRE(::pipe(fds) == 0);
    std::fflush(stdout);
    std::fflush(stderr);
    pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::dup2(fds[0], 0);
      ::close(fds[0]);
      ::close(fds[1]);
      std::FILE* o = std::freopen(out_path.c_str(), "wb", stdout);
      std::FILE* e = std::freopen(err_path.c_str(), "wb", stderr);
      if (!o || !e) ::_exit(127);
      std::vector<char*> argv;
      argv.push_back(const_cast<char*>(KITE_EXE));
      for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execv(KITE_EXE, argv.data());
      ::_exit(127);
    }
    ::close(fds[0]);
    in = fds[1];
  }
  void send(const std::string& s) const { REQUIRE(::write(in, s.data(), s.size()) == static_cast<ssize_t>(s.size())); }
  // Waits (at most ~20 s) until stdout holds `what`.
  bool wait_stdout(const std::string& what) const {
    for (int i = 0; i < 2000; ++i) {
      std::ifstream f(out_path, std::ios::binary);
      const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
      if (text.find(what) != std::string::npos) return true;
      ::usleep(10000);
    }
    return false;
  }
  int wait() {
    if (in >= 0) ::close(in), in = -1;
    int status = 0;
    ::waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
};

}  // namespace

TEST_CASE("chat: Ctrl-C stops a streaming reply - Ctrl-C at an empty prompt exits") {
  ChatChild c("chat-sigint-reply", {"chat", "-m", qwen_model(), "--temp", "0", "-n", "6000", "-c", "8192"});
  c.send("/help\nTell me a long story\n");
  REQUIRE(c.wait_stdout("Commands:"));
  ::usleep(300000);  // the reply streams (6000 tokens take several seconds)
  ::kill(c.pid, SIGINT);
  const std::string saved = (std::filesystem::path(c.out_path).parent_path() / "saved.json").string();
  c.send("/save " + saved + "\n");  // the chat goes on after the stopped reply
  const int rc = c.wait();
  const std::string err = kite::test::read_file(c.err_path);
  INFO(err);
  CHECK(rc == 0);
  CHECK(count(err, "stopped by Ctrl-C") == 1);
  REQUIRE(prompt_counts(err).size() == 1);
  const size_t rep = err.find("reply ");
  REQUIRE(rep != std::string::npos);
  const long n_reply = std::strtol(err.c_str() + rep + 6, nullptr, 10);
  CHECK(n_reply > 0);
  CHECK(n_reply < 6000);
  auto j = nlohmann::json::parse(kite::test::read_file(saved));
  REQUIRE(j.size() == 2);  // the partial reply is kept in the history
  CHECK(j[1]["role"] == "assistant");
  CHECK(!j[1]["content"].get<std::string>().empty());

  ChatChild idle("chat-sigint-idle", {"chat", "-m", qwen_model(), "-n", "4"});
  idle.send("/help\n");
  REQUIRE(idle.wait_stdout("Commands:"));
  ::kill(idle.pid, SIGINT);  // stdin stays open: only the signal can end the chat
  int status = 0;
  pid_t done = 0;
  for (int i = 0; i < 500 && done == 0; ++i) {
    done = ::waitpid(idle.pid, &status, WNOHANG);
    if (done == 0) ::usleep(10000);
  }
  REQUIRE(done == idle.pid);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  ::close(idle.in);
}

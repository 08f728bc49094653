// Tests of ChatTemplate: real chat templates against Python jinja2's renders, the built-in
// templates, and the `kite template` subcommand.
#include <doctest/doctest.h>

#include <fstream>
#include <string>

#include "src/runtime/chat_template.h"
#include "tests/process.h"
#include "tests/testdata.h"

namespace {

using kite::ChatTemplate;
using nlohmann::ordered_json;

// The fixed clock of expected.json: strftime_now sees 2026-01-02 03:04:05 (a Friday).
std::tm fixed_time() {
  std::tm tm{};
  tm.tm_year = 2026 - 1900;
  tm.tm_mon = 0;
  tm.tm_mday = 2;
  tm.tm_hour = 3;
  tm.tm_min = 4;
  tm.tm_sec = 5;
  tm.tm_wday = 5;
  tm.tm_yday = 1;
  tm.tm_isdst = 0;
  return tm;
}

void write_file(const std::filesystem::path& p, const std::string& text) {
  std::ofstream f(p, std::ios::binary);
  f << text;
}

const char* kConversation = R"({
  "messages": [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello."},
    {"role": "user", "content": "2+2?"}
  ],
  "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>"})";

}  // namespace

TEST_CASE("chat_template: real templates render like Python jinja2 (expected.json)") {
  const ordered_json data = ordered_json::parse(kite::test::read_file(kite::test::testdata("templates/expected.json")));
  ChatTemplate::Options options;
  options.clock = fixed_time;
  int passed = 0, total = 0;
  for (const auto& [name, entry] : data.at("templates").items()) {
    auto tmpl = ChatTemplate::parse(entry.at("source").get<std::string>(), options);
    CHECK_MESSAGE(tmpl.ok(), name, ": ", (tmpl.ok() ? "" : tmpl.error().message));
    for (const auto& [scenario, expected] : entry.at("renders").items()) {
      ++total;
      if (!tmpl) continue;
      ordered_json context = data.at("scenarios").at(scenario);
      for (const auto& [k, v] : data.at("context").items()) context[k] = v;
      auto out = tmpl->render(context);
      bool ok;
      if (expected.contains("error")) {
        ok = !out.ok();
        CHECK_MESSAGE(ok, name, " / ", scenario, ": jinja2 raised ", expected.at("error"), " but kite rendered");
      } else {
        ok = out.ok() && *out == expected.at("output").get<std::string>();
        CHECK_MESSAGE(ok, name, " / ", scenario, ": ", (out.ok() ? "output differs" : out.error().message));
      }
      passed += ok;
    }
  }
  MESSAGE("chat templates: ", passed, "/", total, " template x scenario renders match jinja2");
  CHECK(total == 44 * 7);
  REQUIRE(passed == total);
}

TEST_CASE("chat_template: strftime_now uses the configured clock") {
  ChatTemplate::Options options;
  options.clock = fixed_time;
  auto t = ChatTemplate::parse("{{ strftime_now('%Y-%m-%d %H:%M:%S') }}|{{ strftime_now('%d %b %Y') }}", options);
  REQUIRE(t.ok());
  CHECK(t->render(ordered_json::object()).value() == "2026-01-02 03:04:05|02 Jan 2026");
  // Without a clock it is the real local time: a year, not the fixed one.
  auto real = ChatTemplate::parse("{{ strftime_now('%Y') }}");
  REQUIRE(real.ok());
  const std::string year = real->render(ordered_json::object()).value();
  CHECK(year.size() == 4);
  CHECK(year >= "2024");
}

TEST_CASE("chat_template: built-in templates") {
  const ordered_json ctx = ordered_json::parse(kConversation);
  const std::vector<std::string> names = ChatTemplate::builtin_names();
  CHECK(names == std::vector<std::string>{"chatml", "llama2", "llama3", "mistral", "phi3", "gemma", "qwen"});
  for (const auto& name : names) {
    CAPTURE(name);
    auto t = ChatTemplate::builtin(name);
    REQUIRE_MESSAGE(t.ok(), (t.ok() ? "" : t.error().message));
    auto out = t->render(ctx);
    REQUIRE_MESSAGE(out.ok(), (out.ok() ? "" : out.error().message));
    CHECK(out->find("2+2?") != std::string::npos);
    CHECK(out->find("Hello.") != std::string::npos);
  }
  CHECK(ChatTemplate::builtin("chatml")->render(ctx).value() ==
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello."
        "<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n");
  CHECK(ChatTemplate::builtin("llama3")->render(ctx).value() ==
        "<s><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|><|start_header_id|>user<|end_header_id|>"
        "\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|><|start_header_id|>user"
        "<|end_header_id|>\n\n2+2?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
  CHECK(ChatTemplate::builtin("llama2")->render(ctx).value() ==
        "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello. </s><s>[INST] 2+2? [/INST]");
  CHECK(ChatTemplate::builtin("mistral")->render(ctx).value() ==
        "<s>[INST] Be brief.\n\nHi [/INST] Hello.</s>[INST] 2+2? [/INST]");
  CHECK(ChatTemplate::builtin("gemma")->render(ctx).value() ==
        "<s><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n"
        "<start_of_turn>user\n2+2?<end_of_turn>\n<start_of_turn>model\n");
  CHECK(ChatTemplate::builtin("phi3")->render(ctx).value() ==
        "<|system|>\nBe brief.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\nHello.<|end|>\n<|user|>\n2+2?<|end|>\n"
        "<|assistant|>\n");

  // Role alternation is enforced where the format requires it.
  auto bad = ChatTemplate::builtin("gemma")->render(
      ordered_json::parse(R"({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]})"));
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().message.find("Conversation roles must alternate") != std::string::npos);

  // qwen renders tools and tool calls in Qwen2.5's layout.
  auto qwen = ChatTemplate::builtin("qwen")->render(ordered_json::parse(R"({
    "messages": [{"role": "user", "content": "Weather?"},
                 {"role": "assistant", "content": "", "tool_calls": [{"type": "function",
                   "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
                 {"role": "tool", "content": "21C"}],
    "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}],
    "add_generation_prompt": true})"));
  REQUIRE(qwen.ok());
  CHECK(qwen->find("<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": {}}}\n"
                   "</tools>") != std::string::npos);
  CHECK(qwen->find("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>") !=
        std::string::npos);
  CHECK(qwen->find("<|im_start|>user\n<tool_response>\n21C\n</tool_response><|im_end|>\n<|im_start|>assistant\n") !=
        std::string::npos);

  auto unknown = ChatTemplate::builtin("vicuna");
  REQUIRE_FALSE(unknown.ok());
  CHECK(unknown.error().message.find("known: chatml, llama2") != std::string::npos);
}

TEST_CASE("chat_template: dict order follows the input JSON") {
  auto t = ChatTemplate::parse("{{ d | tojson }}{% for k, v in d.items() %} {{ k }}{% endfor %}");
  REQUIRE(t.ok());
  CHECK(t->render(ordered_json::parse(R"({"d": {"z": 1, "a": 2, "m": 3}})")).value() ==
        "{\"z\": 1, \"a\": 2, \"m\": 3} z a m");
  CHECK_FALSE(t->render(ordered_json::array()).ok());
}

TEST_CASE("chat_template: kite template subcommand") {
  const auto dir = kite::test::scratch_dir("chat_template_cmd");
  write_file(dir / "t.jinja",
             "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
             "{% if add_generation_prompt %}[assistant]{% endif %}\n");
  write_file(dir / "ctx.json",
             R"({"messages": [{"role": "user", "content": "Café ☕"}], "add_generation_prompt": true})");
  write_file(dir / "bad.jinja", "{% if messages %}{{ raise_exception('no messages allowed') }}{% endif %}");
  write_file(dir / "syntax.jinja", "line 1\n{% for m in messages %}");

  auto r = kite::test::run_kite({"template", "--file", (dir / "t.jinja").string(), "--context", (dir / "ctx.json").string()});
  CHECK(r.exit_code == 0);
  CHECK(r.out == "[user] Café ☕\n[assistant]");
  CHECK(r.err.empty());

  r = kite::test::run_kite({"template", "--builtin", "chatml", "--context", (dir / "ctx.json").string()});
  CHECK(r.exit_code == 0);
  CHECK(r.out == "<|im_start|>user\nCafé ☕<|im_end|>\n<|im_start|>assistant\n");

  r = kite::test::run_kite({"template", "--file", (dir / "bad.jinja").string(), "--context", (dir / "ctx.json").string()});
  CHECK(r.exit_code == 1);
  CHECK(r.out.empty());
  CHECK(r.err.find("no messages allowed") != std::string::npos);

  r = kite::test::run_kite({"template", "--file", (dir / "syntax.jinja").string()});
  CHECK(r.exit_code == 1);
  CHECK(r.err.find("line 2") != std::string::npos);

  r = kite::test::run_kite({"template", "--context", (dir / "ctx.json").string()});
  CHECK(r.exit_code == 2);
  r = kite::test::run_kite({"template", "--builtin", "nope"});
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("unknown built-in chat template 'nope'") != std::string::npos);
  r = kite::test::run_kite({"template", "--file", (dir / "missing.jinja").string()});
  CHECK(r.exit_code == 2);
}

// kite/src/runtime/chat_template.h — chat templates: a model's Jinja template (or a built-in one)
// turned into prompt text.
//
//   KITE_ASSIGN_OR_RETURN(auto tmpl, ChatTemplate::parse(source));
//   nlohmann::ordered_json ctx = {{"messages", messages}, {"add_generation_prompt", true},
//                                 {"bos_token", "<s>"}, {"eos_token", "</s>"}};
//   KITE_ASSIGN_OR_RETURN(std::string prompt, tmpl.render(ctx));
//
// The engine (src/runtime/jinja/) renders the Jinja subset real chat templates use, byte-identical
// to Python jinja2 in the environment transformers uses (ImmutableSandboxedEnvironment with
// trim_blocks, lstrip_blocks and loop controls; tojson = json.dumps; raise_exception and
// strftime_now globals). Templates are untrusted: no file or environment access, and the limits
// in Options bound recursion, loop work and output size. A render that raises (raise_exception,
// an undefined value used, a sandbox violation, a limit) returns an Error with the message and
// the template line. A parsed ChatTemplate is immutable; render() may run from many threads.
#pragma once

#include <ctime>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "src/base/status.h"
#include "src/runtime/jinja/ast.h"
#include "src/runtime/jinja/interpreter.h"

namespace kite {

class ChatTemplate {
 public:
  struct Options {
    jinja::Limits limits;
    // The local time strftime_now() sees; unset: the real local time (tests pin it).
    std::function<std::tm()> clock;
  };

  // Parses a template; syntax errors name the line and column.
  static Result<ChatTemplate> parse(std::string_view source, Options options);
  static Result<ChatTemplate> parse(std::string_view source) { return parse(source, Options{}); }

  // A built-in template for models that carry none: chatml, llama2, llama3, mistral, phi3, gemma,
  // qwen. Unknown names list the known ones in the error.
  static Result<ChatTemplate> builtin(std::string_view name, Options options);
  static Result<ChatTemplate> builtin(std::string_view name) { return builtin(name, Options{}); }
  static std::vector<std::string> builtin_names();

  // Renders with `context` as the template's top-level names (messages, tools,
  // add_generation_prompt, bos_token, eos_token, ...). Object key order is kept: tojson and
  // dict iteration follow it, as with Python dicts.
  Result<std::string> render(const nlohmann::ordered_json& context) const;
  Result<std::string> render(const jinja::Value& context) const;

  const std::string& source() const { return *source_; }

 private:
  ChatTemplate() = default;

  std::shared_ptr<const std::string> source_;
  std::shared_ptr<const jinja::Body> body_;
  Options options_;
};

}  // namespace kite

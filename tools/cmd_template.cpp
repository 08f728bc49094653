// kite template --file T.jinja|--builtin NAME [--context CTX.json] — renders a chat template.
//
// Prints the rendered text to stdout (no newline added). A template that fails to parse or
// raises while rendering prints its error to stderr and exits 1; bad usage exits 2.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "src/runtime/chat_template.h"
#include "tools/commands.h"

namespace kite::tools {
namespace {

struct TemplateArgs {
  std::string file;
  std::string builtin;
  std::string context;
  bool list = false;
};

bool read_all(const std::string& path, std::string* out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  std::ostringstream ss;
  ss << f.rdbuf();
  *out = ss.str();
  return true;
}

int run_template(const TemplateArgs& a) {
  if (a.list) {
    for (const auto& n : ChatTemplate::builtin_names()) std::cout << n << "\n";
    return kExitOk;
  }
  if (a.file.empty() == a.builtin.empty()) {
    std::cerr << "kite template: give exactly one of --file or --builtin\n";
    return kExitUsage;
  }
  nlohmann::ordered_json context = nlohmann::ordered_json::object();
  if (!a.context.empty()) {
    std::string text;
    if (!read_all(a.context, &text)) {
      std::cerr << "kite template: cannot read context file " << a.context << "\n";
      return kExitUsage;
    }
    try {
      context = nlohmann::ordered_json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      std::cerr << "kite template: " << a.context << ": invalid JSON: " << e.what() << "\n";
      return kExitUsage;
    }
    if (!context.is_object()) {
      std::cerr << "kite template: " << a.context << ": the context must be a JSON object\n";
      return kExitUsage;
    }
  }
  Result<ChatTemplate> tmpl = Error{};
  if (!a.file.empty()) {
    std::string source;
    if (!read_all(a.file, &source)) {
      std::cerr << "kite template: cannot read template file " << a.file << "\n";
      return kExitUsage;
    }
    tmpl = ChatTemplate::parse(source);
    if (!tmpl) {
      std::cerr << a.file << ": " << tmpl.error().message << "\n";
      return kExitFailure;
    }
  } else {
    tmpl = ChatTemplate::builtin(a.builtin);
    if (!tmpl) {
      std::cerr << "kite template: " << tmpl.error().message << "\n";
      return kExitUsage;
    }
  }
  Result<std::string> out = tmpl->render(context);
  if (!out) {
    std::cerr << (a.file.empty() ? a.builtin : a.file) << ": " << out.error().message << "\n";
    return kExitFailure;
  }
  std::fwrite(out->data(), 1, out->size(), stdout);
  std::fflush(stdout);
  return kExitOk;
}

}  // namespace

void register_template(CLI::App& app, Action* run) {
  auto* cmd = app.add_subcommand("template", "Render a chat template (Jinja) with a JSON context");
  auto a = std::make_shared<TemplateArgs>();
  cmd->add_option("--file", a->file, "A Jinja chat template file");
  cmd->add_option("--builtin", a->builtin, "A built-in template: chatml, llama2, llama3, mistral, phi3, gemma, qwen");
  cmd->add_option("--context", a->context, "A JSON object: messages, tools, add_generation_prompt, bos_token, ...");
  cmd->add_flag("--list", a->list, "List the built-in templates");
  cmd->callback([run, a] { *run = [a] { return run_template(*a); }; });
}

}  // namespace kite::tools

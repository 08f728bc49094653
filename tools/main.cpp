// kite — one executable, many subcommands. See README.md for each.
#include <cstdio>
#include <string>

#include "tools/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"kite: local LLM inference (GGUF and Hugging Face safetensors)", "kite"};
  app.set_version_flag("--version", std::string("kite ") + KITE_VERSION);
  app.require_subcommand(1);
  app.fallthrough(false);

  kite::tools::Action run;
  kite::tools::register_inspect(app, &run);
  kite::tools::register_convert(app, &run);
  kite::tools::register_quantize(app, &run);
  kite::tools::register_imatrix(app, &run);
  kite::tools::register_tokenize(app, &run);
  kite::tools::register_template(app, &run);
  kite::tools::register_run(app, &run);
  kite::tools::register_chat(app, &run);
  kite::tools::register_perplexity(app, &run);
  kite::tools::register_bench(app, &run);
  kite::tools::register_serve(app, &run);
  kite::tools::register_embed(app, &run);
  kite::tools::register_devices(app, &run);

  // `kite help [CMD]`: the same text as `kite CMD --help` (or the command list).
  std::string help_for;
  auto* help = app.add_subcommand("help", "Show the help of a subcommand: kite help CMD");
  help->add_option("command", help_for, "The subcommand");
  help->callback([&] {
    run = [&] {
      if (help_for.empty()) {
        std::printf("%s", app.get_formatter()->make_help(&app, "kite", CLI::AppFormatMode::Normal).c_str());
        return kite::tools::kExitOk;
      }
      for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; }))
        if (sub->get_name() == help_for && sub != help) {
          std::printf("%s", sub->help("kite").c_str());
          return kite::tools::kExitOk;
        }
      std::fprintf(stderr, "kite help: no command '%s'; `kite help` lists them\n", help_for.c_str());
      return kite::tools::kExitUsage;
    };
  });

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);  // prints help/version to stdout, errors to stderr
    return code == 0 ? 0 : kite::tools::kExitUsage;
  }
  return run ? run() : kite::tools::kExitUsage;
}

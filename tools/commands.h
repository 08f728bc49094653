// kite/tools/commands.h — each subcommand registers itself on the CLI11 app.
//
// A subcommand's run function returns the process exit code: 0 success, 1 a failure of the
// work (bad file, bad model), 2 bad usage (CLI11 handles its own parse errors with 2 too... see
// main.cpp). Results go to stdout, logs and errors to stderr.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>

namespace kite::tools {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;

// Sets `*run` to the action of the subcommand when it is chosen.
using Action = std::function<int()>;

void register_inspect(CLI::App& app, Action* run);
void register_convert(CLI::App& app, Action* run);
void register_quantize(CLI::App& app, Action* run);
void register_imatrix(CLI::App& app, Action* run);
void register_tokenize(CLI::App& app, Action* run);
void register_template(CLI::App& app, Action* run);
void register_run(CLI::App& app, Action* run);
void register_chat(CLI::App& app, Action* run);
void register_perplexity(CLI::App& app, Action* run);
void register_bench(CLI::App& app, Action* run);
void register_serve(CLI::App& app, Action* run);
void register_embed(CLI::App& app, Action* run);
void register_devices(CLI::App& app, Action* run);

}  // namespace kite::tools

// kite convert HF_DIR -o OUT.gguf [--type TYPE] [-t N] [--allow-requantize] [-v]
// A Hugging Face folder (safetensors, sharded too) -> GGUF in llama.cpp's conventions.
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>

#include "formats/convert.h"
#include "formats/weight_source.h"
#include "tools/commands.h"
#include "tools/common.h"

namespace kite::tools {
namespace {

struct ConvertArgs {
  std::string input;
  std::string output;
  std::string type = "f16";
  int threads = 0;
  bool allow_requantize = false;
  bool verbose = false;
};

std::string known_types_text() {
  std::string s;
  for (const auto& n : quant::known_mix_names()) s += (s.empty() ? "" : " ") + n;
  return s;
}

int run_convert(const ConvertArgs& a) {
  if (quant::find_mix(a.type) == nullptr) {
    std::cerr << "kite convert: unknown type '" << a.type << "'; known types: " << known_types_text() << "\n";
    return kExitUsage;
  }
  if (!std::filesystem::exists(a.input)) {
    std::cerr << "kite convert: " << a.input << ": no such folder (expected a Hugging Face folder with config.json)\n";
    return kExitFailure;
  }
  auto src = WeightSource::open(a.input);
  if (!src) {
    std::cerr << "kite convert: " << src.error().message << "\n";
    return kExitFailure;
  }
  ConvertOptions opt;
  opt.type = a.type;
  opt.threads = a.threads;
  opt.allow_requantize = a.allow_requantize;
  opt.small_tensors_f32 = (*src)->format() == "safetensors";
  Progress progress("converting");
  opt.progress = [&](uint64_t done, uint64_t total) {
    progress.update(static_cast<int64_t>(done), static_cast<int64_t>(total));
  };
  if (a.verbose) opt.log = [](const std::string& line) { std::cerr << line << "\n"; };
  else opt.log = [](const std::string& line) { if (line.rfind("warning", 0) == 0) std::cerr << line << "\n"; };
  auto stats = convert_model(**src, a.output, opt);
  progress.finish();
  if (!stats) {
    std::cerr << "kite convert: " << stats.error().message << "\n";
    return kExitFailure;
  }
  std::printf("wrote %s: %zu tensors (%zu Q/K permuted), %.2f MiB of tensor data, type %s\n", a.output.c_str(),
              stats->n_tensors, stats->n_permuted, stats->bytes_out / 1048576.0, a.type.c_str());
  return kExitOk;
}

}  // namespace

void register_convert(CLI::App& app, Action* run) {
  auto* cmd = app.add_subcommand("convert", "Convert a Hugging Face folder (safetensors) to a GGUF file");
  auto a = std::make_shared<ConvertArgs>();
  cmd->add_option("input", a->input, "Hugging Face folder (config.json, *.safetensors, tokenizer.json)")->required();
  cmd->add_option("-o,--output", a->output, "Output GGUF file")->required();
  cmd->add_option("--type", a->type, "Tensor type or llama.cpp mix: f32 f16 bf16 q8_0 q4_0 q4_k_m ... (default f16)");
  cmd->add_option("-t,--threads", a->threads, "Threads (default: all)");
  cmd->add_flag("--allow-requantize", a->allow_requantize, "Accept an input whose tensors are already quantized");
  cmd->add_flag("-v,--verbose", a->verbose, "Log each tensor's type");
  cmd->callback([run, a] { *run = [a] { return run_convert(*a); }; });
}

}  // namespace kite::tools

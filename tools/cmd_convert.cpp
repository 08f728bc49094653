// kite convert HF_DIR -o OUT.gguf [--type TYPE] [-t N] [--allow-requantize] [-v]
//   A Hugging Face folder (safetensors, sharded too) -> GGUF in llama.cpp's conventions.
// kite quantize IN.gguf OUT.gguf TYPE [--allow-requantize] [-t N] [-v]
//   Every tensor type kite can produce, plus llama.cpp's mixes (Q4_K_M, ...), per tensor as
//   llama-quantize assigns them.
// Both are formats/convert.h's convert_model(); they differ in their arguments and in the
// tensor order quantize keeps (llama-quantize's, which the mixes' per-layer rules follow).
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

int run_convert(const char* cmd, const ConvertArgs& a, bool quantize) {
  if (quant::find_mix(a.type) == nullptr) {
    std::string known;
    for (const auto& n : quant::known_mix_names()) known += (known.empty() ? "" : " ") + n;
    std::cerr << "kite " << cmd << ": unknown type '" << a.type << "'; known types: " << known << "\n";
    return kExitUsage;
  }
  if (!std::filesystem::exists(a.input)) {
    std::cerr << "kite " << cmd << ": " << a.input
              << (quantize ? ": no such file\n" : ": no such folder (expected a Hugging Face folder with config.json)\n");
    return kExitFailure;
  }
  auto src = WeightSource::open(a.input);
  if (!src) {
    std::cerr << "kite " << cmd << ": " << src.error().message << "\n";
    return kExitFailure;
  }
  ConvertOptions opt;
  opt.type = a.type;
  opt.threads = a.threads;
  opt.allow_requantize = a.allow_requantize;
  opt.small_tensors_f32 = (*src)->format() == "safetensors";
  opt.llama_quantize_order = quantize;
  Progress progress(quantize ? "quantizing" : "converting");
  opt.progress = [&](uint64_t done, uint64_t total) {
    progress.update(static_cast<int64_t>(done), static_cast<int64_t>(total));
  };
  const bool verbose = a.verbose;
  opt.log = [verbose](const std::string& line) {
    if (verbose || line.rfind("warning", 0) == 0) std::cerr << line << "\n";
  };
  auto stats = convert_model(**src, a.output, opt);
  progress.finish();
  if (!stats) {
    std::cerr << "kite " << cmd << ": " << stats.error().message << "\n";
    return kExitFailure;
  }
  std::printf("wrote %s: %zu tensors (%zu Q/K permuted), %.2f MiB -> %.2f MiB of tensor data, type %s (file type %u)\n",
              a.output.c_str(), stats->n_tensors, stats->n_permuted, stats->bytes_in / 1048576.0,
              stats->bytes_out / 1048576.0, a.type.c_str(), stats->file_type);
  return kExitOk;
}

void add_common_flags(CLI::App* cmd, ConvertArgs* a) {
  cmd->add_option("-t,--threads", a->threads, "Threads (default: all)");
  cmd->add_flag("--allow-requantize", a->allow_requantize, "Accept an input whose tensors are already quantized");
  cmd->add_flag("-v,--verbose", a->verbose, "Log each tensor's type");
}

}  // namespace

void register_convert(CLI::App& app, Action* run) {
  auto* cmd = app.add_subcommand("convert", "Convert a Hugging Face folder (safetensors) to a GGUF file");
  auto a = std::make_shared<ConvertArgs>();
  cmd->add_option("input", a->input, "Hugging Face folder (config.json, *.safetensors, tokenizer.json)")->required();
  cmd->add_option("-o,--output", a->output, "Output GGUF file")->required();
  cmd->add_option("--type", a->type, "Tensor type or llama.cpp mix: f32 f16 bf16 q8_0 q4_0 q4_k_m ... (default f16)");
  add_common_flags(cmd, a.get());
  cmd->callback([run, a] { *run = [a] { return run_convert("convert", *a, false); }; });
}

void register_quantize(CLI::App& app, Action* run) {
  auto* cmd = app.add_subcommand("quantize", "Quantize a GGUF file (or a Hugging Face folder) to a type or llama.cpp mix");
  auto a = std::make_shared<ConvertArgs>();
  a->type.clear();
  cmd->add_option("input", a->input, "Input GGUF file (f32/f16/bf16) or Hugging Face folder")->required();
  cmd->add_option("output", a->output, "Output GGUF file")->required();
  cmd->add_option("type", a->type, "Q2_K Q3_K_S Q3_K_M Q3_K_L Q4_K_S Q4_K_M Q5_K_S Q5_K_M Q6_K Q4_0 Q4_1 Q5_0 Q5_1 "
                                   "Q8_0 IQ4_NL IQ4_XS F16 BF16 F32, or a plain type (q4_K, ...)")->required();
  add_common_flags(cmd, a.get());
  cmd->callback([run, a] { *run = [a] { return run_convert("quantize", *a, true); }; });
}

}  // namespace kite::tools

// kite convert HF_DIR -o OUT.gguf [--type TYPE] [-t N] [--allow-requantize] [-v]
//   A Hugging Face folder (safetensors, sharded too) -> GGUF in llama.cpp's conventions.
// kite quantize IN.gguf OUT.gguf TYPE [--imatrix FILE] [--pure] [--token-embedding-type T]
//   [--output-tensor-type T] [--tensor-type PATTERN=T ...] [--allow-requantize] [-t N] [-v]
//   Every tensor type kite can produce, plus llama.cpp's mixes (Q4_K_M, ...), per tensor as
//   llama-quantize assigns them; --imatrix weights the quantizers' error by an importance matrix
//   (kite imatrix, or llama-imatrix's file).
// kite quantize --sensitivity -f TEXT IN TYPE [--per-layer] [--chunks N] [-c CTX] [--imatrix F]
//   Quantizes one tensor group at a time to TYPE and prints each group's perplexity cost.
// Both are formats/convert.h's convert_model(); they differ in their arguments and in the
// tensor order quantize keeps (llama-quantize's, which the mixes' per-layer rules follow).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <tuple>

#include "formats/convert.h"
#include "formats/weight_source.h"
#include "src/runtime/imatrix.h"
#include "src/runtime/tokenizer.h"
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
  bool pure = false;
  std::string token_embedding_type;
  std::string output_tensor_type;
  std::vector<std::string> tensor_types;
  std::string imatrix;
  // --sensitivity
  bool sensitivity = false;
  std::string text;
  bool per_layer = false;
  int64_t chunks = 16;
  int64_t ctx = 256;
};

// The importance of an imatrix file, or an error message printed by the caller.
Result<std::map<std::string, std::vector<float>>> read_importance(const std::string& path) {
  KITE_ASSIGN_OR_RETURN(Imatrix m, load_imatrix(path));
  std::fprintf(stderr, "imatrix %s: %zu weights, %u chunks of %u tokens\n", path.c_str(), m.entries.size(), m.chunk_count,
               m.chunk_size);
  return m.importance();
}

int run_sensitivity(const ConvertArgs& a) {
  const quant::Mix* mix = quant::find_mix(a.type);
  if (mix == nullptr || !quant::can_quantize(mix->default_type)) {
    std::cerr << "kite quantize --sensitivity: unknown or unsupported type '" << a.type << "'\n";
    return kExitUsage;
  }
  std::ifstream f(a.text, std::ios::binary);
  if (!f) {
    std::cerr << "kite quantize --sensitivity: cannot read " << a.text << " (give the text with -f)\n";
    return a.text.empty() ? kExitUsage : kExitFailure;
  }
  std::ostringstream ss;
  ss << f.rdbuf();
  auto src = WeightSource::open(a.input);
  if (!src) {
    std::cerr << "kite quantize: " << src.error().message << "\n";
    return kExitFailure;
  }
  auto tok = Tokenizer::load((*src)->metadata());
  if (!tok) {
    std::cerr << "kite quantize: " << tok.error().message << "\n";
    return kExitFailure;
  }
  EncodeOptions eo;
  eo.add_special = false;
  std::vector<TokenId> tokens = (*tok)->encode(ss.str(), eo);
  if ((*tok)->bos() != kNoToken) tokens.insert(tokens.begin(), (*tok)->bos());
  std::map<std::string, std::vector<float>> importance;
  SensitivityOptions opt;
  opt.type = mix->default_type;
  opt.n_ctx = a.ctx;
  opt.max_chunks = a.chunks;
  opt.n_threads = a.threads;
  opt.per_layer = a.per_layer;
  if (!a.imatrix.empty()) {
    auto imp = read_importance(a.imatrix);
    if (!imp) {
      std::cerr << "kite quantize: " << imp.error().message << "\n";
      return kExitFailure;
    }
    importance = std::move(*imp);
    opt.importance = &importance;
  }
  Progress progress("sensitivity");
  auto rep = quantization_sensitivity(std::shared_ptr<const WeightSource>(std::move(*src)), tokens, (*tok)->bos(), opt,
                                      [&](int64_t done, int64_t total) { progress.update(done, total); });
  progress.finish();
  if (!rep) {
    std::cerr << "kite quantize: " << rep.error().message << "\n";
    return kExitFailure;
  }
  const std::string type_name(quant::find_traits(opt.type)->name);
  std::printf("sensitivity of %s to %s%s: perplexity over %lld chunks of %lld tokens, base %.4f\n", a.input.c_str(),
              type_name.c_str(), a.imatrix.empty() ? "" : " (with imatrix)", static_cast<long long>(rep->chunks),
              static_cast<long long>(opt.n_ctx), rep->base_ppl);
  std::printf("%-24s %7s %10s %10s %8s %12s %14s\n", "group", "tensors", "ppl", "d_ppl", "d_%", "MiB saved",
              "d_%/MiB saved");
  for (const SensitivityRow& r : rep->rows) {
    const double d = r.ppl - rep->base_ppl, pct = 100.0 * d / rep->base_ppl;
    const double saved = (static_cast<double>(r.bytes_before) - static_cast<double>(r.bytes_after)) / 1048576.0;
    std::printf("%-24s %7zu %10.4f %+10.4f %+7.3f%% %12.3f %14.4f\n", r.group.c_str(), r.n_tensors, r.ppl, d, pct, saved,
                saved > 0 ? pct / saved : 0.0);
  }
  for (const auto& name : rep->skipped)
    std::fprintf(stderr, "note: %s: rows are not whole %s blocks; left out\n", name.c_str(), type_name.c_str());
  return kExitOk;
}

int run_convert(const char* cmd, const ConvertArgs& a, bool quantize) {
  if (a.sensitivity) return run_sensitivity(a);
  if (a.output.empty() || a.type.empty()) {
    std::cerr << "kite " << cmd << ": expected IN OUT TYPE (or --sensitivity -f TEXT IN TYPE)\n";
    return kExitUsage;
  }
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
  opt.pure = a.pure;
  for (auto [flag, name, dst] :
       {std::tuple{"--token-embedding-type", &a.token_embedding_type, &opt.token_embedding_type},
        std::tuple{"--output-tensor-type", &a.output_tensor_type, &opt.output_tensor_type}}) {
    if (name->empty()) continue;
    const quant::TypeTraits* tr = quant::find_traits(*name);
    if (tr == nullptr || !quant::can_quantize(tr->type)) {
      std::cerr << "kite " << cmd << ": " << flag << ": '" << *name << "' is not a type kite can produce\n";
      return kExitUsage;
    }
    *dst = tr->type;
  }
  for (const std::string& arg : a.tensor_types) {
    auto tt = quant::parse_tensor_type(arg);
    if (!tt) {
      std::cerr << "kite " << cmd << ": --tensor-type: " << tt.error().message << "\n";
      return kExitUsage;
    }
    opt.tensor_types.push_back(*tt);
  }
  Progress progress(quantize ? "quantizing" : "converting");
  opt.progress = [&](uint64_t done, uint64_t total) {
    progress.update(static_cast<int64_t>(done), static_cast<int64_t>(total));
  };
  const bool verbose = a.verbose;
  opt.log = [verbose](const std::string& line) {
    if (verbose || line.rfind("warning", 0) == 0) std::cerr << line << "\n";
  };
  std::map<std::string, std::vector<float>> importance;
  if (!a.imatrix.empty()) {
    auto imp = read_importance(a.imatrix);
    if (!imp) {
      std::cerr << "kite " << cmd << ": " << imp.error().message << "\n";
      return kExitFailure;
    }
    importance = std::move(*imp);
    opt.importance = &importance;
  }
  auto stats = convert_model(**src, a.output, opt);
  progress.finish();
  if (!stats) {
    std::cerr << "kite " << cmd << ": " << stats.error().message << "\n";
    return kExitFailure;
  }
  std::printf("wrote %s: %zu tensors (%zu Q/K permuted), %.2f MiB -> %.2f MiB of tensor data, type %s (file type %u)\n",
              a.output.c_str(), stats->n_tensors, stats->n_permuted, stats->bytes_in / 1048576.0,
              stats->bytes_out / 1048576.0, a.type.c_str(), stats->file_type);
  if (!a.imatrix.empty())
    std::fprintf(stderr, "imatrix: %zu tensors quantized with importance, %zu without (no entry, or a type that "
                 "ignores it; -v lists them)\n", stats->n_weighted, stats->n_unweighted);
  return kExitOk;
}

void add_common_flags(CLI::App* cmd, ConvertArgs* a) {
  cmd->add_option("-t,--threads", a->threads, "Threads (default: all)")->check(at_least(0));
  cmd->add_flag("--allow-requantize", a->allow_requantize, "Accept an input whose tensors are already quantized");
  cmd->add_flag("-v,--verbose", a->verbose, "Log each tensor's type");
  cmd->add_option("--imatrix", a->imatrix, "Importance matrix (kite imatrix or llama-imatrix GGUF): weights the quantizers' error");
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
  cmd->add_option("output", a->output, "Output GGUF file (with --sensitivity: the TYPE)");
  cmd->add_option("type", a->type,
                  "Q2_K Q3_K_S Q3_K_M Q3_K_L Q4_K_S Q4_K_M Q5_K_S Q5_K_M Q6_K Q4_0 Q4_1 Q5_0 Q5_1 "
                  "Q8_0 IQ4_NL IQ4_XS Q2_K_S IQ1_S IQ1_M IQ2_XXS IQ2_XS IQ2_S IQ2_M IQ3_XXS IQ3_XS IQ3_S "
                  "IQ3_M (the IQ1..IQ3 mixes need --imatrix) F16 BF16 F32, or a plain type (q4_K, ...)");
  add_common_flags(cmd, a.get());
  cmd->add_flag("--pure", a->pure, "Every quantizable tensor in the mix's default type (no per-tensor rules)");
  cmd->add_option("--token-embedding-type", a->token_embedding_type, "Type of token_embd.weight (e.g. q8_0)");
  cmd->add_option("--output-tensor-type", a->output_tensor_type, "Type of the output projection (e.g. q8_0)");
  cmd->add_option("--tensor-type", a->tensor_types,
                  "PATTERN=TYPE: tensors whose name contains a match of the regex get TYPE (repeatable; the first "
                  "match wins)")
      ->allow_extra_args(false)  // one value an occurrence: the positionals after it stay positional
      ->take_all();
  cmd->add_flag("--sensitivity", a->sensitivity,
                "Print each tensor group's perplexity cost at TYPE (args: IN TYPE; needs -f TEXT)");
  cmd->add_option("-f,--file", a->text, "--sensitivity: the text to measure perplexity on");
  cmd->add_flag("--per-layer", a->per_layer, "--sensitivity: one row per layer and group");
  cmd->add_option("--chunks", a->chunks, "--sensitivity: chunks of text to score (default 16; 0: all)")
      ->check(at_least(0));
  cmd->add_option("-c,--ctx", a->ctx, "--sensitivity: tokens per chunk (default 256)")->check(at_least(4));
  cmd->callback([run, a] {
    if (a->sensitivity && a->type.empty()) std::swap(a->type, a->output);  // IN TYPE
    *run = [a] { return run_convert("quantize", *a, true); };
  });
}

}  // namespace kite::tools

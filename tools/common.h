// kite/tools/common.h — flags that mean the same in every subcommand, and loading a model with
// them.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "src/model/model.h"
#include "src/runtime/context.h"
#include "src/runtime/sampler.h"
#include "src/runtime/scheduler.h"
#include "src/runtime/speculative.h"
#include "src/runtime/tokenizer.h"

namespace kite::tools {

struct ModelArgs {
  std::string model;
  int threads = 0;
  int64_t ctx = 2048;
  std::string device = "cpu";
  int32_t gpu_layers = -1;  // --gpu-layers: layers on --device (-1: all); ContextOptions::gpu_layers
  bool cpu_moe = false;     // --cpu-moe: ContextOptions::cpu_moe
  int32_t tensor_parallel = 1;  // --tensor-parallel: ranks on --device; ContextOptions::tensor_parallel
  std::string kv_type = "f16";
  std::string kv_memory;  // "512M", "2G": the KV pool's size (default: every slot holds ctx positions)
  bool no_prefix_cache = false;
  std::string dump_ops;
  std::string dump_dir;
};

// -m/--model (required), -t/--threads, -c/--ctx, --device, --gpu-layers, --cpu-moe,
// --tensor-parallel, --kv-type, --kv-memory, --no-prefix-cache, --dump-ops, --dump-dir.
void add_model_flags(CLI::App* cmd, ModelArgs* a);
// --gpu-layers N|all|auto into `*layers` (-1: all); a bad value is a usage error naming it.
void add_gpu_layers_flag(CLI::App* cmd, int32_t* layers);
// --cpu-moe (ContextOptions::cpu_moe).
void add_cpu_moe_flag(CLI::App* cmd, bool* cpu_moe);
// "12" -> 12, "all" or "-1" -> -1, "auto" -> kGpuLayersAuto; anything else is an error naming
// the text.
Result<int32_t> parse_gpu_layers(const std::string& text);
// Says on stderr (as `who`) what the context placed on `device` with --gpu-layers auto, and
// whether an MoE model's experts run on the CPU.
void report_placement(const Context& c, const std::string& device, const char* who);
// --temp, --top-k, --top-p, --min-p, --typical, --repeat-penalty, --repeat-last-n,
// --frequency-penalty, --presence-penalty, --seed.
void add_sampling_flags(CLI::App* cmd, SamplerParams* p);

struct Loaded {
  std::shared_ptr<const Model> model;
  std::shared_ptr<const Tokenizer> tokenizer;
  std::unique_ptr<Context> ctx;
};

// Loads model, tokenizer and a context with `n_seqs` sequence slots; an error names what failed.
Result<Loaded> load_model(const ModelArgs& a, int32_t n_seqs = 1);
// -c as a context length for `m`: the value given, or for -c 0 (llama.cpp's convention) the
// context the model was trained on (4096 where its metadata does not say, or says 0).
int64_t context_length(const ModelArgs& a, const Model& m);

// Speculative decoding flags, shared by run, bench, serve and chat.
struct SpecArgs {
  std::string draft;     // --draft MODEL (any format)
  std::string mode;      // --spec none|draft|ngram; empty: draft with --draft, else none
  int draft_max = 8;     // --draft-max
  float p_min = 0.75f;   // --draft-p-min
  bool fixed = false;    // --draft-fixed: always draft --draft-max tokens (no adaptation)
  std::string draft_sampling = "greedy";  // --draft-sampling greedy|sampled
  int ngram_min = SpeculativeOptions{}.ngram_min;  // --ngram-min / --ngram-max: suffix lengths looked up
  int ngram_max = SpeculativeOptions{}.ngram_max;
};
// --draft, --spec, --draft-max, --draft-p-min, --draft-fixed, --draft-sampling, --ngram-min, --ngram-max.
void add_speculative_flags(CLI::App* cmd, SpecArgs* a);
// The scheduler's speculative options from the flags; an error names the flag.
Result<SpeculativeOptions> speculative_options(const SpecArgs& a);
// The draft model in a context shaped like the target's (threads, ctx, kv type, `n_seqs`
// slots); null when the mode needs none. Checks it against the target's vocabulary.
Result<std::unique_ptr<Context>> load_draft(const SpecArgs& a, const ModelArgs& target_args, const Model& target,
                                            int32_t n_seqs);
// "kite CMD: speculative (draft): drafted N, accepted M (R%), draft steps S" on stderr.
void print_speculative_stats(const char* cmd, SpecMode mode, const SchedulerStats& st);

// Numeric flag checks whose errors read "--ctx: must be >= 0, got -1" (CLI11's
// NonNegativeNumber/PositiveNumber print double's whole range instead). The help shows the bound.
CLI::Validator at_least(double lo);
CLI::Validator greater_than(double lo);
CLI::Validator between(double lo, double hi);

// 1.23 GiB / 4.56 MiB / 7.8 KiB / 12 B.
std::string human_bytes(uint64_t bytes);
// A parameter count as llama-bench writes it: 1.24 B, 16.81 M, 260.1 K, 512.
std::string human_count(uint64_t n);

// "1.5G", "512M", "64K", "1000" (bytes) -> bytes; an error names the text.
Result<int64_t> parse_size(const std::string& text);

// A one-line progress bar on stderr, drawn only when stderr is a terminal.
class Progress {
 public:
  explicit Progress(std::string label) : label_(std::move(label)), tty_(::isatty(2) != 0) {}
  void update(int64_t done, int64_t total);
  void finish();

 private:
  std::string label_;
  bool tty_;
  bool drawn_ = false;
};

}  // namespace kite::tools

#include "tools/common.h"

#include "formats/quant/types.h"

namespace kite::tools {

void add_model_flags(CLI::App* cmd, ModelArgs* a) {
  cmd->add_option("-m,--model", a->model, "A GGUF file or a Hugging Face folder")->required();
  cmd->add_option("-t,--threads", a->threads, "Threads (default: all physical cores)")->check(CLI::NonNegativeNumber);
  cmd->add_option("-c,--ctx", a->ctx, "Context length in tokens")->check(CLI::PositiveNumber);
  cmd->add_option("--device", a->device, "Where to compute: cpu");
  cmd->add_option("--kv-type", a->kv_type, "KV cache element type: f16, bf16, f32, q8_0")
      ->check(CLI::IsMember({"f16", "bf16", "f32", "q8_0"}));
  cmd->add_option("--kv-memory", a->kv_memory, "KV cache pool size, e.g. 512M or 2G (default: ctx x sequences)");
  cmd->add_flag("--no-prefix-cache", a->no_prefix_cache, "Do not reuse the KV blocks of earlier prompts");
  cmd->add_option("--dump-ops", a->dump_ops, "Debug: print each op matching FILTER ('*': all) with statistics");
  cmd->add_option("--dump-dir", a->dump_dir, "Debug: with --dump-ops, also write the tensors as raw f32 here")
      ->check(CLI::ExistingDirectory);
}

void add_sampling_flags(CLI::App* cmd, SamplerParams* p) {
  cmd->add_option("--temp", p->temperature, "Temperature (0: greedy)")->check(CLI::NonNegativeNumber);
  cmd->add_option("--top-k", p->top_k, "Keep the k most likely tokens (0: off)");
  cmd->add_option("--top-p", p->top_p, "Keep the most likely tokens up to probability p (1: off)")->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--min-p", p->min_p, "Drop tokens below min-p times the top probability (0: off)")->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--typical", p->typical_p, "Locally typical sampling with parameter p (1: off)");
  cmd->add_option("--repeat-penalty", p->repeat_penalty, "Penalize repeated tokens (1: off)");
  cmd->add_option("--repeat-last-n", p->penalty_last_n, "Tokens the penalties look back over (-1: all, 0: off)");
  cmd->add_option("--frequency-penalty", p->frequency_penalty, "Subtract this times a token's count so far (0: off)");
  cmd->add_option("--presence-penalty", p->presence_penalty, "Subtract this from tokens seen so far (0: off)");
  cmd->add_option("--seed", p->seed, "Random seed");
}

Result<Loaded> load_model(const ModelArgs& a, int32_t n_seqs) {
  Loaded l;
  KITE_ASSIGN_OR_RETURN(auto source, WeightSource::open(a.model));
  KITE_ASSIGN_OR_RETURN(l.tokenizer, Tokenizer::load(source->metadata()));
  KITE_ASSIGN_OR_RETURN(auto model, Model::from_source(std::move(source)));
  l.model = std::move(model);
  ContextOptions opts;
  opts.n_threads = a.threads;
  opts.n_ctx = a.ctx;
  opts.n_seqs = n_seqs;
  opts.device = a.device;
  opts.kv_type = quant::find_traits(a.kv_type)->type;
  opts.prefix_cache = !a.no_prefix_cache;
  if (!a.kv_memory.empty()) {
    KITE_ASSIGN_OR_RETURN(const int64_t bytes, parse_size(a.kv_memory));
    const size_t block = KvCache::block_bytes(l.model->hparams(), opts.kv_type, opts.kv_block_size);
    opts.kv_blocks = bytes / static_cast<int64_t>(block);
    if (opts.kv_blocks < 1)
      return make_error("--kv-memory ", a.kv_memory, " is smaller than one KV block (", block, " bytes)");
  }
  opts.dump_ops = a.dump_ops;
  opts.dump_dir = a.dump_dir;
  KITE_ASSIGN_OR_RETURN(l.ctx, Context::create(l.model, opts));
  return l;
}

Result<int64_t> parse_size(const std::string& text) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (...) {
    return make_error("'", text, "' is not a size (examples: 512M, 2G)");
  }
  std::string unit = text.substr(used);
  double mul = 1;
  if (unit == "K" || unit == "k" || unit == "KiB") mul = 1024.0;
  else if (unit == "M" || unit == "m" || unit == "MiB") mul = 1024.0 * 1024;
  else if (unit == "G" || unit == "g" || unit == "GiB") mul = 1024.0 * 1024 * 1024;
  else if (!unit.empty() && unit != "B") return make_error("'", text, "': unknown unit '", unit, "' (use K, M or G)");
  if (!(v > 0) || v * mul > 9e18) return make_error("'", text, "' is not a positive size");
  return static_cast<int64_t>(v * mul);
}

void Progress::update(int64_t done, int64_t total) {
  if (!tty_ || total <= 0) return;
  const int width = 30;
  const int filled = static_cast<int>(width * done / total);
  std::fprintf(stderr, "\r%s [%.*s%*s] %lld/%lld", label_.c_str(), filled, "##############################",
               width - filled, "", static_cast<long long>(done), static_cast<long long>(total));
  std::fflush(stderr);
  drawn_ = true;
}

void Progress::finish() {
  if (drawn_) std::fprintf(stderr, "\n");
  drawn_ = false;
}

}  // namespace kite::tools

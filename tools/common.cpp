#include "tools/common.h"

#include <charconv>
#include <cstdio>
#include <functional>

#include "formats/quant/types.h"

namespace kite::tools {

Result<int32_t> parse_gpu_layers(const std::string& text) {
  if (text == "all" || text == "-1") return -1;
  if (text == "auto") return kGpuLayersAuto;
  int32_t n = -1;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  if (ec != std::errc() || end != text.data() + text.size() || n < 0)
    return make_error("--gpu-layers '", text, "': expected a layer count (0, 1, 2, ...), all (-1) or auto");
  return n;
}

void report_placement(const Context& c, const std::string& device, const char* who) {
  if (c.experts_on_cpu())
    std::fprintf(stderr, "%s: the model's experts run on the CPU, the rest on %s (%s)\n", who, device.c_str(),
                 c.options().cpu_moe ? "--cpu-moe" : "it has no kernels for the experts' type");
  const std::optional<int32_t> n = c.auto_gpu_layers();
  if (!n) return;
  const int64_t n_layer = c.model().hparams().n_layer;
  if (*n < 0)
    std::fprintf(stderr, "%s: --gpu-layers auto: the whole model on %s\n", who, device.c_str());
  else if (*n == 0)
    std::fprintf(stderr, "%s: --gpu-layers auto: not even the output head fits on %s; the whole model on the CPU\n",
                 who, device.c_str());
  else
    std::fprintf(stderr,
                 "%s: --gpu-layers auto: the last %d of %lld layers and the output head on %s, the rest on the CPU\n",
                 who, *n, static_cast<long long>(n_layer), device.c_str());
}

namespace {

std::string number_text(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

CLI::Validator number_check(std::function<bool(double)> ok, const std::string& want) {
  return CLI::Validator(
      [ok = std::move(ok), want](std::string& text) -> std::string {
        double v = 0;
        if (!CLI::detail::lexical_cast(text, v)) return "'" + text + "' is not a number";
        return ok(v) ? std::string() : "must be " + want + ", got " + text;
      },
      want);
}

}  // namespace

CLI::Validator at_least(double lo) {
  return number_check([lo](double v) { return v >= lo; }, ">= " + number_text(lo));
}

CLI::Validator greater_than(double lo) {
  return number_check([lo](double v) { return v > lo; }, "> " + number_text(lo));
}

CLI::Validator between(double lo, double hi) {
  return number_check([lo, hi](double v) { return v >= lo && v <= hi; },
                      "in [" + number_text(lo) + ", " + number_text(hi) + "]");
}

std::string human_bytes(uint64_t b) {
  char buf[64];
  if (b >= (1ull << 30)) std::snprintf(buf, sizeof buf, "%.2f GiB", b / double(1ull << 30));
  else if (b >= (1ull << 20)) std::snprintf(buf, sizeof buf, "%.2f MiB", b / double(1ull << 20));
  else if (b >= (1ull << 10)) std::snprintf(buf, sizeof buf, "%.1f KiB", b / 1024.0);
  else std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(b));
  return buf;
}

std::string human_count(uint64_t n) {
  char buf[64];
  if (n >= 1000000000ull) std::snprintf(buf, sizeof buf, "%.2f B", n / 1e9);
  else if (n >= 1000000ull) std::snprintf(buf, sizeof buf, "%.2f M", n / 1e6);
  else if (n >= 1000ull) std::snprintf(buf, sizeof buf, "%.1f K", n / 1e3);
  else std::snprintf(buf, sizeof buf, "%llu", static_cast<unsigned long long>(n));
  return buf;
}

void add_gpu_layers_flag(CLI::App* cmd, int32_t* layers) {
  cmd->add_option_function<std::string>(
         "--gpu-layers,--n-gpu-layers",
         [layers](const std::string& v) {
           if (auto n = parse_gpu_layers(v)) *layers = *n;
         },
         "Layers on --device, counted from the last (llama.cpp's -ngl): the rest, and the token "
         "embedding lookup, run on the CPU. all or -1 (default): the whole model on --device; auto: as "
         "many as fit in its free memory, with room left for activations")
      ->check(CLI::Validator(
          [](std::string& v) {
            auto n = parse_gpu_layers(v);
            return n ? std::string() : n.error().message;
          },
          "N|all|auto"));
}

void add_cpu_moe_flag(CLI::App* cmd, bool* cpu_moe) {
  cmd->add_flag("--cpu-moe", *cpu_moe,
                "A mixture-of-experts model's experts on the CPU, the rest of each layer on --device "
                "(llama.cpp's --cpu-moe: for a model bigger than the GPU's memory). Without it they run on the "
                "CPU only where --device has no kernels for their type");
}

void add_model_flags(CLI::App* cmd, ModelArgs* a) {
  cmd->add_option("-m,--model", a->model, "A GGUF file or a Hugging Face folder")->required();
  cmd->add_option("-t,--threads", a->threads, "Threads (default: all physical cores)")->check(at_least(0));
  cmd->add_option("-c,--ctx", a->ctx, "Context length in tokens (0: the context the model was trained on)")
      ->check(at_least(0));
  cmd->add_option("--device", a->device, "Where to compute: cpu, cuda (an NVIDIA GPU; builds with KITE_CUDA) or vulkan (any Vulkan 1.2 GPU; builds with KITE_VULKAN); cuda:N / vulkan:N pick device N");
  add_gpu_layers_flag(cmd, &a->gpu_layers);
  add_cpu_moe_flag(cmd, &a->cpu_moe);
  cmd->add_option("--tensor-parallel,--tp", a->tensor_parallel,
                  "Split every layer over N ranks on --device (heads and FFN width; cpu: threads sharing -t)")
      ->check(at_least(1));
  cmd->add_option("--kv-type", a->kv_type, "KV cache element type: f16, bf16, f32, q8_0")
      ->check(CLI::IsMember({"f16", "bf16", "f32", "q8_0"}));
  cmd->add_option("--kv-memory", a->kv_memory, "KV cache pool size, e.g. 512M or 2G (default: ctx x sequences)");
  cmd->add_flag("--no-prefix-cache", a->no_prefix_cache, "Do not reuse the KV blocks of earlier prompts");
  cmd->add_option("--dump-ops", a->dump_ops, "Debug: print each op matching FILTER ('*': all) with statistics");
  cmd->add_option("--dump-dir", a->dump_dir, "Debug: with --dump-ops, also write the tensors as raw f32 here")
      ->check(CLI::ExistingDirectory);
}

void add_sampling_flags(CLI::App* cmd, SamplerParams* p) {
  cmd->add_option("--temp", p->temperature, "Temperature (0: greedy)")->check(at_least(0));
  cmd->add_option("--top-k", p->top_k, "Keep the k most likely tokens (0: off)");
  cmd->add_option("--top-p", p->top_p, "Keep the most likely tokens up to probability p (1: off)")->check(between(0.0, 1.0));
  cmd->add_option("--min-p", p->min_p, "Drop tokens below min-p times the top probability (0: off)")->check(between(0.0, 1.0));
  cmd->add_option("--typical", p->typical_p, "Locally typical sampling with parameter p (1: off)");
  cmd->add_option("--repeat-penalty", p->repeat_penalty, "Penalize repeated tokens (1: off)");
  cmd->add_option("--repeat-last-n", p->penalty_last_n, "Tokens the penalties look back over (-1: all, 0: off)");
  cmd->add_option("--frequency-penalty", p->frequency_penalty, "Subtract this times a token's count so far (0: off)");
  cmd->add_option("--presence-penalty", p->presence_penalty, "Subtract this from tokens seen so far (0: off)");
  cmd->add_option("--seed", p->seed, "Random seed");
}

int64_t context_length(const ModelArgs& a, const Model& m) {
  if (a.ctx > 0) return a.ctx;
  return m.hparams().n_ctx_train > 0 ? m.hparams().n_ctx_train : 4096;  // (a file may say 0)
}

Result<Loaded> load_model(const ModelArgs& a, int32_t n_seqs) {
  Loaded l;
  KITE_ASSIGN_OR_RETURN(auto source, WeightSource::open(a.model));
  KITE_ASSIGN_OR_RETURN(l.tokenizer, Tokenizer::load(source->metadata()));
  KITE_ASSIGN_OR_RETURN(auto model, Model::from_source(std::move(source)));
  l.model = std::move(model);
  if (const int64_t trained = l.model->hparams().n_ctx_train; trained > 0 && a.ctx > trained)
    std::fprintf(stderr, "kite: warning: -c %lld is longer than the %lld tokens %s was trained on; past them its output degrades\n",
                 static_cast<long long>(a.ctx), static_cast<long long>(trained), a.model.c_str());
  ContextOptions opts;
  opts.n_threads = a.threads;
  opts.n_ctx = context_length(a, *l.model);
  opts.n_seqs = n_seqs;
  opts.device = a.device;
  opts.gpu_layers = a.gpu_layers;
  opts.cpu_moe = a.cpu_moe;
  opts.tensor_parallel = a.tensor_parallel;
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
  report_placement(*l.ctx, a.device, "kite");
  return l;
}

void add_speculative_flags(CLI::App* cmd, SpecArgs* a) {
  cmd->add_option("--draft", a->draft, "Draft model for speculative decoding (GGUF or HF folder, same vocabulary)");
  cmd->add_option("--spec", a->mode, "Speculative decoding: none, draft (needs --draft) or ngram (prompt lookup)")
      ->check(CLI::IsMember({"none", "draft", "ngram"}));
  cmd->add_option("--draft-max", a->draft_max, "Proposals per sequence and step at most")->check(between(1, 64));
  cmd->add_option("--draft-p-min", a->p_min, "Stop drafting when the draft's top probability is below this")
      ->check(between(0.0, 1.0));
  cmd->add_flag("--draft-fixed", a->fixed, "Always draft --draft-max tokens (no adaptive length)");
  cmd->add_option("--draft-sampling", a->draft_sampling,
                  "How a draft model proposes when sampling: greedy (its best token, kept when the target samples it; "
                  "rows stay on the device) or sampled (drawn, verified by the rejection rule; rows come back whole)")
      ->check(CLI::IsMember({"greedy", "sampled"}));
  cmd->add_option("--ngram-min", a->ngram_min, "--spec ngram: shortest suffix (tokens) matched in earlier text")
      ->check(between(1, 16));
  cmd->add_option("--ngram-max", a->ngram_max, "--spec ngram: longest suffix (tokens) matched in earlier text")
      ->check(between(1, 16));
}

Result<SpeculativeOptions> speculative_options(const SpecArgs& a) {
  SpeculativeOptions so;
  const std::string mode = a.mode.empty() ? (a.draft.empty() ? "none" : "draft") : a.mode;
  KITE_ASSIGN_OR_RETURN(so.mode, parse_spec_mode(mode));
  if (so.mode == SpecMode::kDraft && a.draft.empty()) return make_error("--spec draft needs --draft MODEL");
  so.max_draft = a.draft_max;
  so.p_min = a.p_min;
  so.adaptive = !a.fixed;
  so.sample_drafts = a.draft_sampling == "sampled";
  so.ngram_min = a.ngram_min;
  so.ngram_max = a.ngram_max;
  if (auto st = so.validate(); !st) return make_error("speculative options: ", st.error().message);
  return so;
}

Result<std::unique_ptr<Context>> load_draft(const SpecArgs& a, const ModelArgs& target_args, const Model& target,
                                            int32_t n_seqs) {
  KITE_ASSIGN_OR_RETURN(const SpeculativeOptions so, speculative_options(a));
  if (so.mode != SpecMode::kDraft) return std::unique_ptr<Context>();
  auto source = WeightSource::open(a.draft);
  if (!source) return source.error().with_context("--draft " + a.draft);
  // Proposals are token ids: the draft must spell every id the way the target does.
  auto draft_tok = Tokenizer::load((*source)->metadata());
  if (!draft_tok) return draft_tok.error().with_context("--draft " + a.draft);
  auto target_tok = Tokenizer::load(target.source().metadata());
  if (!target_tok) return target_tok.error().with_context("--draft: the model's tokenizer");
  if ((*draft_tok)->n_vocab() != (*target_tok)->n_vocab())
    return make_error("--draft ", a.draft, ": its vocabulary has ", (*draft_tok)->n_vocab(), " tokens, the model's ",
                      (*target_tok)->n_vocab());
  for (int32_t id = 0; id < (*target_tok)->n_vocab(); ++id)
    if ((*draft_tok)->token_bytes(id) != (*target_tok)->token_bytes(id))
      return make_error("--draft ", a.draft, ": not the model's vocabulary (token ", id, " differs)");
  auto model = Model::from_source(std::move(*source));
  if (!model) return model.error().with_context("--draft " + a.draft);
  ContextOptions opts;
  opts.n_threads = target_args.threads;
  opts.n_ctx = context_length(target_args, target);
  opts.n_seqs = n_seqs;
  opts.device = target_args.device;
  opts.gpu_layers = target_args.gpu_layers;
  opts.cpu_moe = target_args.cpu_moe;
  opts.kv_type = quant::find_traits(target_args.kv_type)->type;
  opts.prefix_cache = !target_args.no_prefix_cache;
  auto ctx = Context::create(std::move(*model), opts);
  if (!ctx) return ctx.error().with_context("--draft " + a.draft);
  report_placement(**ctx, target_args.device, "kite: --draft");
  return std::move(*ctx);
}

void print_speculative_stats(const char* cmd, SpecMode mode, const SchedulerStats& st) {
  if (mode == SpecMode::kNone) return;
  std::fprintf(stderr, "%s: speculative (%s): drafted %lld, accepted %lld (%.1f%%), target steps with drafts %lld, draft steps %lld\n",
               cmd, spec_mode_name(mode), static_cast<long long>(st.drafted), static_cast<long long>(st.accepted),
               st.drafted > 0 ? 100.0 * static_cast<double>(st.accepted) / static_cast<double>(st.drafted) : 0.0,
               static_cast<long long>(st.spec_steps), static_cast<long long>(st.draft_steps));
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

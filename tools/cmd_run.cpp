// kite run -m MODEL -p PROMPT [-p PROMPT ...] [--prompts-file F] [-n N] [sampling flags]
//          [--json-schema FILE | --grammar FILE] [--stop S ...] [--parallel N]
//          [--draft MODEL | --spec ngram] [--draft-max N] [--draft-p-min P] [--draft-fixed]
//          [--draft-sampling greedy|sampled]
//
// One prompt: the continuation streams to stdout after the prompt. Several prompts (or --jsonl):
// they run concurrently through the scheduler and each completion is printed as one JSON line,
// in input order, as soon as it and every earlier one are done.
#include <chrono>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "src/runtime/grammar/grammar.h"
#include "src/runtime/scheduler.h"
#include "tools/commands.h"
#include "tools/common.h"

namespace kite::tools {
namespace {

struct RunArgs {
  ModelArgs model;
  SamplerParams sampling;
  SpecArgs spec;
  std::vector<std::string> prompts;
  std::string prompts_file;
  std::vector<std::string> stop;
  std::string json_schema_file, grammar_file;
  int n_predict = 128;
  int parallel = 0;
  int batch = 512;
  bool ignore_eos = false;
  bool no_bos = false;
  bool jsonl = false;
};

Result<std::string> slurp(const std::string& path, const char* what) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return make_error(what, " ", path, ": cannot open");
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return s;
}

// --prompts-file: one JSON string per line (blank lines skipped).
Status read_prompts_file(const std::string& path, std::vector<std::string>* out) {
  KITE_ASSIGN_OR_RETURN(const std::string text, slurp(path, "--prompts-file"));
  size_t line_no = 0, pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_string())
      return make_error("--prompts-file ", path, ":", line_no, ": expected one JSON string per line");
    out->push_back(j.get<std::string>());
  }
  return ok_status();
}

Result<std::shared_ptr<const Grammar>> load_grammar(const RunArgs& a) {
  if (!a.json_schema_file.empty()) {
    KITE_ASSIGN_OR_RETURN(const std::string s, slurp(a.json_schema_file, "--json-schema"));
    auto g = Grammar::from_json_schema(s);
    if (!g) return g.error().with_context("--json-schema " + a.json_schema_file);
    return g;
  }
  if (!a.grammar_file.empty()) {
    KITE_ASSIGN_OR_RETURN(const std::string s, slurp(a.grammar_file, "--grammar"));
    auto g = Grammar::parse(s);
    if (!g) return g.error().with_context("--grammar " + a.grammar_file);
    return g;
  }
  return std::shared_ptr<const Grammar>();
}

struct Completion {
  std::string text;
  int64_t prompt_tokens = 0, completion_tokens = 0;
  FinishReason reason = FinishReason::kNone;
  std::string error;
  bool done = false;
};

int run_run(RunArgs a) {
  if (!a.prompts_file.empty())
    if (auto st = read_prompts_file(a.prompts_file, &a.prompts); !st) {
      std::cerr << "kite run: " << st.error().message << "\n";
      return kExitUsage;
    }
  if (a.prompts.empty()) {
    std::cerr << "kite run: no prompt; give -p TEXT (repeatable) or --prompts-file FILE\n";
    return kExitUsage;
  }
  auto grammar = load_grammar(a);
  if (!grammar) {
    std::cerr << "kite run: " << grammar.error().message << "\n";
    return kExitUsage;
  }
  const bool stream = a.prompts.size() == 1 && !a.jsonl;
  const int32_t slots = a.parallel > 0 ? a.parallel : static_cast<int32_t>(std::min<size_t>(a.prompts.size(), 64));
  auto loaded = load_model(a.model, slots);
  if (!loaded) {
    std::cerr << "kite run: " << loaded.error().message << "\n";
    return kExitFailure;
  }
  Loaded& l = *loaded;
  if (auto st = Sampler::validate(a.sampling, l.tokenizer->n_vocab()); !st) {
    std::cerr << "kite run: " << st.error().message << "\n";
    return kExitUsage;
  }
  SchedulerOptions so;
  so.max_batch_tokens = a.batch;
  so.max_queued = static_cast<int32_t>(a.prompts.size());
  auto spec = speculative_options(a.spec);
  if (!spec) {
    std::cerr << "kite run: " << spec.error().message << "\n";
    return kExitUsage;
  }
  so.speculative = *spec;
  auto draft = load_draft(a.spec, a.model, *l.model, slots);
  if (!draft) {
    std::cerr << "kite run: " << draft.error().message << "\n";
    return kExitFailure;
  }
  if (auto st = Scheduler::check_speculative(so, *l.ctx, draft->get()); !st) {
    std::cerr << "kite run: " << st.error().message << "\n";
    return kExitUsage;
  }
  Scheduler sched(*l.ctx, l.tokenizer, so, draft->get());

  EncodeOptions eo;
  eo.add_special = !a.no_bos;
  eo.parse_special = true;
  std::vector<Completion> done(a.prompts.size());
  size_t next_print = 0;
  int64_t total_prompt = 0, total_generated = 0;
  const auto t0 = std::chrono::steady_clock::now();
  auto t_first = t0;
  bool first = true;
  auto print_ready = [&] {
    while (next_print < done.size() && done[next_print].done) {
      const Completion& c = done[next_print];
      nlohmann::ordered_json j = {{"index", next_print},
                          {"text", c.text},
                          {"prompt_tokens", c.prompt_tokens},
                          {"completion_tokens", c.completion_tokens},
                          {"finish_reason", finish_reason_name(c.reason)}};
      if (!c.error.empty()) j["error"] = c.error;
      std::cout << j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << "\n" << std::flush;
      ++next_print;
    }
  };
  for (size_t i = 0; i < a.prompts.size(); ++i) {
    std::vector<TokenId> prompt = l.tokenizer->encode(a.prompts[i], eo);
    Request r;
    r.prompt = prompt;
    r.params.sampling = a.sampling;
    r.params.max_tokens = a.n_predict;
    r.params.stop = a.stop;
    r.params.ignore_eos = a.ignore_eos;
    r.params.grammar = *grammar;
    r.on_event = [&, i](const StreamEvent& e) {
      if (first) t_first = std::chrono::steady_clock::now(), first = false;
      Completion& c = done[i];
      c.completion_tokens += e.token >= 0 ? 1 : 0;
      if (stream) {
        std::cout << e.text << std::flush;
      } else {
        c.text += e.text;
      }
      if (e.finished) {
        c.reason = e.reason;
        c.error = e.error;
      }
    };
    r.on_done = [&, i](const Usage& u) {
      done[i].prompt_tokens = u.prompt_tokens;
      done[i].done = true;
      total_generated += u.completion_tokens;
      if (!stream) print_ready();
    };
    if (stream) {  // the prompt is echoed as the model sees it (so "once upon" continues visibly)
      StreamDecoder dec(*l.tokenizer);
      for (TokenId id : prompt)
        if (!l.tokenizer->is_control(id)) std::cout << dec.push(id);
      std::cout << dec.flush() << std::flush;
    }
    total_prompt += static_cast<int64_t>(prompt.size());
    auto id = sched.submit(std::move(r));
    if (!id) {
      std::cerr << "kite run: prompt " << i << ": " << id.error().message << "\n";
      return id.error().code == ErrorCode::kUnspecified ? kExitFailure : kExitUsage;
    }
  }
  if (auto st = sched.run_until_idle(); !st) {
    std::cerr << "kite run: " << st.error().message << "\n";
    return kExitFailure;
  }
  if (stream) std::cout << std::endl;
  for (size_t i = 0; i < done.size(); ++i) {
    const Completion& c = done[i];
    if (c.reason == FinishReason::kError) std::cerr << "kite run: " << c.error << "\n";
    // Cut short by the context, not by -n: say so, or a short answer looks like the model's choice.
    if (c.reason == FinishReason::kLength && a.n_predict > 0 && c.completion_tokens < a.n_predict)
      std::cerr << "kite run: " << (done.size() > 1 ? "prompt " + std::to_string(i) + " " : std::string())
                << "stopped at the context limit (-c " << l.ctx->kv().n_ctx() << ": " << c.prompt_tokens << " prompt + "
                << c.completion_tokens << " generated tokens), before -n " << a.n_predict << "\n";
  }
  const auto t2 = std::chrono::steady_clock::now();
  const double pp = std::chrono::duration<double>(t_first - t0).count();
  const double tg = std::chrono::duration<double>(t2 - t_first).count();
  std::fprintf(stderr, "kite run: %zu prompt(s), prompt %lld tokens in %.3f s (%.1f t/s), generated %lld tokens in %.3f s (%.1f t/s)\n",
               a.prompts.size(), static_cast<long long>(total_prompt), pp, pp > 0 ? total_prompt / pp : 0.0,
               static_cast<long long>(total_generated), tg, tg > 0 ? total_generated / tg : 0.0);
  print_speculative_stats("kite run", so.speculative.mode, sched.stats());
  for (const Completion& c : done)
    if (c.reason == FinishReason::kError) return kExitFailure;
  return kExitOk;
}

}  // namespace

void register_run(CLI::App& app, Action* run) {
  auto* cmd = app.add_subcommand("run", "Generate continuations of prompts (concurrently, to stdout)");
  auto a = std::make_shared<RunArgs>();
  a->sampling.seed = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  add_model_flags(cmd, &a->model);
  add_sampling_flags(cmd, &a->sampling);
  add_speculative_flags(cmd, &a->spec);
  cmd->add_option("-p,--prompt", a->prompts, "A prompt (repeat for several, run concurrently)");
  cmd->add_option("--prompts-file", a->prompts_file, "Prompts, one JSON string per line")->check(CLI::ExistingFile);
  cmd->add_option("-n,--n-predict", a->n_predict, "Tokens to generate at most per prompt (0: until the context is full)")->check(at_least(0));
  cmd->add_option("--stop", a->stop, "Stop when this text is generated (repeatable; not printed)");
  auto* js = cmd->add_option("--json-schema", a->json_schema_file, "Constrain the output to this JSON Schema (a file)")
                 ->check(CLI::ExistingFile);
  cmd->add_option("--grammar", a->grammar_file, "Constrain the output to this GBNF grammar (a file)")
      ->check(CLI::ExistingFile)
      ->excludes(js);
  cmd->add_option("--parallel", a->parallel, "Sequences computed at once (default: the prompts, at most 64)")
      ->check(at_least(1));
  cmd->add_option("--batch", a->batch, "Tokens per model step (decode tokens plus prompt chunks)")->check(at_least(1));
  cmd->add_flag("--jsonl", a->jsonl, "Print one JSON line per prompt even for a single prompt");
  cmd->add_flag("--ignore-eos", a->ignore_eos, "Keep generating past end-of-generation tokens");
  cmd->add_flag("--no-bos", a->no_bos, "Do not add the model's BOS token");
  cmd->callback([run, a] { *run = [a] { return run_run(*a); }; });
}

}  // namespace kite::tools

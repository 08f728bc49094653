// kite serve -m MODEL [--host H] [--port P] [--api-key KEY] [--parallel N] [-c CTX] [--kv-memory SIZE]
//            [--template NAME|FILE] [--max-queue N] [--timeout S] [--grace S] [--cors ORIGINS]
//            [--batch N] [--prefill-chunk N] [--log-steps]
//
// An OpenAI-compatible HTTP server on the continuous-batching engine (see tools/server/). The
// socket is bound first (so /health answers 503 while the model loads and warms up), then the
// engine thread loads the model. SIGTERM/SIGINT: stop taking generation requests, let running
// ones finish for --grace seconds, cancel the rest, exit 0.
#include <signal.h>

#include <cstdio>
#include <string>
#include <thread>

#include "tools/commands.h"
#include "tools/common.h"
#include "tools/server/engine.h"
#include "tools/server/http.h"

namespace kite::tools {
namespace {

// Prompt tokens per step beside decoding sequences (--prefill-chunk): see
// SchedulerOptions::max_prefill_tokens and bench/RESULTS.md (serve at 32 streams).
constexpr int kDefaultPrefill = 64;

// --log-steps: one stderr line per model step, what the step computed and how long it took.
// How a step's rows came back (--log-steps): whole, or as their top k with some drawn on the
// device, some whole beside them and some fetched whole after.
std::string rows_of(const StepInfo& i) {
  if (i.top_k == 0) return "whole";
  std::string s = "top " + std::to_string(i.top_k);
  if (i.device_draws > 0) s += ", " + std::to_string(i.device_draws) + " drawn";
  if (i.whole_rows > 0) s += ", " + std::to_string(i.whole_rows) + " whole";
  if (i.fetched_rows > 0) s += ", " + std::to_string(i.fetched_rows) + " fetched";
  return s;
}

void log_step(const StepInfo& i) {
  std::fprintf(stderr,
               "kite serve: step %lld: %d decode rows (+%d drafted), %d prompt tokens of %d seqs, %d admitted, "
               "%d first tokens; %.1f ms%s; running %d, waiting %d (+%d prompt tokens); rows: %s\n",
               static_cast<long long>(i.step), i.decode_rows, i.drafted, i.prompt_tokens, i.prompt_seqs, i.admitted,
               i.first_tokens, i.seconds * 1e3, i.new_shape ? " (new shape)" : "", i.running, i.waiting,
               i.waiting_prompt_tokens, rows_of(i).c_str());
}

struct ServeArgs {
  ModelArgs model;
  server::ServerOptions http;
  int parallel = 4;
  int max_queue = 64;
  int batch = 512;
  int prefill = kDefaultPrefill;
  bool log_steps = false;
  double grace_s = 10;
  std::string template_name;
  std::string max_body = "8M";
  SpecArgs spec;
};

int run_serve(ServeArgs a) {
  // Signals are taken by sigtimedwait below; every thread started from here inherits the mask.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);

  if (a.http.ssl_cert.empty() != a.http.ssl_key.empty()) {
    std::fprintf(stderr, "kite serve: --ssl-cert and --ssl-key go together\n");
    return kExitUsage;
  }
  auto body = parse_size(a.max_body);
  if (!body) {
    std::fprintf(stderr, "kite serve: --max-body: %s\n", body.error().message.c_str());
    return kExitUsage;
  }
  a.http.max_body_bytes = static_cast<size_t>(*body);

  server::Metrics metrics;
  server::EngineOptions eo;
  eo.model = a.model;
  eo.parallel = a.parallel;
  eo.scheduler.max_batch_tokens = a.batch;
  eo.scheduler.max_prefill_tokens = a.prefill;
  if (a.log_steps) eo.scheduler.on_step = log_step;
  eo.scheduler.max_queued = a.max_queue;
  eo.template_name = a.template_name;
  eo.spec = a.spec;
  server::Engine engine(eo, &metrics);
  server::HttpServer http(&engine, &metrics, a.http);
  if (auto st = http.bind(); !st) {
    std::fprintf(stderr, "kite serve: %s\n", st.error().message.c_str());
    return kExitFailure;
  }
  std::fprintf(stderr, "kite serve: listening on %s://%s:%d\n", a.http.ssl_cert.empty() ? "http" : "https",
               a.http.host.c_str(), http.port());
  std::thread listener([&] { http.listen(); });
  engine.start();

  bool announced = false;
  int exit_code = kExitOk;
  for (;;) {
    timespec ts{0, 100 * 1000 * 1000};
    const int sig = sigtimedwait(&set, nullptr, &ts);
    if (sig == SIGINT || sig == SIGTERM) {
      std::fprintf(stderr, "kite serve: %s: shutting down\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
      break;
    }
    const auto state = engine.state();
    if (state == server::Engine::State::kFailed) {
      std::fprintf(stderr, "kite serve: %s\n", engine.failure().c_str());
      exit_code = kExitFailure;
      break;
    }
    if (state == server::Engine::State::kReady && !announced) {
      std::fprintf(stderr, "kite serve: model %s ready (%d slots, context %lld)\n", engine.model_id().c_str(),
                   engine.parallel(), static_cast<long long>(engine.n_ctx()));
      announced = true;
    }
  }
  http.begin_shutdown();
  const auto deadline = server::Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(a.grace_s * 1000));
  while (engine.active() > 0 && server::Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  if (engine.active() > 0) {
    std::fprintf(stderr, "kite serve: cancelling %zu request(s) still running after the grace period\n",
                 engine.active());
    engine.cancel_all();
    const auto hard = server::Clock::now() + std::chrono::seconds(5);
    while (engine.active() > 0 && server::Clock::now() < hard)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // Give streaming handlers a moment to write their last chunks before the sockets close.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  http.stop();
  listener.join();
  engine.stop();
  std::fprintf(stderr, "kite serve: stopped\n");
  return exit_code;
}

}  // namespace

void register_serve(CLI::App& app, Action* run) {
  auto* cmd = app.add_subcommand("serve", "Serve the model over an OpenAI-compatible HTTP API");
  auto a = std::make_shared<ServeArgs>();
  add_model_flags(cmd, &a->model);
  add_speculative_flags(cmd, &a->spec);
  cmd->add_option("--host", a->http.host, "Address to listen on");
  cmd->add_option("--port", a->http.port, "Port to listen on (0: any free port, printed on stderr)")
      ->check(between(0, 65535));
  cmd->add_option("--api-key", a->http.api_key, "Require 'Authorization: Bearer KEY' (except / and /health)");
  cmd->add_option("--parallel", a->parallel, "Sequences computed at once (slots)")->check(between(1, 1024));
  cmd->add_option("--max-queue", a->max_queue, "Waiting requests before answering 429")->check(between(1, 100000));
  cmd->add_option("--batch", a->batch, "Tokens per model step")->check(at_least(1));
  cmd->add_option("--prefill-chunk", a->prefill,
                  "Prompt tokens per step while other sequences decode (0: up to --batch)")
      ->check(at_least(0));
  cmd->add_flag("--log-steps", a->log_steps, "Log each model step's batch composition and time to stderr");
  cmd->add_option("--timeout", a->http.timeout_s, "Seconds a generation may take before it is cut short")
      ->check(greater_than(0));
  cmd->add_option("--grace", a->grace_s, "Seconds running requests get to finish on SIGTERM")
      ->check(at_least(0));
  cmd->add_option("--template", a->template_name,
                  "Chat template: a built-in name (chatml, llama3, ...) or a Jinja file (default: the model's)");
  cmd->add_option("--max-body", a->max_body, "Largest request body (e.g. 8M); larger ones get 413");
  cmd->add_option("--http-threads", a->http.threads, "HTTP worker threads (default: enough for slots and queue)")
      ->check(at_least(0));
  cmd->add_option("--cors", a->http.cors,
                  "Let browser pages on these origins call the API: '*' or a comma-separated list of origins");
  cmd->add_option("--ssl-cert", a->http.ssl_cert, "TLS certificate (PEM); with --ssl-key serves HTTPS")
      ->check(CLI::ExistingFile);
  cmd->add_option("--ssl-key", a->http.ssl_key, "TLS private key (PEM)")->check(CLI::ExistingFile);
  cmd->callback([run, a] { *run = [a] { return run_serve(*a); }; });
}

}  // namespace kite::tools

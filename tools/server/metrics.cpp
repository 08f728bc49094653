#include "tools/server/metrics.h"

#include <cstdio>

namespace kite::tools::server {

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double v) {
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += v;
  ++count_;
}

void Histogram::render(std::string* out, const std::string& name, const std::string& help) const {
  char buf[160];
  *out += "# HELP " + name + " " + help + "\n# TYPE " + name + " histogram\n";
  uint64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    std::snprintf(buf, sizeof buf, "%s_bucket{le=\"%g\"} %llu\n", name.c_str(), bounds_[i],
                  static_cast<unsigned long long>(cum));
    *out += buf;
  }
  std::snprintf(buf, sizeof buf, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name.c_str(),
                static_cast<unsigned long long>(count_), name.c_str(), sum_, name.c_str(),
                static_cast<unsigned long long>(count_));
  *out += buf;
}

Metrics::Metrics()
    : ttft_({0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}),
      itl_({0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1}),
      latency_({0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120}) {}

void Metrics::count_request(const std::string& route, int status) {
  std::lock_guard<std::mutex> lock(mu_);
  ++requests_[{route, status}];
}

void Metrics::add_tokens(int64_t prompt, int64_t completion, int64_t cached) {
  std::lock_guard<std::mutex> lock(mu_);
  prompt_tokens_ += prompt;
  completion_tokens_ += completion;
  cached_tokens_ += cached;
}

void Metrics::add_embeddings(int64_t inputs, int64_t tokens) {
  std::lock_guard<std::mutex> lock(mu_);
  embedding_inputs_ += inputs;
  embedding_tokens_ += tokens;
}

void Metrics::observe_ttft(double s) {
  std::lock_guard<std::mutex> lock(mu_);
  ttft_.observe(s);
}

void Metrics::observe_inter_token(double s) {
  std::lock_guard<std::mutex> lock(mu_);
  itl_.observe(s);
}

void Metrics::observe_request_latency(double s) {
  std::lock_guard<std::mutex> lock(mu_);
  latency_.observe(s);
}

void Metrics::count_cancelled() {
  std::lock_guard<std::mutex> lock(mu_);
  ++cancelled_;
}

namespace {
void gauge(std::string* out, const char* name, const char* help, const char* type, double v) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type, name, v);
  *out += buf;
}
}  // namespace

std::string Metrics::render(const EngineSnapshot& e, bool ready) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  out += "# HELP kite_requests_total HTTP requests answered, by route and status.\n"
         "# TYPE kite_requests_total counter\n";
  for (const auto& [key, n] : requests_)
    out += "kite_requests_total{route=\"" + key.first + "\",status=\"" + std::to_string(key.second) + "\"} " +
           std::to_string(n) + "\n";
  gauge(&out, "kite_prompt_tokens_total", "Prompt tokens of finished generations.", "counter",
        static_cast<double>(prompt_tokens_));
  gauge(&out, "kite_completion_tokens_total", "Generated tokens of finished generations.", "counter",
        static_cast<double>(completion_tokens_));
  gauge(&out, "kite_prompt_cached_tokens_total", "Prompt tokens served by the prefix cache.", "counter",
        static_cast<double>(cached_tokens_));
  gauge(&out, "kite_embedding_inputs_total", "Inputs embedded by /v1/embeddings.", "counter",
        static_cast<double>(embedding_inputs_));
  gauge(&out, "kite_embedding_tokens_total", "Tokens of the inputs embedded by /v1/embeddings.", "counter",
        static_cast<double>(embedding_tokens_));
  gauge(&out, "kite_requests_cancelled_total", "Generations cancelled (client gone, timeout, shutdown).", "counter",
        static_cast<double>(cancelled_));
  ttft_.render(&out, "kite_time_to_first_token_seconds", "Time from submit to the first generated token.");
  itl_.render(&out, "kite_inter_token_latency_seconds", "Time between consecutive tokens of one sequence.");
  latency_.render(&out, "kite_request_duration_seconds", "Time from submit to the last token.");
  gauge(&out, "kite_ready", "1 when the model is loaded and warmed up.", "gauge", ready ? 1 : 0);
  gauge(&out, "kite_queue_depth", "Requests waiting for a sequence slot.", "gauge", e.waiting);
  gauge(&out, "kite_running_sequences", "Sequences being computed.", "gauge", e.running);
  gauge(&out, "kite_kv_blocks_total", "KV cache blocks in the pool.", "gauge", e.kv_blocks_total);
  gauge(&out, "kite_kv_blocks_used", "KV cache blocks held by sequences.", "gauge", e.kv_blocks_used);
  gauge(&out, "kite_kv_blocks_cached", "KV cache blocks kept only by the prefix cache.", "gauge", e.kv_blocks_cached);
  gauge(&out, "kite_prefix_cache_queried_tokens_total", "Prompt tokens looked up in the prefix cache.", "counter",
        static_cast<double>(e.prefix_queried_tokens));
  gauge(&out, "kite_prefix_cache_hit_tokens_total", "Prompt tokens found in the prefix cache.", "counter",
        static_cast<double>(e.prefix_hit_tokens));
  const double rate = e.prefix_queried_tokens > 0
                          ? static_cast<double>(e.prefix_hit_tokens) / static_cast<double>(e.prefix_queried_tokens)
                          : 0.0;
  gauge(&out, "kite_prefix_cache_hit_rate", "Prefix-cache hit tokens / queried tokens.", "gauge", rate);
  gauge(&out, "kite_engine_steps_total", "Model steps run.", "counter", static_cast<double>(e.steps));
  gauge(&out, "kite_preemptions_total", "Sequences preempted for lack of KV blocks.", "counter",
        static_cast<double>(e.preemptions));
  gauge(&out, "kite_spec_drafted_tokens_total", "Tokens proposed by speculative decoding.", "counter",
        static_cast<double>(e.spec_drafted));
  gauge(&out, "kite_spec_accepted_tokens_total", "Proposed tokens the target accepted.", "counter",
        static_cast<double>(e.spec_accepted));
  return out;
}

}  // namespace kite::tools::server

// kite/tools/server/metrics.h — the server's Prometheus metrics (GET /metrics).
//
// Counters and histograms are recorded from any thread (HTTP handlers and the engine thread's
// callbacks) under one mutex; the engine's own state (queue, running, KV blocks) comes from an
// EngineSnapshot that the engine thread publishes after each step.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace kite::tools::server {

// What the engine thread publishes for other threads (a copy, taken under its lock).
struct EngineSnapshot {
  int32_t running = 0, waiting = 0;
  int32_t kv_blocks_total = 0, kv_blocks_used = 0, kv_blocks_cached = 0;
  int64_t prefix_queried_tokens = 0, prefix_hit_tokens = 0;
  int64_t steps = 0, preemptions = 0;
  int64_t spec_drafted = 0, spec_accepted = 0;  // speculative decoding
};

// A Prometheus histogram with fixed upper bounds (seconds).
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double v);
  void render(std::string* out, const std::string& name, const std::string& help) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket (not cumulative); the last is +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

class Metrics {
 public:
  Metrics();
  // One finished HTTP request: its route ("/v1/chat/completions", or "other") and status.
  void count_request(const std::string& route, int status);
  void add_tokens(int64_t prompt, int64_t completion, int64_t cached);
  // One answered /v1/embeddings request: its inputs and their tokens.
  void add_embeddings(int64_t inputs, int64_t tokens);
  void observe_ttft(double seconds);
  void observe_inter_token(double seconds);
  void observe_request_latency(double seconds);
  void count_cancelled();
  std::string render(const EngineSnapshot& engine, bool ready) const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  int64_t prompt_tokens_ = 0, completion_tokens_ = 0, cached_tokens_ = 0, cancelled_ = 0;
  int64_t embedding_inputs_ = 0, embedding_tokens_ = 0;
  Histogram ttft_, itl_, latency_;
};

}  // namespace kite::tools::server

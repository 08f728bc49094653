// HTTP-side helpers shared by the `kite serve` tests: the server's arguments on the test model,
// POSTs with a generous timeout, SSE parsing and /metrics values.
#pragma once

#include <httplib.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "doctest/doctest.h"
#include "tests/server_process.h"

namespace kite::test {

using nlohmann::json;

inline std::string model_dir() { return testdata("models/llama-target"); }

inline std::vector<std::string> serve_args(std::vector<std::string> extra = {}, const std::string& ctx = "512") {
  std::vector<std::string> a = {"-m", model_dir(), "-c", ctx, "-t", "2"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

// httplib's default read timeout (5 s) is shorter than a generation takes on a loaded CI machine.
inline httplib::Result post(httplib::Client& c, const std::string& path, const json& body) {
  c.set_read_timeout(120, 0);
  return c.Post(path.c_str(), body.dump(), "application/json");
}

// The SSE body of a streamed completion: the concatenated text per choice, the finish reasons,
// whether it ended with [DONE], and the usage chunk if any.
struct Streamed {
  std::map<int, std::string> text;
  std::map<int, std::string> finish;
  bool done = false;
  json usage;
  int chunks = 0;
};

inline Streamed parse_sse(const std::string& body, bool chat) {
  Streamed s;
  size_t pos = 0;
  while ((pos = body.find("data: ", pos)) != std::string::npos) {
    const size_t end = body.find("\n\n", pos);
    REQUIRE(end != std::string::npos);
    const std::string data = body.substr(pos + 6, end - pos - 6);
    pos = end + 2;
    if (data == "[DONE]") {
      s.done = true;
      continue;
    }
    const json j = json::parse(data);
    ++s.chunks;
    if (j.contains("usage") && !j["usage"].is_null()) s.usage = j["usage"];
    for (const auto& c : j["choices"]) {
      const int i = c["index"].get<int>();
      if (chat) {
        if (c["delta"].contains("content")) s.text[i] += c["delta"]["content"].get<std::string>();
      } else {
        s.text[i] += c["text"].get<std::string>();
      }
      if (!c["finish_reason"].is_null()) s.finish[i] = c["finish_reason"].get<std::string>();
    }
  }
  return s;
}

// A value from the Prometheus text (the first line starting with `name `).
inline double metric(httplib::Client& c, const std::string& name) {
  auto r = c.Get("/metrics");
  REQUIRE(r);
  REQUIRE(r->status == 200);
  const std::string& t = r->body;
  const size_t p = t.find("\n" + name + " ");
  REQUIRE_MESSAGE(p != std::string::npos, "metric " << name << " missing");
  return std::atof(t.c_str() + p + name.size() + 2);
}

// The metric once it reads `want`, or its value after `timeout`: the engine publishes its numbers
// after the step that retired the last sequence, which may come just after a client's last byte.
inline double metric_settled(httplib::Client& c, const std::string& name, double want,
                             std::chrono::milliseconds timeout = std::chrono::seconds(2)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  double v = metric(c, name);
  while (v != want && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    v = metric(c, name);
  }
  return v;
}

}  // namespace kite::test

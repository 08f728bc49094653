// `kite serve` around a request's life: a non-streamed client that leaves early, and /health
// while the model is still loading. A real server on loopback (tests/server_process.h).
#include <httplib.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>

#include "doctest/doctest.h"
#include "tests/server_client.h"

namespace kite::test {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

TEST_CASE("serve: a client that disconnects from a non-streamed request has its generation cancelled") {
  ServerProcess srv(serve_args({"--parallel", "2"}, "4096"));
  REQUIRE_MESSAGE(srv.ok(), srv.log());
  httplib::Client c("127.0.0.1", srv.port());
  const double used_before = metric(c, "kite_kv_blocks_used");
  const double tokens_before = metric(c, "kite_completion_tokens_total");
  const int fd = connect_loopback(srv.port());
  REQUIRE(fd >= 0);
  const std::string body =
      json{{"prompt", "Once upon a time"}, {"max_tokens", 4000}, {"ignore_eos", true}, {"temperature", 0}}.dump();
  REQUIRE(send_all(fd,
                   "POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Request-Id: gone-early\r\n"
                   "Content-Type: application/json\r\nContent-Length: " +
                       std::to_string(body.size()) + "\r\n\r\n" + body));
  // The generation runs and holds blocks (the snapshot is published after each step)...
  for (int i = 0; i < 500 && metric(c, "kite_running_sequences") != 1; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  REQUIRE(metric(c, "kite_running_sequences") == 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  CHECK(metric(c, "kite_kv_blocks_used") > used_before);
  // ...until the client closes its socket, having read nothing.
  ::close(fd);
  const auto t0 = std::chrono::steady_clock::now();
  while (seconds_since(t0) < 5 &&
         (metric(c, "kite_running_sequences") != 0 || metric(c, "kite_kv_blocks_used") != used_before))
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const double freed_after = seconds_since(t0);
  MESSAGE("non-streamed disconnect: sequence gone and blocks freed ", freed_after * 1000, " ms after close()");
  CHECK(metric(c, "kite_running_sequences") == 0);
  CHECK(metric(c, "kite_kv_blocks_used") == used_before);
  CHECK(freed_after < 2.0);  // the handler looks at the socket every 100 ms (measured: tens of ms)
  CHECK(metric(c, "kite_requests_cancelled_total") == 1);
  CHECK(metric(c, "kite_completion_tokens_total") - tokens_before < 4000);
  // The log line names the request and nginx's 499 (client closed request).
  for (int i = 0; i < 100 && srv.log().find("gone-early POST /v1/completions 499") == std::string::npos; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  CHECK(srv.log().find("gone-early POST /v1/completions 499") != std::string::npos);

  // The server keeps serving, and a client that stays gets a plain response with Content-Length.
  auto r = post(c, "/v1/completions", {{"prompt", "Once upon a time"}, {"max_tokens", 8}, {"ignore_eos", true}});
  REQUIRE(r);
  CHECK(r->status == 200);
  CHECK(r->get_header_value("Content-Length") == std::to_string(r->body.size()));
  CHECK_FALSE(r->has_header("Transfer-Encoding"));
  CHECK(json::parse(r->body)["usage"]["completion_tokens"] == 8);
  CHECK(metric(c, "kite_requests_cancelled_total") == 1);
  CHECK(srv.stop() == 0);
}

TEST_CASE("serve: a client that leaves a long /v1/embeddings request has the job dropped") {
  ServerProcess srv(serve_args({"--parallel", "2"}));
  REQUIRE_MESSAGE(srv.ok(), srv.log());
  httplib::Client c("127.0.0.1", srv.port());
  json inputs = json::array();
  for (int i = 0; i < 2048; ++i) inputs.push_back("Sentence number " + std::to_string(i) + " of a long batch.");
  const std::string body = json{{"input", inputs}}.dump();
  const int fd = connect_loopback(srv.port());
  REQUIRE(fd >= 0);
  REQUIRE(send_all(fd, "POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nX-Request-Id: embed-gone\r\n"
                       "Content-Type: application/json\r\nContent-Length: " +
                           std::to_string(body.size()) + "\r\n\r\n" + body));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ::close(fd);
  const auto t0 = std::chrono::steady_clock::now();
  while (seconds_since(t0) < 5 && srv.log().find("embed-gone POST /v1/embeddings 499") == std::string::npos)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  MESSAGE("embeddings disconnect noticed ", seconds_since(t0) * 1000, " ms after close()");
  CHECK(srv.log().find("embed-gone POST /v1/embeddings 499") != std::string::npos);
  CHECK(metric(c, "kite_requests_cancelled_total") == 1);
  CHECK(metric(c, "kite_embedding_inputs_total") == 0);
  // The engine dropped the rest of the job: a new request is answered at once, not after it.
  const auto t1 = std::chrono::steady_clock::now();
  auto r = post(c, "/v1/embeddings", {{"input", "After the batch."}});
  REQUIRE(r);
  CHECK(r->status == 200);
  CHECK(seconds_since(t1) < 2.0);  // 2048 inputs take ~13 s here
  CHECK(srv.stop() == 0);
}

TEST_CASE("serve: --log-steps prints each step and how its rows came back") {
  ServerProcess srv(serve_args({"--parallel", "2", "--log-steps"}));
  REQUIRE_MESSAGE(srv.ok(), srv.log());
  httplib::Client c("127.0.0.1", srv.port());
  auto complete = [&](json extra) {
    json body = {{"prompt", "Once upon a time"}, {"max_tokens", 4}, {"ignore_eos", true}};
    body.update(extra);
    auto r = post(c, "/v1/completions", body);
    REQUIRE(r);
    CHECK(r->status == 200);
  };
  // One request at a time: greedy (each row's best logit), the OpenAI defaults (drawn where the
  // logits are), a logit bias that raises a token (the whole row).
  complete({{"temperature", 0}});
  const std::string greedy = srv.log();
  CHECK(greedy.find("kite serve: step ") != std::string::npos);
  CHECK(greedy.find("rows: top 1\n") != std::string::npos);
  complete(json::object());
  CHECK(srv.log().find(", 1 drawn") != std::string::npos);
  complete({{"logit_bias", {{"5", 3}}}});
  CHECK(srv.log().find("rows: whole\n") != std::string::npos);
  CHECK(srv.stop() == 0);
}

TEST_CASE("serve: /health is 503 with Retry-After while the model loads, then 200") {
  // The socket is bound (and its port printed) before the model is loaded. Loading the test model
  // (weights, tokenizer, chat template) and its warm-up step take 0.1-0.7 s here; /health is
  // polled from the moment the port is known, a few milliseconds per answer, so the loading phase
  // is seen many times. (Connecting before the port is bound could self-connect on loopback.)
  ServerProcess srv(serve_args(), ServerProcess::NoWait{});
  const int port = srv.port();
  REQUIRE_MESSAGE(port > 0, srv.log());
  struct Seen {
    int status;
    std::string retry_after, body;
  };
  std::vector<Seen> seen;
  std::optional<Seen> completion_while_loading, models_while_loading;
  double ready_while_loading = -1;
  const auto t0 = std::chrono::steady_clock::now();
  while (seconds_since(t0) < 30) {
    httplib::Client c("127.0.0.1", port);
    c.set_connection_timeout(1, 0);
    auto r = c.Get("/health");
    if (!r) {  // not listening yet
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      continue;
    }
    seen.push_back({r->status, r->get_header_value("Retry-After"), r->body});
    if (r->status == 200) break;
    if (r->status == 503 && !completion_while_loading) {
      auto p = c.Post("/v1/completions", R"({"prompt":"Hi","max_tokens":2})", "application/json");
      auto m = c.Get("/v1/models");
      auto met = c.Get("/metrics");
      if (p && m && met) {
        completion_while_loading = Seen{p->status, p->get_header_value("Retry-After"), p->body};
        models_while_loading = Seen{m->status, m->get_header_value("Retry-After"), m->body};
        const size_t k = met->body.find("\nkite_ready ");
        if (k != std::string::npos) ready_while_loading = std::atof(met->body.c_str() + k + 12);
      }
    }
  }
  REQUIRE(!seen.empty());
  MESSAGE("/health answered 503 ", seen.size() - 1, " times over ", seconds_since(t0) * 1000, " ms before 200");
  const std::string log = srv.log();  // read now: a lazy INFO would read it inside a failing assertion
  INFO(log);
  CHECK(seen.front().status == 503);
  CHECK(seen.back().status == 200);
  CHECK(json::parse(seen.back().body) == json{{"status", "ok"}});
  for (size_t i = 0; i + 1 < seen.size(); ++i) {
    CAPTURE(i);
    CHECK(seen[i].status == 503);
    CHECK(seen[i].retry_after == "1");
    CHECK(json::parse(seen[i].body) == json{{"status", "loading model"}});
  }
  // Requests that need the model are refused the same way, in OpenAI's error shape.
  REQUIRE(completion_while_loading);
  CHECK(completion_while_loading->status == 503);
  CHECK(completion_while_loading->retry_after == "1");
  CHECK(json::parse(completion_while_loading->body)["error"]["code"] == "model_loading");
  REQUIRE(models_while_loading);
  CHECK(models_while_loading->status == 503);
  CHECK(json::parse(models_while_loading->body)["error"]["code"] == "model_loading");
  CHECK(ready_while_loading == 0);
  // Once ready, it serves.
  httplib::Client c("127.0.0.1", port);
  CHECK(metric(c, "kite_ready") == 1);
  auto r = post(c, "/v1/completions", {{"prompt", "Hi"}, {"max_tokens", 2}});
  REQUIRE(r);
  CHECK(r->status == 200);
  CHECK(srv.stop() == 0);
}

}  // namespace kite::test

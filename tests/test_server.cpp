// `kite serve` end to end: a real server on loopback (tests/server_process.h), real HTTP.
#include <httplib.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <regex>
#include <thread>

#include "doctest/doctest.h"
#include "tests/server_client.h"
#include "tools/server/openai.h"

namespace kite::test {

TEST_CASE("serve: chat and completions answer in OpenAI's shapes with exact usage") {
  ServerProcess srv(serve_args({"--parallel", "4"}));
  REQUIRE_MESSAGE(srv.ok(), srv.log());
  httplib::Client c("127.0.0.1", srv.port());

  auto h = c.Get("/health");
  REQUIRE(h);
  CHECK(h->status == 200);
  auto models = c.Get("/v1/models");
  REQUIRE(models);
  const json mj = json::parse(models->body);
  CHECK(mj["data"][0]["id"] == "llama-target");

  // Non-streamed chat, client's request id echoed.
  httplib::Headers hdr = {{"X-Request-Id", "test-req-42"}};
  json req = {{"model", "llama-target"},
              {"messages", {{{"role", "system"}, {"content", "Be brief."}}, {{"role", "user"}, {"content", "Hello"}}}},
              {"max_tokens", 12},
              {"temperature", 0},
              {"ignore_eos", true}};
  auto r = c.Post("/v1/chat/completions", hdr, req.dump(), "application/json");
  REQUIRE(r);
  REQUIRE_MESSAGE(r->status == 200, r->body);
  CHECK(r->get_header_value("X-Request-Id") == "test-req-42");
  // The log line is written just after the response went out.
  for (int i = 0; i < 100 && srv.log().find("test-req-42 POST /v1/chat/completions 200") == std::string::npos; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  CHECK(srv.log().find("test-req-42 POST /v1/chat/completions 200") != std::string::npos);
  json j = json::parse(r->body);
  CHECK(j["object"] == "chat.completion");
  CHECK(j["id"] == "chatcmpl-test-req-42");
  CHECK(j["system_fingerprint"].get<std::string>().rfind("fp_", 0) == 0);
  CHECK(j["choices"][0]["message"]["role"] == "assistant");
  CHECK(j["choices"][0]["finish_reason"] == "length");
  CHECK(j["usage"]["completion_tokens"] == 12);
  const int64_t prompt_tokens = j["usage"]["prompt_tokens"].get<int64_t>();
  CHECK(prompt_tokens > 5);
  CHECK(j["usage"]["total_tokens"] == prompt_tokens + 12);
  const std::string chat_text = j["choices"][0]["message"]["content"].get<std::string>();

  // The same chat streamed gives the same text, then a usage chunk and [DONE].
  req["stream"] = true;
  req["stream_options"] = {{"include_usage", true}};
  r = post(c, "/v1/chat/completions", req);
  REQUIRE(r);
  REQUIRE(r->status == 200);
  CHECK(r->get_header_value("Content-Type").find("text/event-stream") == 0);
  Streamed s = parse_sse(r->body, true);
  CHECK(s.done);
  CHECK(s.text[0] == chat_text);
  CHECK(s.finish[0] == "length");
  CHECK(s.usage["completion_tokens"] == 12);
  CHECK(s.usage["prompt_tokens"] == prompt_tokens);

  // Completions: array prompt, n = 2, echo, logprobs; usage over all choices.
  json creq = {{"prompt", {"Once upon a time", "The king said"}}, {"max_tokens", 5}, {"temperature", 0},
               {"n", 2},      {"echo", true},                       {"logprobs", 2},    {"ignore_eos", true}};
  r = post(c, "/v1/completions", creq);
  REQUIRE(r);
  REQUIRE_MESSAGE(r->status == 200, r->body);
  j = json::parse(r->body);
  REQUIRE(j["choices"].size() == 4);
  CHECK(j["usage"]["completion_tokens"] == 20);
  for (int i = 0; i < 4; ++i) {
    const auto& ch = j["choices"][i];
    CHECK(ch["index"] == i);
    const std::string prompt = i < 2 ? "Once upon a time" : "The king said";
    CHECK(ch["text"].get<std::string>().rfind(prompt, 0) == 0);
    // echo: the prompt's tokens come first (test_server_logprobs.cpp checks them), then the 5 generated
    const size_t n_lp = ch["logprobs"]["tokens"].size();
    REQUIRE(n_lp > 5);
    CHECK(ch["logprobs"]["text_offset"][n_lp - 5] == prompt.size());
    CHECK(ch["logprobs"]["top_logprobs"][0].size() == 2);
    CHECK(ch["logprobs"]["token_logprobs"][0].get<double>() <= 0.0);
  }
  CHECK(j["choices"][0]["text"] == j["choices"][1]["text"]);  // greedy: both choices agree

  // Stop strings end the text before the stop.
  json sreq = {{"prompt", "Once upon a time"}, {"max_tokens", 40}, {"temperature", 0}, {"stop", {"\n"}}};
  r = post(c, "/v1/completions", sreq);
  REQUIRE(r);
  j = json::parse(r->body);
  CHECK(j["choices"][0]["text"].get<std::string>().find('\n') == std::string::npos);

  // A seed makes sampling reproducible.
  json seeded = {{"prompt", "Once upon a time"}, {"max_tokens", 10}, {"temperature", 1.0}, {"seed", 7}};
  auto r1 = post(c, "/v1/completions", seeded), r2 = post(c, "/v1/completions", seeded);
  REQUIRE((r1 && r2));
  CHECK(json::parse(r1->body)["choices"][0]["text"] == json::parse(r2->body)["choices"][0]["text"]);

  // json_schema output parses and follows the schema.
  json schema = {{"type", "object"},
                 {"properties", {{"answer", {{"type", "string"}, {"enum", {"yes", "no"}}}}, {"n", {{"type", "integer"}}}}},
                 {"required", {"answer", "n"}}};
  json jreq = {{"messages", {{{"role", "user"}, {"content", "Answer in JSON"}}}},
               {"max_tokens", 120},
               {"temperature", 0},
               {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "a"}, {"schema", schema}}}}}};
  r = post(c, "/v1/chat/completions", jreq);
  REQUIRE(r);
  REQUIRE_MESSAGE(r->status == 200, r->body);
  j = json::parse(r->body);
  CHECK(j["choices"][0]["finish_reason"] == "stop");
  const json out = json::parse(j["choices"][0]["message"]["content"].get<std::string>());
  CHECK((out["answer"] == "yes" || out["answer"] == "no"));
  CHECK(out["n"].is_number_integer());

  // tokenize / detokenize round trip.
  r = post(c, "/tokenize", {{"content", "Hello world"}});
  REQUIRE(r);
  const json toks = json::parse(r->body)["tokens"];
  CHECK(toks.size() >= 2);
  r = post(c, "/detokenize", {{"tokens", toks}});
  REQUIRE(r);
  CHECK(json::parse(r->body)["content"] == "Hello world");

  // Metrics count what happened.
  CHECK(metric(c, "kite_completion_tokens_total") >= 12 + 12 + 20);
  CHECK(metric(c, "kite_kv_blocks_total") > 0);
  // The streamed chat repeated the first one's prompt: its first full block came from the prefix cache.
  CHECK(metric(c, "kite_prefix_cache_hit_tokens_total") >= 16);
  CHECK(metric(c, "kite_prefix_cache_hit_rate") > 0);
  auto m = c.Get("/metrics");
  REQUIRE(m);
  CHECK(m->body.find("kite_requests_total{route=\"/v1/chat/completions\",status=\"200\"}") != std::string::npos);
  CHECK(m->body.find("kite_time_to_first_token_seconds_bucket") != std::string::npos);
  CHECK(srv.stop() == 0);
}

TEST_CASE("serve: 32 parallel streaming greedy requests each equal the request alone") {
  ServerProcess srv(serve_args({"--parallel", "16", "--max-queue", "64"}));
  REQUIRE_MESSAGE(srv.ok(), srv.log());
  const int kRequests = 32;
  auto request = [](int i) {
    return json{{"prompt", "Request " + std::to_string(i) + ": once upon a time"},
                {"max_tokens", 16 + (i % 5)},
                {"temperature", 0},
                {"ignore_eos", true},
                {"stream", true}};
  };
  std::vector<std::string> alone(kRequests);
  {
    httplib::Client c("127.0.0.1", srv.port());
    for (int i = 0; i < kRequests; ++i) {
      json req = request(i);
      req["stream"] = false;
      auto r = post(c, "/v1/completions", req);
      REQUIRE(r);
      REQUIRE(r->status == 200);
      alone[i] = json::parse(r->body)["choices"][0]["text"].get<std::string>();
    }
  }
  std::vector<Streamed> got(kRequests);
  std::vector<int> status(kRequests, 0);
  std::vector<std::thread> threads;
  for (int i = 0; i < kRequests; ++i)
    threads.emplace_back([&, i] {
      httplib::Client c("127.0.0.1", srv.port());
      c.set_read_timeout(60, 0);
      auto r = post(c, "/v1/completions", request(i));
      if (!r) {
        status[i] = -static_cast<int>(r.error());
        return;
      }
      status[i] = r->status;
      got[i] = parse_sse(r->body, false);
    });
  for (auto& t : threads) t.join();
  for (int i = 0; i < kRequests; ++i)
    if (status[i] != 200) MESSAGE("request ", i, " failed (", status[i], "); server log:\n", srv.log());
  for (int i = 0; i < kRequests; ++i) {
    CAPTURE(i);
    CHECK(status[i] == 200);
    CHECK(got[i].done);
    CHECK(got[i].finish[0] == "length");
    CHECK(got[i].text[0] == alone[i]);
  }
  CHECK(srv.stop() == 0);
}

TEST_CASE("serve: --draft speculates and streamed greedy output equals the plain server's") {
  const int kRequests = 8;
  auto request = [](int i) {
    return json{{"prompt", "First Citizen:\nBefore we proceed any further, hear me speak. " + std::to_string(i)},
                {"max_tokens", 24},
                {"temperature", 0},
                {"ignore_eos", true},
                {"stream", true}};
  };
  std::vector<std::string> plain(kRequests);
  {
    ServerProcess srv(serve_args({"--parallel", "8"}));
    REQUIRE_MESSAGE(srv.ok(), srv.log());
    httplib::Client c("127.0.0.1", srv.port());
    for (int i = 0; i < kRequests; ++i) {
      json req = request(i);
      req["stream"] = false;
      auto r = post(c, "/v1/completions", req);
      REQUIRE(r);
      REQUIRE(r->status == 200);
      plain[i] = json::parse(r->body)["choices"][0]["text"].get<std::string>();
    }
    CHECK(metric(c, "kite_spec_drafted_tokens_total") == 0);
    CHECK(srv.stop() == 0);
  }
  // Fixed-length drafts (no adaptation, no confidence cut) so that the test always speculates.
  ServerProcess srv(serve_args({"--parallel", "8", "--draft", kite::test::testdata("models/llama-draft"),
                                "--draft-fixed", "--draft-max", "4", "--draft-p-min", "0"}));
  REQUIRE_MESSAGE(srv.ok(), srv.log());
  std::vector<Streamed> got(kRequests);
  std::vector<int> status(kRequests, 0);
  std::vector<std::thread> threads;
  for (int i = 0; i < kRequests; ++i)
    threads.emplace_back([&, i] {
      httplib::Client c("127.0.0.1", srv.port());
      auto r = post(c, "/v1/completions", request(i));
      status[i] = r ? r->status : -1;
      if (r) got[i] = parse_sse(r->body, false);
    });
  for (auto& t : threads) t.join();
  for (int i = 0; i < kRequests; ++i) {
    CAPTURE(i);
    REQUIRE(status[i] == 200);
    CHECK(got[i].done);
    CHECK(got[i].text[0] == plain[i]);
  }
  httplib::Client c("127.0.0.1", srv.port());
  const double drafted = metric(c, "kite_spec_drafted_tokens_total");
  const double accepted = metric(c, "kite_spec_accepted_tokens_total");
  CHECK(drafted > 0);
  CHECK(accepted > 0);
  CHECK(accepted <= drafted);
  CHECK(metric_settled(c, "kite_kv_blocks_used", 0) == 0);
  CHECK(srv.stop() == 0);

  // A draft whose vocabulary differs from the target's is refused at startup, naming both sizes.
  ServerProcess bad(serve_args({"--draft", kite::test::testdata("gguf/stories260K.gguf")}));
  CHECK_FALSE(bad.ok());
  CHECK(bad.log().find("its vocabulary has 512 tokens, the model's 4096") != std::string::npos);
}

TEST_CASE("serve: a client that disconnects mid-stream has its generation cancelled and blocks freed") {
  ServerProcess srv(serve_args({"--parallel", "2"}, "2048"));
  REQUIRE_MESSAGE(srv.ok(), srv.log());
  httplib::Client c("127.0.0.1", srv.port());
  const double used_before = metric(c, "kite_kv_blocks_used");
  const double tokens_before = metric(c, "kite_completion_tokens_total");
  const int fd = connect_loopback(srv.port());
  REQUIRE(fd >= 0);
  const std::string body = json{{"prompt", "Once upon a time"}, {"max_tokens", 2000}, {"ignore_eos", true},
                                {"temperature", 0}, {"stream", true}}.dump();
  REQUIRE(send_all(fd, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
                           std::to_string(body.size()) + "\r\n\r\n" + body));
  const std::string first = read_until(fd, "data: {", 10);
  REQUIRE(first.find("data: {") != std::string::npos);
  // Generation is running and holds blocks (the snapshot is published at the end of a step).
  for (int i = 0; i < 100 && metric(c, "kite_running_sequences") != 1; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  CHECK(metric(c, "kite_running_sequences") == 1);
  CHECK(metric(c, "kite_kv_blocks_used") > used_before);
  ::close(fd);
  // Within a short time the sequence is gone and its blocks are back.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < deadline &&
         (metric(c, "kite_running_sequences") != 0 || metric(c, "kite_kv_blocks_used") != used_before))
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK(metric(c, "kite_running_sequences") == 0);
  CHECK(metric(c, "kite_kv_blocks_used") == used_before);
  CHECK(metric(c, "kite_requests_cancelled_total") == 1);
  CHECK(metric(c, "kite_completion_tokens_total") - tokens_before < 1000);
  CHECK(srv.stop() == 0);
}

TEST_CASE("serve: hostile requests get 4xx with OpenAI errors and the server keeps serving") {
  ServerProcess srv(serve_args({"--parallel", "2"}));
  REQUIRE_MESSAGE(srv.ok(), srv.log());
  httplib::Client c("127.0.0.1", srv.port());
  // Slow headers: a connection that never finishes its request must not block others.
  const int slow = connect_loopback(srv.port());
  REQUIRE(slow >= 0);
  REQUIRE(send_all(slow, "POST /v1/completions HTTP/1.1\r\nHost: x\r\n"));

  const json msgs = {{{"role", "user"}, {"content", "hi"}}};
  json many_stops = json::array();
  for (int i = 0; i < 5000; ++i) many_stops.push_back("stop" + std::to_string(i));
  struct Case {
    std::string path, body;
    int status;
    std::string param;
  };
  std::vector<Case> cases = {
      {"/v1/chat/completions", "{not json", 400, ""},
      {"/v1/chat/completions", "[1,2,3]", 400, ""},
      {"/v1/chat/completions", std::string("{\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xfe\"}]}"), 400, ""},
      {"/v1/chat/completions", json{{"messages", "hello"}}.dump(), 400, "messages"},
      {"/v1/chat/completions", json{{"messages", json::array()}}.dump(), 400, "messages"},
      {"/v1/chat/completions", json{{"messages", {{{"role", "wizard"}, {"content", "x"}}}}}.dump(), 400, "messages[0].role"},
      {"/v1/chat/completions", json{{"messages", {{{"role", "user"}, {"content", 5}}}}}.dump(), 400, "messages[0].content"},
      {"/v1/chat/completions", json{{"messages", msgs}, {"temperature", "hot"}}.dump(), 400, "temperature"},
      {"/v1/chat/completions", json{{"messages", msgs}, {"temperature", 3}}.dump(), 400, "temperature"},
      {"/v1/chat/completions", json{{"messages", msgs}, {"top_p", -1}}.dump(), 400, "top_p"},
      {"/v1/chat/completions", json{{"messages", msgs}, {"n", -3}}.dump(), 400, "n"},
      {"/v1/chat/completions", json{{"messages", msgs}, {"n", 1000000}}.dump(), 400, "n"},
      {"/v1/chat/completions", json{{"messages", msgs}, {"max_tokens", -1}}.dump(), 400, "max_tokens"},
      {"/v1/chat/completions", json{{"messages", msgs}, {"max_tokens", 1e15}}.dump(), 400, "max_tokens"},
      {"/v1/chat/completions", json{{"messages", msgs}, {"max_completion_tokens", 1.5}}.dump(), 400,
       "max_completion_tokens"},
      {"/v1/chat/completions", json{{"messages", msgs}, {"stop", many_stops}}.dump(), 400, "stop"},
      {"/v1/chat/completions", json{{"messages", msgs}, {"stop", 12}}.dump(), 400, "stop"},
      {"/v1/chat/completions", json{{"messages", msgs}, {"logit_bias", {{"999999", 1}}}}.dump(), 400, "logit_bias"},
      {"/v1/chat/completions", json{{"messages", msgs}, {"top_logprobs", 3}}.dump(), 400, "top_logprobs"},
      {"/v1/chat/completions", json{{"messages", msgs}, {"stream", "yes"}}.dump(), 400, "stream"},
      {"/v1/chat/completions",
       json{{"messages", msgs}, {"response_format", {{"type", "json_schema"}, {"json_schema", {{"schema", {{"type", "bogus"}}}}}}}}
           .dump(),
       400, "response_format.json_schema.schema"},
      {"/v1/chat/completions", json{{"messages", msgs}, {"model", "gpt-9"}}.dump(), 404, "model"},
      {"/v1/completions", json{{"prompt", 42}}.dump(), 400, "prompt"},
      {"/v1/completions", json{{"prompt", {1, 2, 99999}}}.dump(), 400, "prompt"},
      {"/v1/completions", json{{"prompt", std::string(3000, 'a') + " long"}}.dump(), 400, "prompt"},
      {"/v1/completions", std::string(10 << 20, ' '), 413, ""},  // 10 MB; the limit is 8 MB
      {"/v1/nothing", "{}", 404, ""},
      {"/v1/embeddings", json{{"input", 5}}.dump(), 400, "input"},
      {"/v1/embeddings", json{{"input", ""}}.dump(), 400, "input"},
      {"/v1/embeddings", json{{"input", "x"}, {"dimensions", 7}}.dump(), 400, "dimensions"},
      {"/tokenize", json{{"content", 5}}.dump(), 400, "content"},
      {"/tokenize", json{{"content", "x"}, {"add_special", "yes"}}.dump(), 400, "add_special"},
      {"/v1/chat/completions", json{{"messages", msgs}, {"tools", {{{"type", "function"}}}}}.dump(), 400, "tools[0]"},
      {"/v1/chat/completions", json{{"messages", msgs}, {"tool_choice", 3}, {"tools", json::array()}}.dump(), 400,
       "tool_choice"},
      {"/v1/chat/completions", json{{"messages", msgs}, {"response_format", {{"type", "xml"}}}}.dump(), 400,
       "response_format.type"},
      {"/v1/chat/completions", json{{"messages", msgs}, {"stream_options", 1}}.dump(), 400, "stream_options"},
      {"/v1/chat/completions", json{{"messages", msgs}, {"seed", "abc"}}.dump(), 400, "seed"},
      {"/v1/chat/completions", json{{"messages", msgs}, {"top_k", -2}}.dump(), 400, "top_k"},
      {"/v1/chat/completions", json{{"messages", msgs}, {"presence_penalty", 9}}.dump(), 400, "presence_penalty"},
      {"/v1/chat/completions", json{{"messages", msgs}, {"logprobs", true}, {"top_logprobs", 50}}.dump(), 400,
       "top_logprobs"},
      {"/v1/completions", json{{"prompt", json::array()}}.dump(), 400, "prompt"},
      {"/v1/completions", json{{"prompt", "x"}, {"logprobs", 9}}.dump(), 400, "logprobs"},
      {"/v1/completions", json{{"prompt", "x"}, {"echo", 1}}.dump(), 400, "echo"},
      {"/v1/completions", json{{"prompt", "x"}, {"max_tokens", 0}}.dump(), 400, "max_tokens"},  // 0 only with echo
      {"/v1/completions", json{{"prompt", "x"}, {"suffix", "the end"}}.dump(), 400, "suffix"},
      {"/v1/completions", json{{"prompt", "x"}, {"best_of", 2}}.dump(), 400, "best_of"},
      {"/detokenize", json{{"tokens", {-1}}}.dump(), 400, "tokens"},
  };
  for (const auto& k : cases) {
    CAPTURE(k.path);
    CAPTURE(k.body.substr(0, 200));
    auto r = c.Post(k.path.c_str(), k.body, "application/json");
    REQUIRE(r);
    CHECK(r->status == k.status);
    CHECK(r->has_header("X-Request-Id"));
    const json e = json::parse(r->body, nullptr, false);
    REQUIRE(!e.is_discarded());
    REQUIRE(e.contains("error"));
    CHECK(e["error"]["message"].get<std::string>().size() > 5);
    if (!k.param.empty()) CHECK(e["error"]["param"] == k.param);
  }
  // A JSON body sent with a form's content type (curl -d without -H) is read as JSON at any size;
  // a multipart body is refused with 400.
  auto form = c.Post("/tokenize", json{{"content", std::string(20000, 'a')}}.dump(), "application/x-www-form-urlencoded");
  REQUIRE(form);
  CHECK(form->status == 200);
  CHECK(json::parse(form->body)["tokens"].size() > 0);
  auto multipart = c.Post("/v1/completions", "--x\r\n\r\n--x--\r\n", "multipart/form-data; boundary=x");
  REQUIRE(multipart);
  CHECK(multipart->status == 400);
  CHECK(json::parse(multipart->body)["error"]["message"].get<std::string>().find("multipart") != std::string::npos);
  // Still serving (the slow connection is still open).
  auto r = post(c, "/v1/chat/completions", {{"messages", msgs}, {"max_tokens", 3}});
  REQUIRE(r);
  CHECK(r->status == 200);
  ::close(slow);
  auto m = c.Get("/metrics");
  REQUIRE(m);
  CHECK(m->body.find("status=\"500\"") == std::string::npos);
  CHECK(srv.stop() == 0);
}

TEST_CASE("serve: any value in any field is answered without a server error") {
  ServerProcess srv(serve_args({"--parallel", "4"}, "128"));  // a small context bounds "max_tokens": null
  REQUIRE_MESSAGE(srv.ok(), srv.log());
  httplib::Client c("127.0.0.1", srv.port());
  const std::vector<json> values = {nullptr, true, -1, 0, 1e300, -1e300, "", std::string(300, 'x'),
                                    json::array(), json::array({1, "a"}), json::object(), json{{"a", {{"b", 1}}}}};
  const std::vector<std::string> chat_fields = {
      "model", "messages", "stream", "stream_options", "temperature", "top_p", "top_k", "min_p", "seed", "n", "stop",
      "max_tokens", "max_completion_tokens", "presence_penalty", "frequency_penalty", "logit_bias", "logprobs",
      "top_logprobs", "response_format", "tools", "tool_choice", "ignore_eos", "user"};
  const std::vector<std::string> completion_fields = {"prompt",     "echo", "logprobs", "stop",   "n",
                                                      "max_tokens", "seed", "suffix",   "best_of"};
  int answered = 0;
  for (const bool chat : {true, false})
    for (const auto& f : chat ? chat_fields : completion_fields)
      for (const auto& v : values) {
        json body = chat ? json{{"messages", {{{"role", "user"}, {"content", "hi"}}}}} : json{{"prompt", "hi"}};
        body["max_tokens"] = 2;
        body[f] = v;
        CAPTURE(f);
        CAPTURE(v.dump());
        auto r = post(c, chat ? "/v1/chat/completions" : "/v1/completions", body);
        REQUIRE(r);
        CHECK(r->status < 500);
        if (r->status >= 400) CHECK(json::parse(r->body)["error"]["message"].get<std::string>().size() > 0);
        ++answered;
      }
  CHECK(answered == static_cast<int>((chat_fields.size() + completion_fields.size()) * values.size()));
  auto h = c.Get("/health");
  REQUIRE(h);
  CHECK(h->status == 200);
  CHECK(srv.stop() == 0);
}

TEST_CASE("serve: a full queue answers 429 with Retry-After") {
  ServerProcess srv(serve_args({"--parallel", "1", "--max-queue", "1"}));
  REQUIRE_MESSAGE(srv.ok(), srv.log());
  std::atomic<int> n429{0}, n200{0};
  std::string retry_after;
  std::mutex mu;
  std::vector<std::thread> threads;
  for (int i = 0; i < 6; ++i)
    threads.emplace_back([&] {
      httplib::Client c("127.0.0.1", srv.port());
      auto r = post(c, "/v1/completions", {{"prompt", "Once"}, {"max_tokens", 150}, {"ignore_eos", true}});
      if (!r) return;
      if (r->status == 200) ++n200;
      if (r->status == 429) {
        ++n429;
        std::lock_guard<std::mutex> lock(mu);
        retry_after = r->get_header_value("Retry-After");
      }
    });
  for (auto& t : threads) t.join();
  CHECK(n200 >= 1);
  CHECK(n429 >= 1);
  CHECK(n200 + n429 == 6);
  CHECK(retry_after == "1");
  CHECK(srv.stop() == 0);
}

TEST_CASE("serve: the API key is enforced") {
  ServerProcess srv(serve_args({"--api-key", "s3cret"}));
  REQUIRE_MESSAGE(srv.ok(), srv.log());
  httplib::Client c("127.0.0.1", srv.port());
  auto r = c.Get("/v1/models");
  REQUIRE(r);
  CHECK(r->status == 401);
  CHECK(json::parse(r->body)["error"]["code"] == "invalid_api_key");
  r = c.Get("/v1/models", {{"Authorization", "Bearer wrong"}});
  REQUIRE(r);
  CHECK(r->status == 401);
  r = c.Post("/v1/completions", {{"Authorization", "Bearer s3cret"}}, R"({"prompt":"Hi","max_tokens":2})",
             "application/json");
  REQUIRE(r);
  CHECK(r->status == 200);
  r = c.Get("/health");  // open for load balancers
  REQUIRE(r);
  CHECK(r->status == 200);
  r = c.Get("/");  // the chat page itself carries no data
  REQUIRE(r);
  CHECK(r->status == 200);
  CHECK(r->body.find("/v1/chat/completions") != std::string::npos);
  CHECK(srv.stop() == 0);
}

TEST_CASE("serve: SIGTERM ends running streams cleanly and exits 0") {
  ServerProcess srv(serve_args({"--grace", "0.2"}, "2048"));
  REQUIRE_MESSAGE(srv.ok(), srv.log());
  const int fd = connect_loopback(srv.port());
  REQUIRE(fd >= 0);
  const std::string body =
      json{{"prompt", "Once"}, {"max_tokens", 2000}, {"ignore_eos", true}, {"stream", true}}.dump();
  REQUIRE(send_all(fd, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
                           std::to_string(body.size()) + "\r\n\r\n" + body));
  REQUIRE(read_until(fd, "data: {", 10).find("data: {") != std::string::npos);
  ::kill(srv.pid(), SIGTERM);
  const std::string rest = read_until(fd, "data: [DONE]", 15);
  ::close(fd);
  CHECK(rest.find("\"finish_reason\":\"length\"") != std::string::npos);
  CHECK(rest.find("data: [DONE]") != std::string::npos);
  CHECK(srv.stop(SIGTERM, 15) == 0);
  CHECK(srv.log().find("SIGTERM: shutting down") != std::string::npos);
}

TEST_CASE("serve: the per-request timeout cuts a generation short") {
  ServerProcess srv(serve_args({"--timeout", "0.3"}, "4096"));
  REQUIRE_MESSAGE(srv.ok(), srv.log());
  httplib::Client c("127.0.0.1", srv.port());
  const auto t0 = std::chrono::steady_clock::now();
  auto r = post(c, "/v1/completions", {{"prompt", "Once"}, {"max_tokens", 4000}, {"ignore_eos", true}});
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  REQUIRE(r);
  REQUIRE(r->status == 200);
  const json j = json::parse(r->body);
  CHECK(j["choices"][0]["finish_reason"] == "length");
  CHECK(j["usage"]["completion_tokens"].get<int>() < 4000);
  CHECK(s < 5.0);
  CHECK(srv.stop() == 0);
}

TEST_CASE("serve: --ssl-cert/--ssl-key serve HTTPS") {
  const std::string dir = (std::filesystem::path(KITE_BINARY_DIR) / "test-scratch" / "serve").string();
  std::filesystem::create_directories(dir);
  const std::string cert = dir + "/cert.pem", key = dir + "/key.pem";
  const std::string cmd = "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=127.0.0.1 -keyout " + key +
                          " -out " + cert + " >/dev/null 2>&1";
  REQUIRE_MESSAGE(std::system(cmd.c_str()) == 0, "the openssl command (Debian package openssl) is needed");
  ServerProcess srv(serve_args({"--ssl-cert", cert, "--ssl-key", key}));
  REQUIRE_MESSAGE(srv.ok(), srv.log());
  httplib::SSLClient c("127.0.0.1", srv.port());
  c.enable_server_certificate_verification(false);
  auto r = c.Post("/v1/completions", R"({"prompt":"Once","max_tokens":3})", "application/json");
  REQUIRE(r);
  CHECK(r->status == 200);
  CHECK(json::parse(r->body)["usage"]["completion_tokens"] == 3);
  httplib::Client plain("127.0.0.1", srv.port());
  CHECK(!plain.Get("/health"));  // plain HTTP is not spoken
  CHECK(srv.stop() == 0);
}

TEST_CASE("serve: tool calls are parsed from Hermes/Qwen and llama-3 style output") {
  using kite::tools::server::parse_tool_calls;
  auto p = parse_tool_calls("Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>",
                            {"get_weather"});
  REQUIRE(p.calls.size() == 1);
  CHECK(p.calls[0].name == "get_weather");
  CHECK(json::parse(p.calls[0].arguments) == json{{"city", "Oslo"}});
  CHECK(p.content == "Let me check.");
  p = parse_tool_calls("<tool_call>{\"name\":\"a\",\"arguments\":{}}</tool_call><tool_call>{\"name\":\"b\",\"arguments\":{\"x\":1}}</tool_call>", {"a", "b"});
  REQUIRE(p.calls.size() == 2);
  CHECK(p.calls[1].name == "b");
  CHECK(p.content.empty());
  p = parse_tool_calls(" {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}", {"get_weather"});
  REQUIRE(p.calls.size() == 1);
  CHECK(json::parse(p.calls[0].arguments)["city"] == "Rome");
  // Not an offered tool, or not a call: plain content.
  p = parse_tool_calls("{\"name\": \"other\", \"parameters\": {}}", {"get_weather"});
  CHECK(p.calls.empty());
  p = parse_tool_calls("<tool_call>not json</tool_call>", {"a"});
  CHECK(p.calls.empty());
  CHECK(p.content == "<tool_call>not json</tool_call>");
}

}  // namespace kite::test

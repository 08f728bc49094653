// `kite serve --cors`: browser pages on an allowed origin may call the API (a real server).
#include <httplib.h>

#include "doctest/doctest.h"
#include "tests/server_client.h"

namespace kite::test {

TEST_CASE("serve: --cors answers preflights with 204 and allows the listed origins only") {
  ServerProcess srv(serve_args({"--cors", "https://app.example, https://b.example/", "--api-key", "k"}));
  REQUIRE_MESSAGE(srv.ok(), srv.log());
  httplib::Client c("127.0.0.1", srv.port());
  c.set_read_timeout(120, 0);
  const httplib::Headers origin = {{"Origin", "https://app.example"}};

  // Preflight: no credentials, yet 204 with what the call may send.
  auto r = c.Options("/v1/chat/completions", {{"Origin", "https://app.example"},
                                              {"Access-Control-Request-Method", "POST"},
                                              {"Access-Control-Request-Headers", "authorization, content-type"}});
  REQUIRE(r);
  CHECK(r->status == 204);
  CHECK(r->get_header_value("Access-Control-Allow-Origin") == "https://app.example");
  CHECK(r->get_header_value("Access-Control-Allow-Methods").find("POST") != std::string::npos);
  CHECK(r->get_header_value("Access-Control-Allow-Headers") == "authorization, content-type");
  CHECK(r->get_header_value("Vary") == "Origin");

  // The call itself: the key still counts, and the answer (error or not) carries the header.
  httplib::Headers h = origin;
  r = c.Get("/v1/models", h);
  REQUIRE(r);
  CHECK(r->status == 401);
  CHECK(r->get_header_value("Access-Control-Allow-Origin") == "https://app.example");
  h.emplace("Authorization", "Bearer k");
  r = c.Post("/v1/completions", h, R"({"prompt":"Hi","max_tokens":2})", "application/json");
  REQUIRE(r);
  CHECK(r->status == 200);
  CHECK(r->get_header_value("Access-Control-Allow-Origin") == "https://app.example");
  CHECK(r->get_header_value("Access-Control-Expose-Headers") == "X-Request-Id");
  // Streamed answers too.
  r = c.Post("/v1/completions", h, R"({"prompt":"Hi","max_tokens":2,"stream":true})", "application/json");
  REQUIRE(r);
  CHECK(r->status == 200);
  CHECK(r->get_header_value("Access-Control-Allow-Origin") == "https://app.example");

  // The second listed origin (its trailing slash names the same origin); a longer one is another.
  r = c.Get("/health", {{"Origin", "https://b.example"}});
  REQUIRE(r);
  CHECK(r->get_header_value("Access-Control-Allow-Origin") == "https://b.example");
  r = c.Get("/health", {{"Origin", "https://app.example.evil"}});
  REQUIRE(r);
  CHECK(!r->has_header("Access-Control-Allow-Origin"));

  // Another origin gets no CORS header, so its browser refuses the answer; its preflight is not
  // answered either (the key applies).
  r = c.Get("/health", {{"Origin", "https://other.example"}});
  REQUIRE(r);
  CHECK(r->status == 200);
  CHECK(!r->has_header("Access-Control-Allow-Origin"));
  r = c.Options("/v1/models", {{"Origin", "https://other.example"}, {"Access-Control-Request-Method", "GET"}});
  REQUIRE(r);
  CHECK(r->status != 204);
  CHECK(!r->has_header("Access-Control-Allow-Origin"));
  CHECK(srv.stop() == 0);
}

}  // namespace kite::test

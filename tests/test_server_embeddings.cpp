// `kite serve`'s /v1/embeddings end to end: a real server on loopback, checked against
// transformers' reference vectors, with bad input and with generations running alongside.
#include <httplib.h>

#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <thread>

#include "doctest/doctest.h"
#include "tests/server_client.h"

namespace kite::test {

namespace {

// Decodes base64 (standard alphabet, '=' padding) into little-endian float32 values.
std::vector<float> decode_base64_floats(const std::string& b64) {
  auto val = [](char ch) -> int {
    if (ch >= 'A' && ch <= 'Z') return ch - 'A';
    if (ch >= 'a' && ch <= 'z') return ch - 'a' + 26;
    if (ch >= '0' && ch <= '9') return ch - '0' + 52;
    return ch == '+' ? 62 : ch == '/' ? 63 : -1;
  };
  std::vector<unsigned char> bytes;
  REQUIRE(b64.size() % 4 == 0);
  for (size_t i = 0; i < b64.size(); i += 4) {
    uint32_t n = 0;
    int pad = 0;
    for (int k = 0; k < 4; ++k) {
      const char ch = b64[i + static_cast<size_t>(k)];
      if (ch == '=') {
        ++pad;
        n <<= 6;
        continue;
      }
      const int v = val(ch);
      REQUIRE(v >= 0);
      n = (n << 6) | static_cast<uint32_t>(v);
    }
    for (int k = 0; k < 3 - pad; ++k) bytes.push_back(static_cast<unsigned char>(n >> (16 - 8 * k)));
  }
  REQUIRE(bytes.size() % 4 == 0);
  std::vector<float> out(bytes.size() / 4);
  for (size_t i = 0; i < out.size(); ++i) {
    const uint32_t u = uint32_t{bytes[4 * i]} | uint32_t{bytes[4 * i + 1]} << 8 | uint32_t{bytes[4 * i + 2]} << 16 |
                       uint32_t{bytes[4 * i + 3]} << 24;
    std::memcpy(&out[i], &u, 4);
  }
  return out;
}

double cosine(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0, na = 0, nb = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) d += double(a[i]) * b[i], na += double(a[i]) * a[i], nb += double(b[i]) * b[i];
  return d / std::sqrt(na * nb);
}

}  // namespace

TEST_CASE("serve: /v1/embeddings answers strings, arrays, token ids and base64, bad input is 400") {
  ServerProcess srv(serve_args({"--parallel", "2"}));
  REQUIRE_MESSAGE(srv.ok(), srv.log());
  httplib::Client c("127.0.0.1", srv.port());
  const auto ref = json::parse(read_file(model_dir() + "/reference.json"))["embeddings"];
  const std::string s0 = ref[0]["text"], s1 = ref[1]["text"];
  const auto want0 = ref[0]["embedding"].get<std::vector<float>>();
  const auto want1 = ref[1]["embedding"].get<std::vector<float>>();

  // One string: OpenAI's shape, transformers' vector, usage = its tokens (BOS included).
  auto r = post(c, "/v1/embeddings", {{"model", "llama-target"}, {"input", s0}});
  REQUIRE(r);
  REQUIRE_MESSAGE(r->status == 200, r->body);
  json j = json::parse(r->body);
  CHECK(j["object"] == "list");
  CHECK(j["model"] == "llama-target");
  REQUIRE(j["data"].size() == 1);
  CHECK(j["data"][0]["object"] == "embedding");
  CHECK(j["data"][0]["index"] == 0);
  const auto v0 = j["data"][0]["embedding"].get<std::vector<float>>();
  REQUIRE(v0.size() == 512);
  CHECK(cosine(v0, want0) > 0.9999);
  auto tk = post(c, "/tokenize", {{"content", s0}, {"add_special", true}, {"parse_special", false}});
  REQUIRE(tk);
  const auto ids0 = json::parse(tk->body)["tokens"].get<std::vector<int32_t>>();
  CHECK(ids0.front() == 0);  // BOS
  CHECK(j["usage"]["prompt_tokens"] == ids0.size());
  CHECK(j["usage"]["total_tokens"] == ids0.size());

  // An array of strings: one entry each, in order, each equal to its request alone.
  r = post(c, "/v1/embeddings", {{"input", {s1, s0}}});
  REQUIRE(r);
  REQUIRE_MESSAGE(r->status == 200, r->body);
  j = json::parse(r->body);
  REQUIRE(j["data"].size() == 2);
  CHECK(j["data"][0]["index"] == 0);
  CHECK(j["data"][1]["index"] == 1);
  CHECK(cosine(j["data"][0]["embedding"].get<std::vector<float>>(), want1) > 0.9999);
  CHECK(j["data"][1]["embedding"].get<std::vector<float>>() == v0);
  const int64_t both_tokens = j["usage"]["prompt_tokens"].get<int64_t>();
  CHECK(both_tokens > static_cast<int64_t>(ids0.size()));

  // Token ids (one list, and a list of lists) give the same vector as the text.
  r = post(c, "/v1/embeddings", {{"input", ids0}});
  REQUIRE(r);
  REQUIRE_MESSAGE(r->status == 200, r->body);
  CHECK(json::parse(r->body)["data"][0]["embedding"].get<std::vector<float>>() == v0);
  r = post(c, "/v1/embeddings", {{"input", {ids0, std::vector<int32_t>(ids0.begin(), ids0.begin() + 3)}}});
  REQUIRE(r);
  REQUIRE_MESSAGE(r->status == 200, r->body);
  j = json::parse(r->body);
  REQUIRE(j["data"].size() == 2);
  CHECK(j["data"][0]["embedding"].get<std::vector<float>>() == v0);
  CHECK(cosine(j["data"][1]["embedding"].get<std::vector<float>>(), v0) < 0.9999);
  CHECK(j["usage"]["prompt_tokens"] == ids0.size() + 3);

  // base64: little-endian float32, the same numbers as the float format.
  r = post(c, "/v1/embeddings", {{"input", s0}, {"encoding_format", "base64"}, {"dimensions", 512}});
  REQUIRE(r);
  REQUIRE_MESSAGE(r->status == 200, r->body);
  const auto b64 = decode_base64_floats(json::parse(r->body)["data"][0]["embedding"].get<std::string>());
  REQUIRE(b64.size() == 512);
  for (size_t i = 0; i < b64.size(); ++i) CHECK_MESSAGE(b64[i] == v0[i], "element ", i);

  // Pooling extension: last differs from mean, and is unit length.
  r = post(c, "/v1/embeddings", {{"input", s0}, {"pooling", "last"}});
  REQUIRE(r);
  REQUIRE_MESSAGE(r->status == 200, r->body);
  const auto last = json::parse(r->body)["data"][0]["embedding"].get<std::vector<float>>();
  CHECK(std::fabs(cosine(last, last) - 1.0) < 1e-6);
  CHECK(cosine(last, v0) < 0.999);

  // Bad requests: 400 naming the field (404 for another model).
  std::vector<json> too_many(2049, "x");
  struct Case {
    json body;
    int status;
    std::string param, code;
  };
  const std::vector<Case> cases = {
      {json::object(), 400, "input", ""},
      {{{"input", nullptr}}, 400, "input", ""},
      {{{"input", 12}}, 400, "input", ""},
      {{{"input", json::object()}}, 400, "input", ""},
      {{{"input", ""}}, 400, "input", ""},
      {{{"input", json::array()}}, 400, "input", ""},
      {{{"input", {"a", ""}}}, 400, "input", ""},
      {{{"input", {"a", 3}}}, 400, "input", ""},
      {{{"input", {1, "a"}}}, 400, "input", ""},
      {{{"input", {1.5, 2}}}, 400, "input", ""},
      {{{"input", {{1, 2}, json::array()}}}, 400, "input", ""},
      {{{"input", {{1, 2}, {99999}}}}, 400, "input", ""},
      {{{"input", {-1}}}, 400, "input", ""},
      {{{"input", too_many}}, 400, "input", ""},
      {{{"input", std::vector<int>(513, 5)}}, 400, "input", "context_length_exceeded"},
      {{{"input", {"ok", std::string(3000, 'a') + " long"}}}, 400, "input", "context_length_exceeded"},
      {{{"input", "x"}, {"encoding_format", "hex"}}, 400, "encoding_format", ""},
      {{{"input", "x"}, {"encoding_format", 1}}, 400, "encoding_format", ""},
      {{{"input", "x"}, {"dimensions", 256}}, 400, "dimensions", ""},
      {{{"input", "x"}, {"dimensions", "512"}}, 400, "dimensions", ""},
      {{{"input", "x"}, {"pooling", "max"}}, 400, "pooling", ""},
      {{{"input", "x"}, {"model", "text-embedding-3-small"}}, 404, "model", "model_not_found"},
      {json::array({1, 2}), 400, "", ""},
  };
  for (const auto& k : cases) {
    CAPTURE(k.body.dump().substr(0, 200));
    r = post(c, "/v1/embeddings", k.body);
    REQUIRE(r);
    CHECK(r->status == k.status);
    const json e = json::parse(r->body, nullptr, false);
    REQUIRE(!e.is_discarded());
    REQUIRE(e.contains("error"));
    CHECK(e["error"]["message"].get<std::string>().size() > 5);
    if (!k.param.empty()) CHECK(e["error"]["param"] == k.param);
    if (!k.code.empty()) CHECK(e["error"]["code"] == k.code);
  }
  r = post(c, "/v1/embeddings", {{"input", std::vector<int>(513, 5)}});
  REQUIRE(r);
  CHECK(r->body.find("513") != std::string::npos);
  CHECK(r->body.find("512") != std::string::npos);
  r = c.Post("/v1/embeddings", "{nope", "application/json");
  REQUIRE(r);
  CHECK(r->status == 400);

  // Metrics: inputs and tokens of the answered requests, requests by route.
  CHECK(metric(c, "kite_embedding_inputs_total") == 1 + 2 + 1 + 2 + 1 + 1);
  CHECK(metric(c, "kite_embedding_tokens_total") >= 2 * static_cast<double>(ids0.size()) + both_tokens);
  auto m = c.Get("/metrics");
  REQUIRE(m);
  CHECK(m->body.find("kite_requests_total{route=\"/v1/embeddings\",status=\"200\"} 6") != std::string::npos);
  CHECK(m->body.find("kite_requests_total{route=\"/v1/embeddings\",status=\"400\"}") != std::string::npos);

  // Any value in any field: never a server error.
  const std::vector<json> values = {nullptr, true, -1, 0, 1e300, "", "float", json::array(), json::array({1, "a"}),
                                    json::object()};
  for (const char* f : {"input", "model", "encoding_format", "dimensions", "pooling", "user"})
    for (const auto& v : values) {
      json body = {{"input", "hi"}};
      body[f] = v;
      CAPTURE(body.dump());
      r = post(c, "/v1/embeddings", body);
      REQUIRE(r);
      CHECK(r->status < 500);
    }
  CHECK(srv.stop() == 0);
}

TEST_CASE("serve: embeddings interleave with running generations without changing them") {
  ServerProcess srv(serve_args({"--parallel", "2"}));
  REQUIRE_MESSAGE(srv.ok(), srv.log());
  httplib::Client c("127.0.0.1", srv.port());
  const json gen = {{"prompt", "Once upon a time"}, {"max_tokens", 60}, {"temperature", 0}, {"ignore_eos", true}};
  auto alone = post(c, "/v1/completions", gen);
  REQUIRE(alone);
  REQUIRE(alone->status == 200);
  const std::string alone_text = json::parse(alone->body)["choices"][0]["text"];
  auto e_alone = post(c, "/v1/embeddings", {{"input", {"The king said", "War and peace."}}});
  REQUIRE(e_alone);
  REQUIRE(e_alone->status == 200);
  const json e_alone_j = json::parse(e_alone->body);

  // A generation and a stream of embedding requests at the same time.
  std::string text;
  int gen_status = 0;
  std::thread t([&] {
    httplib::Client g("127.0.0.1", srv.port());
    auto r = post(g, "/v1/completions", gen);
    if (!r) return;
    gen_status = r->status;
    text = json::parse(r->body)["choices"][0]["text"];
  });
  int ok = 0;
  for (int i = 0; i < 6; ++i) {
    auto r = post(c, "/v1/embeddings", {{"input", {"The king said", "War and peace."}}});
    REQUIRE(r);
    CHECK(r->status == 200);
    if (r->status == 200 && json::parse(r->body)["data"] == e_alone_j["data"]) ++ok;
  }
  t.join();
  CHECK(ok == 6);
  CHECK(gen_status == 200);
  CHECK(text == alone_text);
  CHECK(srv.stop() == 0);
}

}  // namespace kite::test

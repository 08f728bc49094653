// `kite serve`'s /v1/completions with `echo` and `logprobs`: the prompt's tokens come back with
// their logprobs (null for a first token, which nothing precedes), checked field by field
// against the model run in this process and against transformers' top-5 in reference.json.
#include <httplib.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <thread>

#include "doctest/doctest.h"
#include "src/model/model.h"
#include "src/runtime/context.h"
#include "src/runtime/tokenizer.h"
#include "tests/server_client.h"

namespace kite::test {

namespace {

// The model's own distribution at every position of `ids`: log-softmax of the logits.
struct Direct {
  std::vector<std::vector<double>> logprobs;  // [position][token]: predicts position + 1
  std::shared_ptr<const Tokenizer> tok;
};

Direct direct_logprobs(const std::vector<int32_t>& ids) {
  auto model = Model::load(model_dir());
  REQUIRE_MESSAGE(model.ok(), (model.ok() ? std::string() : model.error().message));
  auto tok = Tokenizer::load((*model)->source().metadata());
  REQUIRE_MESSAGE(tok.ok(), (tok.ok() ? std::string() : tok.error().message));
  ContextOptions opts;
  opts.n_ctx = 256;
  opts.kv_type = DType::F16;  // as the server's default
  opts.n_threads = 2;
  auto ctx = Context::create(*model, opts);
  REQUIRE_MESSAGE(ctx.ok(), (ctx.ok() ? std::string() : ctx.error().message));
  REQUIRE((*ctx)->eval(ids, 0, /*all_logits=*/true).ok());
  Direct d;
  d.tok = *tok;
  for (size_t p = 0; p < ids.size(); ++p) {
    auto logits = (*ctx)->logits(p);
    double mx = -INFINITY, sum = 0;
    for (float l : logits) mx = std::max(mx, double(l));
    for (float l : logits) sum += std::exp(double(l) - mx);
    std::vector<double> lp(logits.size());
    for (size_t t = 0; t < logits.size(); ++t) lp[t] = double(logits[t]) - mx - std::log(sum);
    d.logprobs.push_back(std::move(lp));
  }
  return d;
}

std::vector<int32_t> top_ids(const std::vector<double>& lp, size_t k) {
  std::vector<int32_t> order(lp.size());
  for (size_t t = 0; t < order.size(); ++t) order[t] = static_cast<int32_t>(t);
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(),
                    [&](int32_t a, int32_t b) { return lp[a] > lp[b] || (lp[a] == lp[b] && a < b); });
  order.resize(k);
  return order;
}

}  // namespace

TEST_CASE("serve: completions echo the prompt's logprobs, equal to the model's own") {
  const json ref = json::parse(read_file(model_dir() + "/reference.json"));
  const json& prompt = ref["prompts"][0];
  const std::string text = prompt["text"].get<std::string>();
  const auto ids = prompt["ids"].get<std::vector<int32_t>>();  // BOS first
  REQUIRE(ids.size() > 8);
  const size_t n = ids.size();
  const Direct d = direct_logprobs(ids);
  const Tokenizer& tok = *d.tok;
  constexpr int kTop = 5;
  constexpr double kTol = 2e-3;  // same kernels, other batch shapes

  ServerProcess srv(serve_args({"--parallel", "2"}));
  REQUIRE_MESSAGE(srv.ok(), srv.log());
  httplib::Client c("127.0.0.1", srv.port());
  auto r = post(c, "/v1/completions",
                {{"prompt", text},
                 {"echo", true},
                 {"logprobs", kTop},
                 {"max_tokens", 3},
                 {"temperature", 0},
                 {"ignore_eos", true}});
  REQUIRE(r);
  REQUIRE_MESSAGE(r->status == 200, r->body);
  const json j = json::parse(r->body);
  const json& ch = j["choices"][0];
  CHECK(j["usage"]["prompt_tokens"] == n);
  CHECK(j["usage"]["completion_tokens"] == 3);
  const std::string out_text = ch["text"].get<std::string>();
  REQUIRE(out_text.rfind(text, 0) == 0);
  const json& lp = ch["logprobs"];
  // The BOS the tokenizer added is not part of the echoed text: n - 1 prompt tokens, 3 generated.
  REQUIRE(lp["tokens"].size() == n - 1 + 3);
  REQUIRE(lp["token_logprobs"].size() == n - 1 + 3);
  REQUIRE(lp["top_logprobs"].size() == n - 1 + 3);
  REQUIRE(lp["text_offset"].size() == n - 1 + 3);
  std::string joined;
  for (size_t i = 1; i < n; ++i) {
    CAPTURE(i);
    const size_t e = i - 1;  // entry of prompt token i
    const std::string t = tok.token_bytes(ids[i]);
    CHECK(lp["tokens"][e] == t);
    CHECK(lp["text_offset"][e] == joined.size());
    joined += t;
    // Token i given tokens 0..i-1 (BOS included): position i - 1's distribution.
    const std::vector<double>& dist = d.logprobs[i - 1];
    CHECK(std::fabs(lp["token_logprobs"][e].get<double>() - dist[ids[i]]) < kTol);
    const json& top = lp["top_logprobs"][e];
    REQUIRE(top.size() == kTop);
    const auto want = top_ids(dist, kTop);
    for (int k = 0; k < kTop; ++k) {
      const std::string key = tok.token_bytes(want[k]);
      REQUIRE_MESSAGE(top.contains(key), "top ", k, " '", key, "' missing");
      CHECK(std::fabs(top[key].get<double>() - dist[want[k]]) < kTol);
    }
    // transformers' own top-5 at that position: the same most likely token, and the same gaps
    // between the candidates' logits (the bf16 weights are computed in f32 by both).
    const auto ref_ids = prompt["top5_ids"][i - 1].get<std::vector<int32_t>>();
    const auto ref_logits = prompt["top5_logits"][i - 1].get<std::vector<double>>();
    CHECK(want[0] == ref_ids[0]);
    for (int k = 1; k < kTop; ++k) {
      const std::string key = tok.token_bytes(ref_ids[k]);
      if (!top.contains(key)) continue;  // a near tie at the edge of the top 5
      CHECK(std::fabs((top[tok.token_bytes(ref_ids[0])].get<double>() - top[key].get<double>()) -
                      (ref_logits[0] - ref_logits[k])) < 0.05);
    }
  }
  CHECK(joined == text);
  // The generated tokens follow: greedy, the first one is the last prompt position's top token,
  // offsets counted on from the end of the echoed prompt.
  const auto greedy = top_ids(d.logprobs[n - 1], 1)[0];
  CHECK(lp["tokens"][n - 1] == tok.token_bytes(greedy));
  CHECK(std::fabs(lp["token_logprobs"][n - 1].get<double>() - d.logprobs[n - 1][greedy]) < kTol);
  CHECK(lp["text_offset"][n - 1] == text.size());
  CHECK(lp["top_logprobs"][n - 1].size() == kTop);

  // The prompt as token ids, BOS included: the BOS is echoed too, with null logprobs (nothing
  // precedes it), and every other entry is the same as for the text prompt.
  r = post(c, "/v1/completions",
           {{"prompt", ids},
            {"echo", true},
            {"logprobs", kTop},
            {"max_tokens", 3},
            {"temperature", 0},
            {"ignore_eos", true}});
  REQUIRE(r);
  REQUIRE_MESSAGE(r->status == 200, r->body);
  const json by_ids = json::parse(r->body);
  const json& lp_ids = by_ids["choices"][0]["logprobs"];
  REQUIRE(lp_ids["tokens"].size() == n + 3);
  CHECK(lp_ids["tokens"][0] == tok.token_bytes(ids[0]));
  CHECK(lp_ids["token_logprobs"][0].is_null());
  CHECK(lp_ids["top_logprobs"][0].is_null());
  CHECK(lp_ids["text_offset"][0] == 0);
  for (size_t e = 1; e < n + 3; ++e) {
    CAPTURE(e);
    CHECK(lp_ids["tokens"][e] == lp["tokens"][e - 1]);
    if (e >= n) continue;  // generated: the prompt came from the prefix cache this time (other batch shapes)
    CHECK(lp_ids["token_logprobs"][e] == lp["token_logprobs"][e - 1]);
    CHECK(lp_ids["top_logprobs"][e] == lp["top_logprobs"][e - 1]);
  }

  // max_tokens 0 with echo scores the prompt alone (what evaluation harnesses ask for).
  r = post(c, "/v1/completions", {{"prompt", text}, {"echo", true}, {"logprobs", kTop}, {"max_tokens", 0}});
  REQUIRE(r);
  REQUIRE_MESSAGE(r->status == 200, r->body);
  json only = json::parse(r->body);
  CHECK(only["choices"][0]["text"] == text);
  CHECK(only["choices"][0]["finish_reason"] == "length");
  CHECK(only["usage"]["prompt_tokens"] == n);
  CHECK(only["usage"]["completion_tokens"] == 0);
  const json& lp0 = only["choices"][0]["logprobs"];
  REQUIRE(lp0["tokens"].size() == n - 1);
  for (const char* k : {"tokens", "token_logprobs", "top_logprobs", "text_offset"})
    for (size_t e = 0; e + 1 < n; ++e) CHECK(lp0[k][e] == lp[k][e]);
  // A prompt longer than the context is refused before anything is computed.
  r = post(c, "/v1/completions",
           {{"prompt", std::string(3000, 'a') + " long"},
            {"echo", true},
            {"logprobs", 1},
            {"max_tokens", 0},
            {"stream", true}});
  REQUIRE(r);
  CHECK(r->status == 400);
  CHECK(json::parse(r->body)["error"]["code"] == "context_length_exceeded");
  // Without echo there is nothing to answer with max_tokens 0.
  r = post(c, "/v1/completions", {{"prompt", text}, {"max_tokens", 0}});
  REQUIRE(r);
  CHECK(r->status == 400);
  CHECK(json::parse(r->body)["error"]["param"] == "max_tokens");

  // Streamed: the first chunk echoes the prompt with its logprobs, then the generated tokens.
  r = post(c, "/v1/completions",
           {{"prompt", text},
            {"echo", true},
            {"logprobs", kTop},
            {"max_tokens", 3},
            {"temperature", 0},
            {"ignore_eos", true},
            {"stream", true}});
  REQUIRE(r);
  REQUIRE(r->status == 200);
  const size_t first = r->body.find("data: ");
  REQUIRE(first != std::string::npos);
  const json chunk = json::parse(r->body.substr(first + 6, r->body.find("\n\n", first) - first - 6));
  CHECK(chunk["choices"][0]["text"] == text);
  const json& slp = chunk["choices"][0]["logprobs"];
  REQUIRE(slp["tokens"].size() == n - 1);
  for (const char* k : {"tokens", "token_logprobs", "top_logprobs", "text_offset"})
    for (size_t e = 0; e + 1 < n; ++e) CHECK(slp[k][e] == lp[k][e]);
  const Streamed s = parse_sse(r->body, false);
  CHECK(s.done);
  CHECK(s.text.at(0) == out_text);
  CHECK(metric_settled(c, "kite_kv_blocks_used", 0) == 0);  // nothing holds KV blocks afterwards
  CHECK(srv.stop() == 0);
}

}  // namespace kite::test

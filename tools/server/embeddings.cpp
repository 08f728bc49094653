// POST /v1/embeddings: validate, queue the inputs on the engine thread (one input per engine
// turn, between generation steps), wait, answer in OpenAI's shape.
//
// `dimensions` must equal the model's n_embd (400 otherwise): a causal LM's pooled hidden state
// is not trained to be shortened, so kite does not truncate. `encoding_format: "base64"` sends
// each vector as the base64 of its little-endian float32 bytes. Extension: `"pooling": "mean" |
// "last" | "cls"` (default mean over all tokens, BOS included); vectors are L2-normalized.
#include <charconv>
#include <cstring>

#include "tools/server/http.h"

namespace kite::tools::server {
namespace {

std::string base64_floats(const std::vector<float>& v) {
  static const char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::vector<unsigned char> bytes(v.size() * 4);
  for (size_t i = 0; i < v.size(); ++i) {
    uint32_t u = 0;
    std::memcpy(&u, &v[i], 4);
    for (int b = 0; b < 4; ++b) bytes[i * 4 + static_cast<size_t>(b)] = static_cast<unsigned char>(u >> (8 * b));
  }
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    const uint32_t n = (uint32_t{bytes[i]} << 16) | (i + 1 < bytes.size() ? uint32_t{bytes[i + 1]} << 8 : 0u) |
                       (i + 2 < bytes.size() ? uint32_t{bytes[i + 2]} : 0u);
    out += kAlphabet[(n >> 18) & 63];
    out += kAlphabet[(n >> 12) & 63];
    out += i + 1 < bytes.size() ? kAlphabet[(n >> 6) & 63] : '=';
    out += i + 2 < bytes.size() ? kAlphabet[n & 63] : '=';
  }
  return out;
}

// The vector as a JSON array, each float in the shortest text that reads back as itself (a
// quarter of what a double-precision dump would take).
void append_float_array(std::string* out, const std::vector<float>& v) {
  char buf[32];
  *out += '[';
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) *out += ',';
    auto r = std::to_chars(buf, buf + sizeof buf, v[i]);
    out->append(buf, r.ptr);
  }
  *out += ']';
}

}  // namespace

void handle_embeddings(const HandlerContext& hc, const httplib::Request& req, httplib::Response& res) {
  Engine& engine = *hc.engine;
  const auto start = Clock::now();
  Json body;
  if (!begin_model_request(hc, req, res, &body)) return;
  ModelInfo info;
  info.tokenizer = &engine.tokenizer();
  info.model_id = engine.model_id();
  info.n_ctx = engine.n_ctx();
  info.n_embd = engine.n_embd();
  EmbeddingRequest er;
  if (auto e = parse_embedding_request(body, info, &er)) {
    send_error(res, *e);
    return;
  }
  const size_t n_inputs = er.inputs.size();
  EmbedOptions eo;
  eo.pooling = er.pooling;
  auto job = std::make_shared<EmbedJob>(std::move(er.inputs), eo);
  if (auto st = engine.submit_aux(job); !st) {
    send_error(res, engine_error(st.error(), "input", "input"));
    return;
  }
  const auto deadline = start + std::chrono::milliseconds(static_cast<int64_t>(hc.timeout_s * 1000));
  if (auto e = wait_for_aux(*job, deadline, ClientConnection(req), hc.metrics)) {
    send_error(res, *e);
    return;
  }
  if (job->error()) {
    send_error(res, engine_error(*job->error(), "input", "input"));
    return;
  }
  hc.metrics->add_embeddings(static_cast<int64_t>(n_inputs), er.tokens);
  hc.metrics->observe_request_latency(std::chrono::duration<double>(Clock::now() - start).count());
  std::string out = R"({"object":"list","data":[)";
  const auto& results = job->results();
  for (size_t i = 0; i < results.size(); ++i) {
    if (i) out += ',';
    out += R"({"object":"embedding","index":)" + std::to_string(i) + R"(,"embedding":)";
    if (er.base64)
      out += "\"" + base64_floats(results[i]) + "\"";
    else
      append_float_array(&out, results[i]);
    out += '}';
  }
  out += R"(],"model":)" + dump(OJson(engine.model_id())) + R"(,"usage":{"prompt_tokens":)" +
         std::to_string(er.tokens) + R"(,"total_tokens":)" + std::to_string(er.tokens) + "}}";
  res.set_content(out, "application/json");
}

}  // namespace kite::tools::server

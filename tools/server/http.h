// kite/tools/server/http.h — the HTTP side of `kite serve`: routes, authentication, request ids,
// errors, logging (cpp-httplib).
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <httplib.h>

#include "tools/server/engine.h"
#include "tools/server/metrics.h"
#include "tools/server/openai.h"

namespace kite::tools::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string api_key;           // empty: no authentication
  double timeout_s = 600;        // per generation request
  size_t max_body_bytes = 8u << 20;
  int threads = 0;               // HTTP worker threads; 0: enough for the slots and the queue
  std::string ssl_cert, ssl_key; // both set: HTTPS
  // CORS (--cors): "*" or a comma-separated list of origins ("https://app.example.com") whose
  // browser pages may call the API: their requests get Access-Control-Allow-* headers and an
  // OPTIONS preflight is answered 204 (before authentication, as browsers send it without
  // credentials). Empty: no CORS headers.
  std::string cors;
};

// The Access-Control-Allow-Origin value for a request's Origin under a --cors setting; empty
// when the origin is not allowed (or there is no Origin header and the setting is a list).
std::string cors_allowed_origin(const std::string& cors, const std::string& origin);

// The status logged for a request whose client left before its answer (nginx's convention).
constexpr int kClientClosedRequest = 499;

// Writes an OpenAI error body with its status (and Retry-After for 429/503).
void send_error(httplib::Response& res, const ApiError& e);

// The socket a request came on, so that a handler waiting for a long generation notices a client
// that went away without writing anything (httplib 0.11 hands a handler no socket, and a sink's
// is_writable() only asks whether a write would block). Found once per request by matching the
// request's local and remote address among the process's sockets; the socket stays open while the
// handler runs, since httplib closes it only after the handler returned.
class ClientConnection {
 public:
  explicit ClientConnection(const httplib::Request& req);
  // False once the client closed or reset its side of the connection. True when its socket
  // could not be found (then nothing is known, and only failed writes reveal a disconnect).
  bool alive() const;
  bool found() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

// What the generation handlers need.
struct HandlerContext {
  Engine* engine = nullptr;
  Metrics* metrics = nullptr;
  double timeout_s = 600;
  const std::atomic<bool>* shutting_down = nullptr;
};

// The common start of the POST handlers that need the model: 503 while shutting down or
// loading, 400 when the body is not JSON. False once the error is sent; else `body` is parsed.
bool begin_model_request(const HandlerContext& hc, const httplib::Request& req, httplib::Response& res, Json* body);

// Waits for an auxiliary job until it is done, `deadline` (503 timeout) or the client leaves
// (499): the job is then cancelled and counted as such. nullopt: finished (maybe with an error).
std::optional<ApiError> wait_for_aux(AuxJob& job, Clock::time_point deadline, const ClientConnection& client,
                                     Metrics* metrics);

// POST /v1/chat/completions and /v1/completions (generate.cpp).
void handle_generate(const HandlerContext& hc, Endpoint endpoint, const httplib::Request& req,
                     httplib::Response& res);

// POST /v1/embeddings (embeddings.cpp).
void handle_embeddings(const HandlerContext& hc, const httplib::Request& req, httplib::Response& res);

// The embedded chat page (chat_page.cpp).
const char* chat_page_html();

class HttpServer {
 public:
  HttpServer(Engine* engine, Metrics* metrics, ServerOptions opts);
  ~HttpServer();
  // Binds the socket; an error names the address.
  Status bind();
  int port() const { return port_; }
  // Serves until stop() (blocking).
  void listen();
  // New generation requests get 503 from now on; running ones go on.
  void begin_shutdown() { shutting_down_.store(true); }
  void stop();

 private:
  void add_routes();
  void handle_simple(const httplib::Request& req, httplib::Response& res);

  Engine* engine_;
  Metrics* metrics_;
  ServerOptions opts_;
  std::unique_ptr<httplib::Server> srv_;
  int port_ = 0;
  int listen_fd_ = -1;
  std::mutex starts_mu_;
  std::map<std::thread::id, Clock::time_point> starts_;  // request start per worker thread
  std::atomic<bool> shutting_down_{false};
  HandlerContext hc_;
};

}  // namespace kite::tools::server

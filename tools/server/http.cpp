// Routes, authentication, request ids, error bodies and the per-request log line.
#include "tools/server/http.h"

#include <dirent.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <random>

namespace kite::tools::server {
namespace {

std::string random_hex(size_t n) {
  std::random_device rd;
  static const char* kHex = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; i += 8)
    for (uint32_t v = rd(), k = 0; k < 8 && i + k < n; ++k, v >>= 4) s += kHex[v & 15];
  return s;
}

bool valid_request_id(const std::string& id) {
  if (id.empty() || id.size() > 128) return false;
  for (char c : id)
    if (c < 0x21 || c > 0x7e) return false;
  return true;
}

bool constant_time_equal(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i % (b.size() + 1)]);
  return diff == 0;
}

std::string route_label(const std::string& path) {
  static const char* kKnown[] = {"/",          "/health",   "/metrics",        "/v1/models",     "/v1/chat/completions",
                                 "/v1/completions", "/v1/embeddings", "/tokenize", "/detokenize"};
  for (const char* k : kKnown)
    if (path == k) return k;
  if (path.rfind("/v1/models/", 0) == 0) return "/v1/models/{id}";
  return "other";
}

const char* status_type(int status) {
  switch (status) {
    case 401: return "authentication_error";
    case 404: return "not_found_error";
    case 413: return "invalid_request_error";
    case 429: return "rate_limit_error";
    case 501: return "not_implemented_error";
    case 503: return "server_unavailable_error";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
  }
}

ApiError make_api_error(int status, std::string message, std::string code = {}) {
  ApiError e;
  e.status = status;
  e.message = std::move(message);
  e.type = status_type(status);
  e.code = std::move(code);
  return e;
}

Json parse_json_body(const httplib::Request& req, std::optional<ApiError>* err) {
  try {
    return Json::parse(req.body);
  } catch (const Json::exception& e) {
    *err = make_api_error(400, std::string("the request body is not valid JSON: ") + e.what(), "invalid_json");
    return Json();
  }
}

// The numeric host and the port of a socket address, as httplib writes them into a Request.
bool address_of(const sockaddr_storage& addr, socklen_t len, std::string* host, int* port) {
  char h[NI_MAXHOST], p[NI_MAXSERV];
  if (::getnameinfo(reinterpret_cast<const sockaddr*>(&addr), len, h, sizeof h, p, sizeof p,
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return false;
  *host = h;
  *port = std::atoi(p);
  return true;
}

// The connected socket whose local and remote ends are the request's; -1 when none is.
int find_request_socket(const httplib::Request& req) {
  if (req.remote_port <= 0 || req.local_port <= 0) return -1;
  DIR* dir = ::opendir("/dev/fd");  // Linux: /proc/self/fd; the BSDs and macOS have it too
  if (!dir) return -1;
  int found = -1;
  while (const dirent* e = ::readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == ::dirfd(dir)) continue;
    sockaddr_storage local{}, peer{};
    socklen_t local_len = sizeof local, peer_len = sizeof peer;
    if (::getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&local), &local_len) != 0) continue;
    if (::getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0) continue;
    std::string local_host, peer_host;
    int local_port = 0, peer_port = 0;
    if (!address_of(local, local_len, &local_host, &local_port) || !address_of(peer, peer_len, &peer_host, &peer_port))
      continue;
    if (local_port == req.local_port && peer_port == req.remote_port && peer_host == req.remote_addr &&
        local_host == req.local_addr) {
      found = static_cast<int>(fd);
      break;
    }
  }
  ::closedir(dir);
  return found;
}

// The POST routes read their bodies themselves: httplib's own reading answers an
// application/x-www-form-urlencoded body over 8 KB with a misleading 413 (curl -d sends that type
// unless told otherwise), and this API reads every body as JSON whatever its declared type.
// --max-body still applies (httplib's reader refuses a longer body with 413).
httplib::Server::HandlerWithContentReader with_body(httplib::Server::Handler handler) {
  return [handler](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader) {
    if (req.is_multipart_form_data()) {  // httplib would parse it as form fields
      send_error(res, make_api_error(400, "the request body must be JSON, not multipart/form-data"));
      return;
    }
    httplib::Request with_body = req;
    const bool read = reader([&](const char* data, size_t n) {
      with_body.body.append(data, n);
      return true;
    });
    if (!read) {
      if (res.status < 400) res.status = 400;  // 413 set by the reader for a body over the limit
      return;                                  // the error handler writes the body
    }
    handler(with_body, res);
  };
}

}  // namespace

ClientConnection::ClientConnection(const httplib::Request& req) : fd_(find_request_socket(req)) {}

bool ClientConnection::alive() const {
  if (fd_ < 0) return true;
#ifdef POLLRDHUP
  // Linux: the peer's FIN shows as POLLRDHUP even when unread bytes (a pipelined request, a TLS
  // close_notify) sit before it.
  pollfd p{fd_, POLLRDHUP, 0};
  if (::poll(&p, 1, 0) < 0) return true;
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) == 0;
#else
  char c;
  const ssize_t n = ::recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return n != 0 && !(n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
#endif
}

std::string cors_allowed_origin(const std::string& cors, const std::string& origin) {
  if (cors.empty()) return {};
  if (cors == "*") return "*";
  if (origin.empty()) return {};
  size_t start = 0;
  while (start <= cors.size()) {
    size_t end = cors.find(',', start);
    if (end == std::string::npos) end = cors.size();
    std::string item = cors.substr(start, end - start);
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t/") + 1);  // "https://a.example/" names the same origin
    if (!item.empty() && item == origin) return origin;
    start = end + 1;
  }
  return {};
}

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  if (e.status == 429 || e.status == 503) res.set_header("Retry-After", "1");
  res.set_content(error_body(e), "application/json");
}

std::optional<ApiError> wait_for_aux(AuxJob& job, Clock::time_point deadline, const ClientConnection& client,
                                     Metrics* metrics) {
  for (;;) {
    const auto slice = std::min(deadline, Clock::now() + std::chrono::milliseconds(100));
    if (job.wait_until(slice)) return std::nullopt;
    if (!client.alive()) {
      job.cancel();
      metrics->count_cancelled();
      return ApiError{kClientClosedRequest, "the client closed the connection", "invalid_request_error", "",
                      "client_closed_request"};
    }
    if (Clock::now() >= deadline) {
      job.cancel();
      metrics->count_cancelled();
      return ApiError{503, "the request took longer than the server's timeout", "server_unavailable_error", "",
                      "timeout"};
    }
  }
}

bool begin_model_request(const HandlerContext& hc, const httplib::Request& req, httplib::Response& res, Json* body) {
  if (hc.shutting_down->load()) {
    send_error(res, ApiError{503, "the server is shutting down", "server_unavailable_error", "", "shutting_down"});
    return false;
  }
  if (hc.engine->state() != Engine::State::kReady) {
    send_error(res, ApiError{503, "the model is still loading", "server_unavailable_error", "", "model_loading"});
    return false;
  }
  try {
    *body = Json::parse(req.body);
  } catch (const Json::exception& e) {
    send_error(res, ApiError{400, std::string("the request body is not valid JSON: ") + e.what(),
                             "invalid_request_error", "", "invalid_json"});
    return false;
  }
  return true;
}

HttpServer::HttpServer(Engine* engine, Metrics* metrics, ServerOptions opts)
    : engine_(engine), metrics_(metrics), opts_(std::move(opts)) {
#ifdef CPPHTTPLIB_OPENSSL_SUPPORT
  if (!opts_.ssl_cert.empty() && !opts_.ssl_key.empty())
    srv_ = std::make_unique<httplib::SSLServer>(opts_.ssl_cert.c_str(), opts_.ssl_key.c_str());
  else
#endif
    srv_ = std::make_unique<httplib::Server>();
  hc_.engine = engine_;
  hc_.metrics = metrics_;
  hc_.timeout_s = opts_.timeout_s;
  hc_.shutting_down = &shutting_down_;
  const int threads = opts_.threads > 0 ? opts_.threads : std::max(32, engine_->parallel() * 2 + 16);
  srv_->new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  // httplib listens with a backlog of 5: a burst of clients would overflow it and see stalled or
  // dropped connections. Remember the socket and widen the backlog after bind().
  srv_->set_socket_options([this](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    listen_fd_ = static_cast<int>(sock);
  });
  srv_->set_payload_max_length(opts_.max_body_bytes);
  srv_->set_read_timeout(10, 0);
  srv_->set_write_timeout(30, 0);
  srv_->set_keep_alive_timeout(5);
  add_routes();
}

HttpServer::~HttpServer() { stop(); }

Status HttpServer::bind() {
  if (!srv_->is_valid()) return make_error("cannot start the server (TLS certificate or key not loadable?)");
  if (opts_.port == 0) {
    port_ = srv_->bind_to_any_port(opts_.host.c_str());
    if (port_ <= 0) return make_error("cannot bind ", opts_.host, " to any port");
  } else {
    if (!srv_->bind_to_port(opts_.host.c_str(), opts_.port))
      return make_error("cannot bind ", opts_.host, ":", opts_.port, " (in use, or not a local address?)");
    port_ = opts_.port;
  }
  if (listen_fd_ >= 0) ::listen(listen_fd_, 1024);  // re-listening only changes the backlog
  return ok_status();
}

void HttpServer::listen() { srv_->listen_after_bind(); }

void HttpServer::stop() {
  if (srv_) srv_->stop();
}

void HttpServer::add_routes() {
  httplib::Server& s = *srv_;
  s.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    {
      std::lock_guard<std::mutex> lock(starts_mu_);
      starts_[std::this_thread::get_id()] = Clock::now();
    }
    std::string id = req.get_header_value("X-Request-Id");
    if (!valid_request_id(id)) id = random_hex(16);
    res.set_header("X-Request-Id", id);
    if (const std::string allow = cors_allowed_origin(opts_.cors, req.get_header_value("Origin")); !allow.empty()) {
      res.set_header("Access-Control-Allow-Origin", allow);
      if (allow != "*") res.set_header("Vary", "Origin");
      res.set_header("Access-Control-Expose-Headers", "X-Request-Id");
      if (req.method == "OPTIONS") {  // preflight: what a cross-origin call may send
        res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
        const std::string asked = req.get_header_value("Access-Control-Request-Headers");
        res.set_header("Access-Control-Allow-Headers",
                       asked.empty() ? std::string("Authorization, Content-Type, X-Request-Id") : asked);
        res.set_header("Access-Control-Max-Age", "86400");
        res.status = 204;
        return httplib::Server::HandlerResponse::Handled;
      }
    }
    if (!opts_.api_key.empty() && req.path != "/" && req.path != "/health") {
      const std::string auth = req.get_header_value("Authorization");
      if (!constant_time_equal(auth, "Bearer " + opts_.api_key)) {
        send_error(res, make_api_error(401, auth.empty() ? "missing API key: send 'Authorization: Bearer KEY'"
                                                         : "invalid API key",
                                       "invalid_api_key"));
        return httplib::Server::HandlerResponse::Handled;
      }
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  s.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
    if (!res.has_header("X-Request-Id")) res.set_header("X-Request-Id", random_hex(16));
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    std::string msg;
    if (res.status == 404) msg = "no route " + req.method + " " + req.path;
    else if (res.status == 413) msg = "the request body is too large";
    else msg = "HTTP error " + std::to_string(res.status);
    send_error(res, make_api_error(res.status, msg));
    return httplib::Server::HandlerResponse::Handled;
  }));
  s.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "internal error";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = std::string("internal error: ") + e.what();
    } catch (...) {
    }
    send_error(res, make_api_error(500, what));
  });
  s.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    // The logger runs on the worker thread that ran the pre-routing handler (none for
    // requests refused while reading them, e.g. 413).
    double ms = 0;
    {
      std::lock_guard<std::mutex> lock(starts_mu_);
      if (auto it = starts_.find(std::this_thread::get_id()); it != starts_.end()) {
        ms = std::chrono::duration<double, std::milli>(Clock::now() - it->second).count();
        starts_.erase(it);
      }
    }
    const std::string id = res.get_header_value("X-Request-Id");
    std::fprintf(stderr, "kite serve: %s %s %s %d %.1fms\n", id.c_str(), req.method.c_str(), req.path.c_str(),
                 res.status, ms);
    metrics_->count_request(route_label(req.path), res.status);
  });

  auto simple = [this](const httplib::Request& req, httplib::Response& res) { handle_simple(req, res); };
  s.Get("/", simple);
  s.Get("/health", simple);
  s.Get("/metrics", simple);
  s.Get("/v1/models", simple);
  s.Get(R"(/v1/models/(.+))", simple);
  s.Post("/tokenize", with_body(simple));
  s.Post("/detokenize", with_body(simple));
  s.Post("/v1/embeddings", with_body([this](const httplib::Request& req, httplib::Response& res) {
    handle_embeddings(hc_, req, res);
  }));
  s.Post("/v1/chat/completions", with_body([this](const httplib::Request& req, httplib::Response& res) {
    handle_generate(hc_, Endpoint::kChat, req, res);
  }));
  s.Post("/v1/completions", with_body([this](const httplib::Request& req, httplib::Response& res) {
    handle_generate(hc_, Endpoint::kCompletions, req, res);
  }));
}

void HttpServer::handle_simple(const httplib::Request& req, httplib::Response& res) {
  const Engine::State state = engine_->state();
  const bool ready = state == Engine::State::kReady;
  if (req.path == "/") {
    res.set_content(chat_page_html(), "text/html; charset=utf-8");
    return;
  }
  if (req.path == "/health") {
    if (ready && !shutting_down_.load()) {
      res.set_content(R"({"status":"ok"})", "application/json");
    } else {
      const char* s = shutting_down_.load()              ? "shutting down"
                      : state == Engine::State::kFailed ? "failed"
                                                        : "loading model";
      res.status = state == Engine::State::kFailed ? 500 : 503;
      if (res.status == 503) res.set_header("Retry-After", "1");
      res.set_content(dump(OJson{{"status", s}}), "application/json");
    }
    return;
  }
  if (req.path == "/metrics") {
    res.set_content(metrics_->render(engine_->snapshot(), ready), "text/plain; version=0.0.4");
    return;
  }
  if (!ready) {
    send_error(res, make_api_error(503, "the model is still loading", "model_loading"));
    return;
  }
  const Tokenizer& tok = engine_->tokenizer();
  auto model_json = [&] {
    return OJson{{"id", engine_->model_id()},
                 {"object", "model"},
                 {"created", 0},
                 {"owned_by", "kite"},
                 {"meta", {{"n_ctx", engine_->n_ctx()}, {"n_vocab", tok.n_vocab()}, {"fingerprint", engine_->fingerprint()}}}};
  };
  if (req.path == "/v1/models") {
    res.set_content(dump(OJson{{"object", "list"}, {"data", OJson::array({model_json()})}}), "application/json");
    return;
  }
  if (req.path.rfind("/v1/models/", 0) == 0) {
    if (req.matches.size() > 1 && req.matches[1].str() == engine_->model_id()) {
      res.set_content(dump(model_json()), "application/json");
    } else {
      ApiError e = make_api_error(404, "The model '" + (req.matches.size() > 1 ? req.matches[1].str() : std::string()) +
                                           "' does not exist",
                                  "model_not_found");
      e.param = "model";
      send_error(res, e);
    }
    return;
  }
  std::optional<ApiError> err;
  Json body = parse_json_body(req, &err);
  if (!err && !body.is_object()) err = make_api_error(400, "the request body must be a JSON object");
  if (err) {
    send_error(res, *err);
    return;
  }
  if (req.path == "/tokenize") {
    auto content = body.find("content");
    if (content == body.end() || !content->is_string()) {
      ApiError e = make_api_error(400, "'content' must be a string");
      e.param = "content";
      send_error(res, e);
      return;
    }
    EncodeOptions eo;
    eo.add_special = false;
    eo.parse_special = true;
    bool with_pieces = false;
    for (auto [name, dst] : {std::pair<const char*, bool*>{"add_special", &eo.add_special},
                             {"parse_special", &eo.parse_special}, {"with_pieces", &with_pieces}}) {
      auto it = body.find(name);
      if (it == body.end() || it->is_null()) continue;
      if (!it->is_boolean()) {
        ApiError e = make_api_error(400, std::string("'") + name + "' must be a boolean");
        e.param = name;
        send_error(res, e);
        return;
      }
      *dst = it->get<bool>();
    }
    const auto ids = tok.encode(content->get<std::string>(), eo);
    OJson out = {{"tokens", ids}};
    if (with_pieces) {
      OJson pieces = OJson::array();
      for (int32_t id : ids) pieces.push_back({{"id", id}, {"piece", tok.token_bytes(id)}});
      out["tokens"] = pieces;
    }
    res.set_content(dump(out), "application/json");
    return;
  }
  // /detokenize
  auto tokens = body.find("tokens");
  std::vector<int32_t> ids;
  bool ok = tokens != body.end() && tokens->is_array();
  if (ok)
    for (const Json& t : *tokens) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= tok.n_vocab()) {
        ok = false;
        break;
      }
      ids.push_back(t.get<int32_t>());
    }
  if (!ok) {
    ApiError e = make_api_error(400, "'tokens' must be an array of token ids in [0, " + std::to_string(tok.n_vocab()) + ")");
    e.param = "tokens";
    send_error(res, e);
    return;
  }
  res.set_content(dump(OJson{{"content", tok.decode(ids)}}), "application/json");
}

}  // namespace kite::tools::server

// POST /v1/chat/completions and /v1/completions: parse, submit to the engine, then either
// collect the whole answer or stream it as Server-Sent Events.
#include <algorithm>
#include <ctime>

#include "tools/server/http.h"

namespace kite::tools::server {
namespace {

struct Choice {
  std::string text;
  std::string reason;  // empty until finished
  std::string error;
  int64_t text_bytes = 0;  // text produced so far (completions logprobs text_offset)
  OJson chat_logprobs = OJson::array();
  OJson tokens = OJson::array(), token_logprobs = OJson::array(), top_logprobs = OJson::array(),
        text_offset = OJson::array();
  bool started = false;  // stream: the first chunk went out
};

const char* finish_name(FinishReason r) {
  switch (r) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kError: return "error";
    default: return "length";  // length, or cut short (timeout, shutdown)
  }
}

// Everything a response needs besides the choices; shared by both modes.
struct Job {
  const HandlerContext* hc = nullptr;
  ParsedRequest req;
  std::shared_ptr<RequestStream> stream;
  std::vector<uint64_t> ids;
  std::string id, model, fingerprint;
  int64_t created = 0;
  Clock::time_point deadline;
  bool cancelled = false;
  std::optional<ClientConnection> client;  // set by the handler: noticing a client that left
  Clock::time_point last_write = Clock::now();
  std::vector<Choice> choices;
  std::shared_ptr<ScoreJob> score;  // completions with echo and logprobs: the prompts' logprobs
  bool score_timed_out = false;
  size_t prefix_bytes(size_t choice) const {
    return req.echo ? req.prompt_texts[choice / static_cast<size_t>(req.gen.n)].size() : 0;
  }

  // Applies one event to its choice; returns the choice index.
  size_t apply(const PartEvent& pe, OJson* lp_delta) {
    const StreamEvent& e = pe.event;
    const size_t c = static_cast<size_t>(pe.part) * static_cast<size_t>(req.gen.n) + static_cast<size_t>(e.choice);
    Choice& ch = choices[c];
    if (e.token >= 0 && req.logprobs >= 0) {
      const Tokenizer& tok = hc->engine->tokenizer();
      if (req.endpoint == Endpoint::kChat) {
        OJson entry = chat_logprob_entry(tok, e, req.logprobs);
        ch.chat_logprobs.push_back(entry);
        if (lp_delta) (*lp_delta)["content"] = OJson::array({entry});
      } else {
        const std::string t = tok.token_bytes(e.token);
        OJson top = OJson::object();
        for (int32_t i = 0; i < req.logprobs && i < static_cast<int32_t>(e.top_logprobs.size()); ++i)
          top[tok.token_bytes(e.top_logprobs[i].token)] = e.top_logprobs[i].logprob;
        const int64_t off = static_cast<int64_t>(prefix_bytes(c)) + ch.text_bytes;
        ch.tokens.push_back(t);
        ch.token_logprobs.push_back(e.logprob);
        ch.top_logprobs.push_back(top);
        ch.text_offset.push_back(off);
        if (lp_delta)
          *lp_delta = {{"tokens", {t}}, {"token_logprobs", {e.logprob}}, {"top_logprobs", {top}}, {"text_offset", {off}}};
      }
    }
    ch.text += e.text;
    ch.text_bytes += static_cast<int64_t>(e.text.size());
    if (e.finished) {
      ch.reason = finish_name(e.reason);
      ch.error = e.error;
    }
    return c;
  }

  void check_deadline() {
    if (!cancelled && Clock::now() > deadline) {
      hc->engine->cancel(ids);
      if (score && !score->wait_until(Clock::now())) {
        score->cancel();
        score_timed_out = true;
      }
      cancelled = true;
    }
  }

  // Waits up to `wait` for the prompts' logprobs; true when they are there (or not asked for).
  bool score_ready(std::chrono::milliseconds wait) const { return !score || score->wait_until(Clock::now() + wait); }
  // Once score_ready(): the error that stopped the scoring, if any.
  std::optional<ApiError> score_error() const {
    if (!score || !score->error()) return std::nullopt;
    if (score_timed_out)
      return ApiError{503, "the request took longer than the server's timeout", "server_unavailable_error", "",
                      "timeout"};
    return engine_error(*score->error(), "prompt");
  }

  // Completions with echo and logprobs: the echoed prompt's tokens with their logprobs (null for
  // a first token, which nothing precedes), top candidates and offsets, ahead of the generated ones.
  OJson prompt_logprobs(size_t part) const {
    const Tokenizer& tok = hc->engine->tokenizer();
    const std::vector<int32_t>& ids = req.prompts[part];
    const std::vector<PositionLogprobs>& scored = score->results()[part];
    const int64_t text_bytes = static_cast<int64_t>(req.prompt_texts[part].size());
    OJson tokens = OJson::array(), logprobs = OJson::array(), tops = OJson::array(), offsets = OJson::array();
    int64_t off = 0;
    for (size_t i = req.echo_begin[part]; i < req.echo_end[part]; ++i) {
      const std::string t = tok.token_bytes(ids[i]);
      tokens.push_back(t);
      offsets.push_back(std::min(off, text_bytes));
      off += static_cast<int64_t>(t.size());
      if (i == 0) {
        logprobs.push_back(nullptr);
        tops.push_back(nullptr);
        continue;
      }
      logprobs.push_back(scored[i].logprob);
      OJson top = OJson::object();
      for (const TokenLogprob& c : scored[i].top) top[tok.token_bytes(c.token)] = c.logprob;
      tops.push_back(top);
    }
    return {{"tokens", tokens}, {"token_logprobs", logprobs}, {"top_logprobs", tops}, {"text_offset", offsets}};
  }

  // The client closed its connection: nobody will read the answer, so the generation stops and
  // its KV blocks go back to the pool.
  bool client_gone() const { return client && !client->alive(); }
  void abandon() {
    hc->engine->cancel(ids);
    if (score) score->cancel();
    hc->metrics->count_cancelled();
  }

  OJson usage_json() const {
    const Usage u = stream->usage();
    return {{"prompt_tokens", u.prompt_tokens},
            {"completion_tokens", u.completion_tokens},
            {"total_tokens", u.prompt_tokens + u.completion_tokens},
            {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
  }

  OJson envelope(const char* object) const {
    return {{"id", id}, {"object", object}, {"created", created}, {"model", model}, {"system_fingerprint", fingerprint}};
  }

  // Chat: the message of a finished choice (tool calls parsed when tools were offered).
  OJson chat_message(const Choice& ch, std::string* reason) const {
    OJson msg = {{"role", "assistant"}, {"content", ch.text}};
    if (req.parse_tools) {
      ParsedToolCalls parsed = parse_tool_calls(ch.text, req.tool_names);
      if (!parsed.calls.empty()) {
        OJson calls = OJson::array();
        for (size_t i = 0; i < parsed.calls.size(); ++i)
          calls.push_back({{"id", id + "-call-" + std::to_string(i)},
                           {"type", "function"},
                           {"function", {{"name", parsed.calls[i].name}, {"arguments", parsed.calls[i].arguments}}}});
        msg["content"] = parsed.content.empty() ? OJson() : OJson(parsed.content);
        msg["tool_calls"] = calls;
        *reason = "tool_calls";
      }
    }
    return msg;
  }
};

void respond_whole(std::shared_ptr<Job> job, httplib::Response& res) {
  std::vector<PartEvent> evs;
  for (;;) {
    evs.clear();
    const bool done = job->stream->drain(&evs, std::chrono::milliseconds(100));
    for (const auto& e : evs) job->apply(e, nullptr);
    if (done && job->score_ready(std::chrono::milliseconds(100))) break;
    if (job->client_gone()) {
      job->abandon();
      send_error(res, ApiError{kClientClosedRequest, "the client closed the connection", "invalid_request_error", "",
                               "client_closed_request"});
      return;
    }
    job->check_deadline();
  }
  if (auto e = job->score_error()) {
    send_error(res, *e);
    return;
  }
  for (const Choice& ch : job->choices)
    if (!ch.error.empty()) {
      ApiError e;
      e.status = 500;
      e.type = "server_error";
      e.message = "generation failed: " + ch.error;
      send_error(res, e);
      return;
    }
  const bool chat = job->req.endpoint == Endpoint::kChat;
  OJson out = job->envelope(chat ? "chat.completion" : "text_completion");
  OJson choices = OJson::array();
  for (size_t i = 0; i < job->choices.size(); ++i) {
    const Choice& ch = job->choices[i];
    std::string reason = ch.reason;
    if (chat) {
      OJson c = {{"index", i}};
      c["message"] = job->chat_message(ch, &reason);
      c["logprobs"] = job->req.logprobs >= 0 ? OJson{{"content", ch.chat_logprobs}} : OJson();
      c["finish_reason"] = reason;
      choices.push_back(c);
    } else {
      const std::string text =
          (job->req.echo ? job->req.prompt_texts[i / static_cast<size_t>(job->req.gen.n)] : std::string()) + ch.text;
      OJson lp;
      if (job->req.logprobs >= 0) {
        lp = {{"tokens", ch.tokens}, {"token_logprobs", ch.token_logprobs}, {"top_logprobs", ch.top_logprobs},
              {"text_offset", ch.text_offset}};
        if (job->score) {  // the echoed prompt's entries come first
          OJson all = job->prompt_logprobs(i / static_cast<size_t>(job->req.gen.n));
          for (auto it = all.begin(); it != all.end(); ++it)
            for (const auto& v : lp[it.key()]) it.value().push_back(v);
          lp = std::move(all);
        }
      }
      choices.push_back({{"index", i}, {"text", text}, {"logprobs", lp}, {"finish_reason", reason}});
    }
  }
  out["choices"] = choices;
  out["usage"] = job->usage_json();
  res.set_content(dump(out), "application/json");
}

bool write_event(httplib::DataSink& sink, const std::string& data) {
  const std::string line = "data: " + data + "\n\n";
  return sink.write(line.data(), line.size());
}

// One provider call: waits briefly for events and writes them as chunks. false: the client is gone.
bool stream_step(Job& job, httplib::DataSink& sink) {
  if (job.client_gone()) return false;  // noticed without waiting for a failed write
  std::vector<PartEvent> evs;
  bool done = false;
  // The echo chunk carries the prompt's logprobs: events wait in the stream until they are there.
  if (job.score_ready(std::chrono::milliseconds(200))) {
    if (auto e = job.score_error()) {
      job.hc->engine->cancel(job.ids);
      OJson err = {{"error", {{"message", e->message}, {"type", e->type}, {"code", e->code}}}};
      if (!write_event(sink, dump(err)) || !write_event(sink, "[DONE]")) return false;
      sink.done();
      return true;
    }
    done = job.stream->drain(&evs, std::chrono::milliseconds(200));
  }
  const bool chat = job.req.endpoint == Endpoint::kChat;
  for (const auto& pe : evs) {
    OJson lp;
    const size_t c = job.apply(pe, job.req.logprobs >= 0 ? &lp : nullptr);
    Choice& ch = job.choices[c];
    const StreamEvent& e = pe.event;
    const bool hold = chat && job.req.parse_tools;  // tool calls: the message is sent whole at the end
    std::vector<OJson> chunks;
    auto chunk = [&](OJson delta_or_text, OJson finish, OJson logprobs) {
      OJson out = job.envelope(chat ? "chat.completion.chunk" : "text_completion");
      OJson choice = {{"index", c}};
      if (chat) choice["delta"] = std::move(delta_or_text);
      else choice["text"] = std::move(delta_or_text);
      choice["logprobs"] = std::move(logprobs);
      choice["finish_reason"] = std::move(finish);
      out["choices"] = OJson::array({choice});
      if (job.req.include_usage) out["usage"] = nullptr;
      chunks.push_back(std::move(out));
    };
    if (!ch.started) {
      ch.started = true;
      if (chat) chunk(OJson{{"role", "assistant"}, {"content", ""}}, nullptr, nullptr);
      else if (job.req.echo)
        chunk(job.req.prompt_texts[c / static_cast<size_t>(job.req.gen.n)], nullptr,
              job.score ? job.prompt_logprobs(c / static_cast<size_t>(job.req.gen.n)) : OJson());
    }
    if (!hold && (!e.text.empty() || !lp.is_null())) {
      if (chat) chunk(OJson{{"content", e.text}}, nullptr, lp);
      else chunk(e.text, nullptr, lp);
    }
    if (e.finished) {
      if (!e.error.empty()) {
        OJson err = {{"error", {{"message", "generation failed: " + e.error}, {"type", "server_error"}}}};
        chunks.push_back(err);
      }
      std::string reason = ch.reason;
      if (hold) {
        OJson msg = job.chat_message(ch, &reason);
        OJson delta = OJson::object();
        if (msg.contains("tool_calls")) {
          OJson calls = msg["tool_calls"];
          for (size_t i = 0; i < calls.size(); ++i) calls[i]["index"] = i;
          delta["tool_calls"] = calls;
        }
        if (!msg["content"].is_null()) delta["content"] = msg["content"];
        chunk(delta, nullptr, nullptr);
      }
      if (chat) chunk(OJson::object(), reason, nullptr);
      else chunk("", reason, nullptr);
    }
    for (const auto& j : chunks)
      if (!write_event(sink, dump(j))) return false;
  }
  if (done) {
    if (job.req.include_usage) {
      OJson out = job.envelope(chat ? "chat.completion.chunk" : "text_completion");
      out["choices"] = OJson::array();
      out["usage"] = job.usage_json();
      if (!write_event(sink, dump(out))) return false;
    }
    if (!write_event(sink, "[DONE]")) return false;
    sink.done();
    return true;
  }
  job.check_deadline();
  // Nothing sent for a while (queued, or a long prefill): an SSE comment, which clients ignore,
  // finds out whether the client is still there.
  const auto now = Clock::now();
  if (!evs.empty()) {
    job.last_write = now;
  } else if (now - job.last_write > std::chrono::seconds(2)) {
    job.last_write = now;
    static const char kPing[] = ": ping\n\n";
    if (!sink.write(kPing, sizeof kPing - 1)) return false;
  }
  return true;
}

// max_tokens 0 with echo: nothing is generated; each choice ends at once with "length" (as a
// request cut short by max_tokens does), through the same stream a generation would fill.
void echo_only(Job& job) {
  for (size_t part = 0; part < job.req.prompts.size(); ++part) {
    for (int32_t c = 0; c < job.req.gen.n; ++c) {
      StreamEvent e;
      e.choice = c;
      e.finished = true;
      e.reason = FinishReason::kLength;
      job.stream->on_event(static_cast<int32_t>(part), e);
    }
    Usage u;
    u.prompt_tokens = static_cast<int64_t>(job.req.prompts[part].size());
    job.stream->on_done(static_cast<int32_t>(part), u);
  }
}

}  // namespace

void handle_generate(const HandlerContext& hc, Endpoint endpoint, const httplib::Request& req, httplib::Response& res) {
  Engine& engine = *hc.engine;
  Json body;
  if (!begin_model_request(hc, req, res, &body)) return;
  ModelInfo info;
  info.tokenizer = &engine.tokenizer();
  info.chat_template = &engine.chat_template();
  info.model_id = engine.model_id();
  info.n_ctx = engine.n_ctx();
  info.max_n = engine.parallel();
  auto job = std::make_shared<Job>();
  job->hc = &hc;
  if (auto e = parse_request(body, endpoint, info, &job->req)) {
    send_error(res, *e);
    return;
  }
  const size_t n_parts = job->req.prompts.size();
  job->stream = std::make_shared<RequestStream>(static_cast<int32_t>(n_parts), hc.metrics);
  job->choices.resize(n_parts * static_cast<size_t>(job->req.gen.n));
  if (job->req.score_only) {
    // Nothing goes through the scheduler, whose admission would refuse an over-long prompt: the
    // same answer here, before any part of a streamed response is sent.
    for (size_t i = 0; i < n_parts; ++i)
      if (static_cast<int64_t>(job->req.prompts[i].size()) > engine.n_ctx()) {
        ApiError e{400,
                   "prompt " + std::to_string(i) + " has " + std::to_string(job->req.prompts[i].size()) +
                       " tokens, more than the context's " + std::to_string(engine.n_ctx()),
                   "invalid_request_error", "prompt", "context_length_exceeded"};
        send_error(res, e);
        return;
      }
    echo_only(*job);
  } else {
    auto ids = engine.submit(job->req.prompts, job->req.gen, job->stream);
    if (!ids) {
      send_error(res, engine_error(ids.error(), endpoint == Endpoint::kChat ? "messages" : "prompt"));
      return;
    }
    job->ids = std::move(*ids);
  }
  if (job->req.echo && job->req.logprobs >= 0) {
    job->score = std::make_shared<ScoreJob>(job->req.prompts, job->req.logprobs);
    if (auto st = engine.submit_aux(job->score); !st) {
      engine.cancel(job->ids);
      send_error(res, engine_error(st.error(), "prompt"));
      return;
    }
  }
  job->id = std::string(endpoint == Endpoint::kChat ? "chatcmpl-" : "cmpl-") + res.get_header_value("X-Request-Id");
  job->model = engine.model_id();
  job->fingerprint = engine.fingerprint();
  job->created = static_cast<int64_t>(std::time(nullptr));
  job->deadline = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(hc.timeout_s * 1000));
  job->client.emplace(req);
  if (!job->req.stream) {
    respond_whole(job, res);
    return;
  }
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      "text/event-stream",
      [job](size_t, httplib::DataSink& sink) {
        if (stream_step(*job, sink)) return true;
        job->abandon();  // the client went away: free its KV blocks
        return false;
      },
      [job](bool success) {
        if (!success) job->hc->engine->cancel(job->ids);
      });
}

}  // namespace kite::tools::server

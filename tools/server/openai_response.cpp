// Response pieces shared by the handlers (see openai.h).
#include <algorithm>

#include "tools/server/openai.h"

namespace kite::tools::server {

std::string dump(const OJson& j) { return j.dump(-1, ' ', false, OJson::error_handler_t::replace); }
std::string dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

ApiError engine_error(const Error& e, std::string_view input_param, std::string_view invalid_param) {
  ApiError a;
  a.message = e.message;
  switch (e.code) {
    case ErrorCode::kBusy:
      a.status = 429;
      a.type = "rate_limit_error";
      a.code = "queue_full";
      break;
    case ErrorCode::kTooLarge:
      a.status = 400;
      a.code = "context_length_exceeded";
      a.param = input_param;
      break;
    case ErrorCode::kInvalidArgument:
      a.status = 400;
      a.param = invalid_param;
      break;
    default:
      a.status = 500;
      a.type = "server_error";
  }
  return a;
}

std::string error_body(const ApiError& e) {
  OJson err = {{"message", e.message},
               {"type", e.type},
               {"param", e.param.empty() ? OJson() : OJson(e.param)},
               {"code", e.code.empty() ? OJson() : OJson(e.code)}};
  return dump(OJson{{"error", err}});
}

namespace {

OJson bytes_of(const std::string& s) {
  OJson b = OJson::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}

}  // namespace

OJson chat_logprob_entry(const Tokenizer& tok, const StreamEvent& e, int32_t n_top) {
  const std::string text = tok.token_bytes(e.token);
  OJson top = OJson::array();
  for (int32_t i = 0; i < n_top && i < static_cast<int32_t>(e.top_logprobs.size()); ++i) {
    const std::string t = tok.token_bytes(e.top_logprobs[i].token);
    top.push_back({{"token", t}, {"logprob", e.top_logprobs[i].logprob}, {"bytes", bytes_of(t)}});
  }
  return {{"token", text}, {"logprob", e.logprob}, {"bytes", bytes_of(text)}, {"top_logprobs", top}};
}

namespace {

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return {};
  const size_t e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

// {"name": ..., "arguments"|"parameters": {...}} -> a call; nullopt when it is not one.
std::optional<ToolCall> as_call(const Json& j) {
  if (!j.is_object()) return std::nullopt;
  auto name = j.find("name");
  if (name == j.end() || !name->is_string()) return std::nullopt;
  ToolCall c;
  c.name = name->get<std::string>();
  auto args = j.find("arguments");
  if (args == j.end()) args = j.find("parameters");
  if (args == j.end()) c.arguments = "{}";
  else c.arguments = args->is_string() ? args->get<std::string>() : dump(*args);
  return c;
}

}  // namespace

ParsedToolCalls parse_tool_calls(const std::string& text, const std::vector<std::string>& tool_names) {
  ParsedToolCalls out;
  static const std::string kOpen = "<tool_call>", kClose = "</tool_call>";
  size_t pos = 0;
  std::string rest;
  bool any = false;
  while (true) {
    const size_t open = text.find(kOpen, pos);
    if (open == std::string::npos) break;
    const size_t body = open + kOpen.size();
    size_t close = text.find(kClose, body);
    const size_t end = close == std::string::npos ? text.size() : close;
    auto j = Json::parse(text.substr(body, end - body), nullptr, false);
    auto call = j.is_discarded() ? std::nullopt : as_call(j);
    if (!call) break;  // not a call: leave the rest as text
    rest += text.substr(pos, open - pos);
    out.calls.push_back(std::move(*call));
    any = true;
    pos = close == std::string::npos ? text.size() : close + kClose.size();
  }
  if (any) {
    rest += text.substr(pos);
    out.content = trim(rest);
    return out;
  }
  // llama-3 style: the whole output is one JSON call to an offered tool.
  const std::string t = trim(text);
  if (!t.empty() && t.front() == '{') {
    auto j = Json::parse(t, nullptr, false);
    if (!j.is_discarded())
      if (auto call = as_call(j);
          call && std::find(tool_names.begin(), tool_names.end(), call->name) != tool_names.end()) {
        out.calls.push_back(std::move(*call));
        return out;
      }
  }
  out.content = text;
  return out;
}

}  // namespace kite::tools::server

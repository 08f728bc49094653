// kite/tools/server/openai.h — OpenAI's request and response shapes: parsing and validating a
// request body into GenerationParams and prompt tokens, and writing responses, stream chunks
// and errors.
//
// Every client mistake becomes an ApiError with a 4xx status, OpenAI's error type and the name
// of the offending field in `param` ("temperature", "messages[2].content", "stop"), never an
// exception or a 500.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "src/runtime/chat_template.h"
#include "src/runtime/embed.h"
#include "src/runtime/scheduler.h"

namespace kite::tools::server {

using Json = nlohmann::json;
using OJson = nlohmann::ordered_json;

struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // empty: null
  std::string code;   // empty: null
};

// OpenAI's error body: {"error": {"message", "type", "param", "code"}}.
std::string error_body(const ApiError& e);

// The HTTP answer to an engine error (a refused submit or a failed job): kBusy is 429
// queue_full, kTooLarge 400 context_length_exceeded naming `input_param`, kInvalidArgument 400
// (naming `invalid_param` when given), anything else 500.
ApiError engine_error(const Error& e, std::string_view input_param, std::string_view invalid_param = {});

enum class Endpoint { kChat, kCompletions };

// What a request asks for, ready for the engine.
struct ParsedRequest {
  Endpoint endpoint = Endpoint::kChat;
  std::string model;
  bool stream = false;
  bool include_usage = false;
  std::vector<std::vector<int32_t>> prompts;  // one per prompt (chat: exactly one)
  std::vector<std::string> prompt_texts;      // for echo
  // For echo with logprobs: prompts[i][echo_begin[i], echo_end[i]) are the tokens of
  // prompt_texts[i] (a BOS or EOS that the tokenizer added is not part of the echoed text).
  std::vector<size_t> echo_begin, echo_end;
  GenerationParams gen;
  bool echo = false;
  // Completions with echo and max_tokens 0: the prompt is echoed (and scored), nothing generated.
  bool score_only = false;
  int32_t logprobs = -1;                      // top logprobs per token to report; -1: no logprobs
  std::vector<std::string> tool_names;        // tools offered (tool calls are parsed from the output)
  bool parse_tools = false;
};

// What the parser needs to know about the server and its model.
struct ModelInfo {
  const Tokenizer* tokenizer = nullptr;
  const ChatTemplate* chat_template = nullptr;
  std::string model_id;
  int64_t n_ctx = 0;
  int32_t max_n = 1;   // sequence slots: n may not exceed them
  int64_t n_embd = 0;  // embeddings: the vector length
};

// Parses a /v1/chat/completions or /v1/completions body.
std::optional<ApiError> parse_request(const Json& body, Endpoint endpoint, const ModelInfo& info, ParsedRequest* out);

// A /v1/embeddings body, validated: one token list per input (strings tokenized with the
// model's BOS; token-id inputs used as given), each non-empty and within the context.
struct EmbeddingRequest {
  std::vector<std::vector<int32_t>> inputs;
  bool base64 = false;               // encoding_format "base64": little-endian float32, base64
  Pooling pooling = Pooling::kMean;  // kite extension: "pooling": "mean" | "last" | "cls"
  int64_t tokens = 0;                // over all inputs (usage)
};
std::optional<ApiError> parse_embedding_request(const Json& body, const ModelInfo& info, EmbeddingRequest* out);

// The OpenAI logprobs entry of one token: {"token", "logprob", "bytes", "top_logprobs"} (chat).
OJson chat_logprob_entry(const Tokenizer& tok, const StreamEvent& e, int32_t n_top);

// Tool calls found in a model's output (Hermes/Qwen `<tool_call>{json}</tool_call>` blocks, or a
// whole output that is one llama-3 style {"name": ..., "parameters"|"arguments": ...} object for
// an offered tool). `content` is the text outside the calls (empty when none).
struct ToolCall {
  std::string name;
  std::string arguments;  // a JSON text
};
struct ParsedToolCalls {
  std::string content;
  std::vector<ToolCall> calls;
};
ParsedToolCalls parse_tool_calls(const std::string& text, const std::vector<std::string>& tool_names);

// Dumps JSON for the wire (invalid UTF-8 from a model becomes U+FFFD instead of throwing).
std::string dump(const OJson& j);
std::string dump(const Json& j);

}  // namespace kite::tools::server

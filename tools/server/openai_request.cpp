// Parsing and validating OpenAI request bodies (see openai.h).
#include <algorithm>
#include <cmath>
#include <random>

#include "src/runtime/grammar/grammar.h"
#include "src/runtime/stop_matcher.h"
#include "tools/server/openai.h"

namespace kite::tools::server {
namespace {

constexpr size_t kMaxStops = 16;
constexpr size_t kMaxPrompts = 64;
constexpr size_t kMaxEmbeddingInputs = 2048;  // OpenAI's limit per request
constexpr size_t kMaxMessages = 4096;
constexpr size_t kMaxLogitBias = 1024;
constexpr int32_t kMaxTopLogprobsChat = 20;
constexpr int32_t kMaxLogprobsCompletions = 5;

ApiError bad(const std::string& param, const std::string& message) {
  ApiError e;
  e.param = param;
  e.message = message;
  return e;
}

const char* type_name(const Json& v) {
  switch (v.type()) {
    case Json::value_t::null: return "null";
    case Json::value_t::boolean: return "a boolean";
    case Json::value_t::string: return "a string";
    case Json::value_t::array: return "an array";
    case Json::value_t::object: return "an object";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned: return "an integer";
    case Json::value_t::number_float: return "a number";
    default: return "an unknown type";
  }
}

// The field, or nullptr when absent or null (OpenAI treats null as "not given").
const Json* field(const Json& body, const char* name) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<ApiError> get_number(const Json& body, const char* name, double lo, double hi, float* out) {
  const Json* v = field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_number()) return bad(name, std::string("'") + name + "' must be a number, got " + type_name(*v));
  const double d = v->get<double>();
  if (!(d >= lo && d <= hi))
    return bad(name, std::string("'") + name + "' must be between " + std::to_string(lo).substr(0, 6) + " and " +
                         std::to_string(hi).substr(0, 6) + ", got " + v->dump());
  *out = static_cast<float>(d);
  return std::nullopt;
}

std::optional<ApiError> get_int(const Json& body, const char* name, int64_t lo, int64_t hi, int64_t* out) {
  const Json* v = field(body, name);
  if (!v) return std::nullopt;
  if (v->is_number_float()) {
    const double d = v->get<double>();
    if (d != std::floor(d)) return bad(name, std::string("'") + name + "' must be an integer, got " + v->dump());
  } else if (!v->is_number()) {
    return bad(name, std::string("'") + name + "' must be an integer, got " + type_name(*v));
  }
  const double d = v->get<double>();
  if (!(d >= static_cast<double>(lo) && d <= static_cast<double>(hi)))
    return bad(name, std::string("'") + name + "' must be between " + std::to_string(lo) + " and " +
                         std::to_string(hi) + ", got " + v->dump());
  *out = v->is_number_unsigned() ? static_cast<int64_t>(v->get<uint64_t>())
                                 : (v->is_number_integer() ? v->get<int64_t>() : static_cast<int64_t>(d));
  return std::nullopt;
}

std::optional<ApiError> get_bool(const Json& body, const char* name, bool* out) {
  const Json* v = field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) return bad(name, std::string("'") + name + "' must be a boolean, got " + type_name(*v));
  *out = v->get<bool>();
  return std::nullopt;
}

#define KITE_API_TRY(expr)              \
  do {                                  \
    if (auto e_ = (expr); e_) return e_; \
  } while (0)

std::optional<ApiError> parse_stop(const Json& body, GenerationParams* gen) {
  const Json* v = field(body, "stop");
  if (!v) return std::nullopt;
  std::vector<std::string> stops;
  if (v->is_string()) {
    stops.push_back(v->get<std::string>());
  } else if (v->is_array()) {
    if (v->size() > kMaxStops)
      return bad("stop", "'stop' may hold at most " + std::to_string(kMaxStops) + " strings, got " +
                             std::to_string(v->size()));
    for (size_t i = 0; i < v->size(); ++i) {
      if (!(*v)[i].is_string())
        return bad("stop", "'stop[" + std::to_string(i) + "]' must be a string, got " + type_name((*v)[i]));
      stops.push_back((*v)[i].get<std::string>());
    }
  } else {
    return bad("stop", std::string("'stop' must be a string or an array of strings, got ") + type_name(*v));
  }
  if (auto st = StopMatcher::validate(stops); !st) return bad("stop", "'stop': " + st.error().message);
  gen->stop = std::move(stops);
  return std::nullopt;
}

std::optional<ApiError> parse_logit_bias(const Json& body, int32_t n_vocab, SamplerParams* sp) {
  const Json* v = field(body, "logit_bias");
  if (!v) return std::nullopt;
  if (!v->is_object()) return bad("logit_bias", std::string("'logit_bias' must be an object, got ") + type_name(*v));
  if (v->size() > kMaxLogitBias)
    return bad("logit_bias", "'logit_bias' may hold at most " + std::to_string(kMaxLogitBias) + " entries");
  for (auto it = v->begin(); it != v->end(); ++it) {
    const std::string& key = it.key();
    size_t used = 0;
    long long id = -1;
    try {
      id = std::stoll(key, &used);
    } catch (...) {
      used = 0;
    }
    if (used != key.size() || key.empty() || id < 0 || id >= n_vocab)
      return bad("logit_bias", "'logit_bias' key '" + key + "' is not a token id in [0, " + std::to_string(n_vocab) + ")");
    if (!it->is_number())
      return bad("logit_bias", "'logit_bias[" + key + "]' must be a number, got " + type_name(*it));
    const double b = it->get<double>();
    if (!(b >= -100 && b <= 100))
      return bad("logit_bias", "'logit_bias[" + key + "]' must be between -100 and 100, got " + it->dump());
    sp->logit_bias.push_back({static_cast<int32_t>(id), b <= -100 ? -INFINITY : static_cast<float>(b)});
  }
  return std::nullopt;
}

std::optional<ApiError> parse_response_format(const Json& body, GenerationParams* gen) {
  const Json* v = field(body, "response_format");
  if (!v) return std::nullopt;
  if (!v->is_object())
    return bad("response_format", std::string("'response_format' must be an object, got ") + type_name(*v));
  const Json* type = field(*v, "type");
  if (!type || !type->is_string())
    return bad("response_format.type", "'response_format.type' must be one of 'text', 'json_object', 'json_schema'");
  const std::string t = type->get<std::string>();
  if (t == "text") return std::nullopt;
  if (t == "json_object") {
    gen->grammar = Grammar::json_any();
    return std::nullopt;
  }
  if (t != "json_schema")
    return bad("response_format.type",
               "'response_format.type' must be one of 'text', 'json_object', 'json_schema', got '" + t + "'");
  const Json* js = field(*v, "json_schema");
  if (!js || !js->is_object())
    return bad("response_format.json_schema", "'response_format.json_schema' must be an object");
  const Json* schema = field(*js, "schema");
  if (!schema) return bad("response_format.json_schema.schema", "'response_format.json_schema.schema' is required");
  if (!schema->is_object() && !schema->is_boolean())
    return bad("response_format.json_schema.schema", "'response_format.json_schema.schema' must be an object");
  auto g = Grammar::from_json_schema(schema->dump());
  if (!g) return bad("response_format.json_schema.schema", "'response_format.json_schema.schema': " + g.error().message);
  gen->grammar = *g;
  return std::nullopt;
}

// Sampling fields shared by both endpoints.
// `allow_zero_tokens`: max_tokens 0 is accepted (completions with echo: only the prompt comes
// back, scored); *zero_tokens says whether it was asked for.
std::optional<ApiError> parse_sampling(const Json& body, const ModelInfo& info, bool allow_zero_tokens,
                                       GenerationParams* gen, bool* zero_tokens) {
  SamplerParams& sp = gen->sampling;
  // OpenAI's defaults: temperature 1, no truncation.
  sp.temperature = 1.0f;
  sp.top_p = 1.0f;
  sp.top_k = 0;
  sp.min_p = 0.0f;
  sp.penalty_last_n = -1;
  KITE_API_TRY(get_number(body, "temperature", 0, 2, &sp.temperature));
  KITE_API_TRY(get_number(body, "top_p", 0, 1, &sp.top_p));
  KITE_API_TRY(get_number(body, "min_p", 0, 1, &sp.min_p));
  KITE_API_TRY(get_number(body, "typical_p", 0, 1, &sp.typical_p));
  KITE_API_TRY(get_number(body, "presence_penalty", -2, 2, &sp.presence_penalty));
  KITE_API_TRY(get_number(body, "frequency_penalty", -2, 2, &sp.frequency_penalty));
  KITE_API_TRY(get_number(body, "repetition_penalty", 0.01, 10, &sp.repeat_penalty));
  int64_t v = 0;
  KITE_API_TRY(get_int(body, "top_k", 0, info.tokenizer->n_vocab(), &v));
  if (field(body, "top_k")) sp.top_k = static_cast<int32_t>(v);
  if (field(body, "seed")) {
    KITE_API_TRY(get_int(body, "seed", INT64_MIN, INT64_MAX, &v));
    sp.seed = static_cast<uint64_t>(v);
  } else {
    sp.seed = std::random_device{}() * 0x9E3779B97F4A7C15ull ^ std::random_device{}();
  }
  // max_completion_tokens wins over the older max_tokens.
  for (const char* name : {"max_tokens", "max_completion_tokens"}) {
    if (!field(body, name)) continue;
    KITE_API_TRY(get_int(body, name, allow_zero_tokens ? 0 : 1, info.n_ctx, &v));
    gen->max_tokens = static_cast<int32_t>(v);
    *zero_tokens = v == 0;
  }
  KITE_API_TRY(get_int(body, "n", 1, info.max_n, &v));
  if (field(body, "n")) gen->n = static_cast<int32_t>(v);
  KITE_API_TRY(get_bool(body, "ignore_eos", &gen->ignore_eos));
  KITE_API_TRY(parse_stop(body, gen));
  KITE_API_TRY(parse_logit_bias(body, info.tokenizer->n_vocab(), &sp));
  KITE_API_TRY(parse_response_format(body, gen));
  if (auto st = Sampler::validate(sp, info.tokenizer->n_vocab()); !st) return bad("", st.error().message);
  return std::nullopt;
}

// Message content: a string, or an array of {"type": "text", "text": ...} parts.
std::optional<ApiError> content_text(const Json& content, const std::string& where, std::string* out) {
  if (content.is_string()) {
    *out = content.get<std::string>();
    return std::nullopt;
  }
  if (!content.is_array())
    return bad(where, "'" + where + "' must be a string or an array of content parts, got " + type_name(content));
  out->clear();
  for (size_t i = 0; i < content.size(); ++i) {
    const Json& part = content[i];
    const std::string pw = where + "[" + std::to_string(i) + "]";
    if (!part.is_object()) return bad(pw, "'" + pw + "' must be an object");
    const Json* type = field(part, "type");
    if (!type || !type->is_string() || type->get<std::string>() != "text")
      return bad(pw + ".type", "'" + pw + ".type' must be 'text' (this server reads text only)");
    const Json* text = field(part, "text");
    if (!text || !text->is_string()) return bad(pw + ".text", "'" + pw + ".text' must be a string");
    *out += text->get<std::string>();
  }
  return std::nullopt;
}

std::optional<ApiError> parse_messages(const Json& body, OJson* messages) {
  const Json* v = field(body, "messages");
  if (!v) return bad("messages", "'messages' is required");
  if (!v->is_array()) return bad("messages", std::string("'messages' must be an array, got ") + type_name(*v));
  if (v->empty()) return bad("messages", "'messages' must hold at least one message");
  if (v->size() > kMaxMessages) return bad("messages", "'messages' holds more than " + std::to_string(kMaxMessages));
  *messages = OJson::array();
  for (size_t i = 0; i < v->size(); ++i) {
    const Json& m = (*v)[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) return bad(where, "'" + where + "' must be an object, got " + type_name(m));
    const Json* role = field(m, "role");
    if (!role || !role->is_string()) return bad(where + ".role", "'" + where + ".role' must be a string");
    std::string r = role->get<std::string>();
    if (r == "developer") r = "system";
    if (r != "system" && r != "user" && r != "assistant" && r != "tool")
      return bad(where + ".role", "'" + where + ".role' must be one of system, developer, user, assistant, tool; got '" +
                                      role->get<std::string>() + "'");
    OJson out = {{"role", r}};
    const Json* content = field(m, "content");
    const Json* calls = field(m, "tool_calls");
    if (!content && !(r == "assistant" && calls))
      return bad(where + ".content", "'" + where + ".content' is required");
    std::string text;
    if (content) KITE_API_TRY(content_text(*content, where + ".content", &text));
    out["content"] = text;
    if (calls) {
      if (!calls->is_array()) return bad(where + ".tool_calls", "'" + where + ".tool_calls' must be an array");
      OJson list = OJson::array();
      for (const Json& c : *calls) {
        OJson call = OJson::parse(c.dump());
        // Templates expect arguments as an object; OpenAI sends a JSON string.
        if (call.contains("function") && call["function"].is_object() && call["function"].contains("arguments") &&
            call["function"]["arguments"].is_string()) {
          auto args = OJson::parse(call["function"]["arguments"].get<std::string>(), nullptr, false);
          if (!args.is_discarded()) call["function"]["arguments"] = args;
        }
        list.push_back(call);
      }
      out["tool_calls"] = list;
    }
    if (const Json* id = field(m, "tool_call_id"); id && id->is_string()) out["tool_call_id"] = id->get<std::string>();
    if (const Json* name = field(m, "name"); name && name->is_string()) out["name"] = name->get<std::string>();
    messages->push_back(std::move(out));
  }
  return std::nullopt;
}

// tool_choice "required" or {"type": "function", "function": {"name": X}}: the output is forced
// (by a grammar) to be one JSON call {"name": ..., "arguments": {...}} of an allowed tool, which
// parse_tool_calls() reads back. A tool whose parameters use schema keywords the grammar
// compiler does not support gets {"type": "object"} arguments instead.
std::optional<ApiError> force_tool_call(const Json& tools, const std::string& only, GenerationParams* gen) {
  auto build = [&](bool loose) -> Result<std::shared_ptr<const Grammar>> {
    Json alts = Json::array();
    for (const Json& t : tools) {
      const Json& fn = t["function"];
      const std::string name = fn["name"].get<std::string>();
      if (!only.empty() && name != only) continue;
      Json args = {{"type", "object"}};
      if (!loose && fn.contains("parameters") && fn["parameters"].is_object()) args = fn["parameters"];
      alts.push_back({{"type", "object"},
                      {"properties", {{"name", {{"const", name}}}, {"arguments", args}}},
                      {"required", {"name", "arguments"}}});
    }
    const Json schema = alts.size() == 1 ? alts[0] : Json{{"anyOf", alts}};
    return Grammar::from_json_schema(schema.dump());
  };
  auto g = build(false);
  if (!g) g = build(true);
  if (!g) return bad("tools", "cannot force a tool call: " + g.error().message);
  gen->grammar = *g;
  return std::nullopt;
}

std::optional<ApiError> parse_tools(const Json& body, OJson* tools, ParsedRequest* out) {
  const Json* v = field(body, "tools");
  if (!v) return std::nullopt;
  if (!v->is_array()) return bad("tools", std::string("'tools' must be an array, got ") + type_name(*v));
  for (size_t i = 0; i < v->size(); ++i) {
    const Json& t = (*v)[i];
    const std::string where = "tools[" + std::to_string(i) + "]";
    const Json* fn = t.is_object() ? field(t, "function") : nullptr;
    const Json* name = fn && fn->is_object() ? field(*fn, "name") : nullptr;
    if (!name || !name->is_string())
      return bad(where, "'" + where + "' must be {\"type\": \"function\", \"function\": {\"name\": ...}}");
    out->tool_names.push_back(name->get<std::string>());
  }
  std::string choice = "auto", only;
  if (const Json* c = field(body, "tool_choice")) {
    if (c->is_string()) {
      choice = c->get<std::string>();
      if (choice != "auto" && choice != "none" && choice != "required")
        return bad("tool_choice", "'tool_choice' must be 'auto', 'none', 'required' or a function object");
    } else if (c->is_object()) {
      const Json* fn = field(*c, "function");
      const Json* name = fn && fn->is_object() ? field(*fn, "name") : nullptr;
      if (!name || !name->is_string())
        return bad("tool_choice", "'tool_choice' must be {\"type\": \"function\", \"function\": {\"name\": ...}}");
      only = name->get<std::string>();
      if (std::find(out->tool_names.begin(), out->tool_names.end(), only) == out->tool_names.end())
        return bad("tool_choice", "'tool_choice' names '" + only + "', which is not in 'tools'");
      choice = "required";
    } else {
      return bad("tool_choice", std::string("'tool_choice' must be a string or an object, got ") + type_name(*c));
    }
  }
  if (choice == "none" || v->empty()) return std::nullopt;
  *tools = OJson::parse(v->dump());
  out->parse_tools = true;
  if (choice == "required") return force_tool_call(*v, only, &out->gen);
  return std::nullopt;
}

std::optional<ApiError> parse_prompts(const Json& body, const Tokenizer& tok, ParsedRequest* out) {
  const Json* v = field(body, "prompt");
  if (!v) return bad("prompt", "'prompt' is required");
  EncodeOptions eo;
  eo.add_special = true;
  eo.parse_special = true;
  auto add_tokens = [&](const Json& arr, const std::string& where) -> std::optional<ApiError> {
    std::vector<int32_t> ids;
    for (const Json& t : arr) {
      if (!t.is_number_integer()) return bad("prompt", "'" + where + "' must hold token ids (integers)");
      const int64_t id = t.get<int64_t>();
      if (id < 0 || id >= tok.n_vocab())
        return bad("prompt", "'" + where + "': token " + std::to_string(id) + " is outside the vocabulary [0, " +
                                 std::to_string(tok.n_vocab()) + ")");
      ids.push_back(static_cast<int32_t>(id));
    }
    out->prompt_texts.push_back(tok.decode(ids));
    out->echo_begin.push_back(0);
    out->echo_end.push_back(ids.size());
    out->prompts.push_back(std::move(ids));
    return std::nullopt;
  };
  auto add_text = [&](const std::string& text) {
    out->prompt_texts.push_back(text);
    out->prompts.push_back(tok.encode(text, eo));
    const auto& ids = out->prompts.back();
    size_t begin = 0, end = ids.size();
    if (tok.add_bos() && end > 0 && ids.front() == tok.bos()) ++begin;
    if (tok.add_eos() && end > begin && ids.back() == tok.eos()) --end;
    out->echo_begin.push_back(begin);
    out->echo_end.push_back(end);
  };
  if (v->is_string()) {
    add_text(v->get<std::string>());
  } else if (v->is_array() && !v->empty() && v->front().is_number()) {
    KITE_API_TRY(add_tokens(*v, "prompt"));
  } else if (v->is_array() && !v->empty()) {
    if (v->size() > kMaxPrompts) return bad("prompt", "'prompt' may hold at most " + std::to_string(kMaxPrompts) + " prompts");
    for (size_t i = 0; i < v->size(); ++i) {
      const Json& p = (*v)[i];
      const std::string where = "prompt[" + std::to_string(i) + "]";
      if (p.is_string()) {
        add_text(p.get<std::string>());
      } else if (p.is_array()) {
        KITE_API_TRY(add_tokens(p, where));
      } else {
        return bad("prompt", "'" + where + "' must be a string or an array of token ids");
      }
    }
  } else {
    return bad("prompt", std::string("'prompt' must be a string, an array of strings or of token ids, got ") +
                             (v->is_array() ? "an empty array" : type_name(*v)));
  }
  for (size_t i = 0; i < out->prompts.size(); ++i)
    if (out->prompts[i].empty()) return bad("prompt", "'prompt' " + std::to_string(i) + " is empty");
  return std::nullopt;
}

// The model field: absent, or the served model (404 otherwise).
std::optional<ApiError> check_model(const Json& body, const ModelInfo& info, std::string* out) {
  const Json* model = field(body, "model");
  if (!model) return std::nullopt;
  if (!model->is_string()) return bad("model", std::string("'model' must be a string, got ") + type_name(*model));
  *out = model->get<std::string>();
  if (*out == info.model_id) return std::nullopt;
  ApiError e = bad("model", "The model '" + *out + "' does not exist; this server serves '" + info.model_id + "'");
  e.status = 404;
  e.code = "model_not_found";
  return e;
}

// One embedding input given as token ids.
std::optional<ApiError> embedding_ids(const Json& arr, const std::string& where, const Tokenizer& tok,
                                      std::vector<int32_t>* out) {
  if (arr.empty()) return bad("input", "'" + where + "' is empty");
  for (const Json& t : arr) {
    if (!t.is_number_integer())
      return bad("input", "'" + where + "' must hold token ids (integers), got " + type_name(t));
    const int64_t id = t.get<int64_t>();
    if (id < 0 || id >= tok.n_vocab())
      return bad("input", "'" + where + "': token " + std::to_string(id) + " is outside the vocabulary [0, " +
                              std::to_string(tok.n_vocab()) + ")");
    out->push_back(static_cast<int32_t>(id));
  }
  return std::nullopt;
}

std::optional<ApiError> embedding_inputs(const Json& body, const Tokenizer& tok, EmbeddingRequest* out) {
  const Json* v = field(body, "input");
  if (!v) return bad("input", "'input' is required");
  auto text = [&](const Json& s, const std::string& where) -> std::optional<ApiError> {
    if (s.get_ref<const std::string&>().empty()) return bad("input", "'" + where + "' is an empty string");
    out->inputs.push_back(tok.encode(s.get<std::string>()));  // BOS as the model adds it, no special parsing
    if (out->inputs.back().empty()) return bad("input", "'" + where + "' has no tokens");
    return std::nullopt;
  };
  if (v->is_string()) return text(*v, "input");
  if (!v->is_array())
    return bad("input", std::string("'input' must be a string, an array of strings, an array of token ids or an "
                                    "array of token-id arrays, got ") + type_name(*v));
  if (v->empty()) return bad("input", "'input' is an empty array");
  if (v->front().is_number()) {  // one input as token ids
    out->inputs.emplace_back();
    return embedding_ids(*v, "input", tok, &out->inputs.back());
  }
  if (v->size() > kMaxEmbeddingInputs)
    return bad("input", "'input' may hold at most " + std::to_string(kMaxEmbeddingInputs) + " inputs, got " +
                            std::to_string(v->size()));
  for (size_t i = 0; i < v->size(); ++i) {
    const Json& p = (*v)[i];
    const std::string where = "input[" + std::to_string(i) + "]";
    if (p.is_string()) {
      KITE_API_TRY(text(p, where));
    } else if (p.is_array()) {
      out->inputs.emplace_back();
      KITE_API_TRY(embedding_ids(p, where, tok, &out->inputs.back()));
    } else {
      return bad("input", "'" + where + "' must be a string or an array of token ids, got " + type_name(p));
    }
  }
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> parse_embedding_request(const Json& body, const ModelInfo& info, EmbeddingRequest* out) {
  if (!body.is_object()) return bad("", std::string("the request body must be a JSON object, got ") + type_name(body));
  std::string model;
  KITE_API_TRY(check_model(body, info, &model));
  if (const Json* f = field(body, "encoding_format")) {
    if (!f->is_string() || (f->get<std::string>() != "float" && f->get<std::string>() != "base64"))
      return bad("encoding_format", "'encoding_format' must be 'float' or 'base64', got " + f->dump());
    out->base64 = f->get<std::string>() == "base64";
  }
  // Embeddings are not shortened: this model's vectors have exactly n_embd dimensions.
  int64_t dims = 0;
  KITE_API_TRY(get_int(body, "dimensions", 1, INT64_MAX, &dims));
  if (field(body, "dimensions") && dims != info.n_embd)
    return bad("dimensions", "'dimensions' must be " + std::to_string(info.n_embd) +
                                 " (this model's embedding size; kite does not shorten embeddings), got " +
                                 std::to_string(dims));
  if (const Json* p = field(body, "pooling")) {
    auto pooling = p->is_string() ? parse_pooling(p->get<std::string>()) : Result<Pooling>(make_error("not a string"));
    if (!pooling) return bad("pooling", "'pooling' must be 'mean', 'last' or 'cls', got " + p->dump());
    out->pooling = *pooling;
  }
  KITE_API_TRY(embedding_inputs(body, *info.tokenizer, out));
  for (size_t i = 0; i < out->inputs.size(); ++i) {
    const int64_t n = static_cast<int64_t>(out->inputs[i].size());
    if (n > info.n_ctx) {
      ApiError e = bad("input", "'" + (out->inputs.size() > 1 ? "input[" + std::to_string(i) + "]" : std::string("input")) +
                                    "' has " + std::to_string(n) + " tokens, more than the context's " +
                                    std::to_string(info.n_ctx));
      e.code = "context_length_exceeded";
      return e;
    }
    out->tokens += n;
  }
  return std::nullopt;
}

std::optional<ApiError> parse_request(const Json& body, Endpoint endpoint, const ModelInfo& info, ParsedRequest* out) {
  if (!body.is_object()) return bad("", std::string("the request body must be a JSON object, got ") + type_name(body));
  out->endpoint = endpoint;
  KITE_API_TRY(check_model(body, info, &out->model));
  KITE_API_TRY(get_bool(body, "stream", &out->stream));
  if (const Json* so = field(body, "stream_options")) {
    if (!so->is_object()) return bad("stream_options", "'stream_options' must be an object");
    KITE_API_TRY(get_bool(*so, "include_usage", &out->include_usage));
  }
  out->gen.max_tokens = 0;  // default: until end of generation or the context is full
  if (endpoint == Endpoint::kCompletions) KITE_API_TRY(get_bool(body, "echo", &out->echo));
  KITE_API_TRY(parse_sampling(body, info, out->echo, &out->gen, &out->score_only));
  const Tokenizer& tok = *info.tokenizer;
  if (endpoint == Endpoint::kCompletions) {
    // Fields whose meaning kite does not implement are refused rather than silently ignored.
    if (const Json* sfx = field(body, "suffix");
        sfx && !(sfx->is_string() && sfx->get_ref<const std::string&>().empty()))
      return bad("suffix", "'suffix' (text after the completion, fill-in-the-middle) is not supported");
    int64_t best_of = out->gen.n;
    KITE_API_TRY(get_int(body, "best_of", 1, info.max_n, &best_of));
    if (best_of != out->gen.n)
      return bad("best_of", "'best_of' must equal 'n' (" + std::to_string(out->gen.n) +
                                "): kite returns every completion it generates, got " + std::to_string(best_of));
    int64_t lp = 0;
    KITE_API_TRY(get_int(body, "logprobs", 0, kMaxLogprobsCompletions, &lp));
    if (field(body, "logprobs")) out->logprobs = static_cast<int32_t>(lp);
    KITE_API_TRY(parse_prompts(body, tok, out));
  } else {
    bool want = false;
    KITE_API_TRY(get_bool(body, "logprobs", &want));
    int64_t top = 0;
    KITE_API_TRY(get_int(body, "top_logprobs", 0, kMaxTopLogprobsChat, &top));
    if (field(body, "top_logprobs") && !want)
      return bad("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    if (want) out->logprobs = static_cast<int32_t>(top);
    OJson messages, tools;
    KITE_API_TRY(parse_messages(body, &messages));
    KITE_API_TRY(parse_tools(body, &tools, out));
    OJson ctx = {{"messages", messages}, {"add_generation_prompt", true}};
    const std::string bos = tok.bos() != kNoToken ? tok.token_bytes(tok.bos()) : std::string();
    const std::string eos = tok.eos() != kNoToken ? tok.token_bytes(tok.eos()) : std::string();
    ctx["bos_token"] = bos;
    ctx["eos_token"] = eos;
    if (!tools.is_null()) ctx["tools"] = tools;
    auto text = info.chat_template->render(ctx);
    if (!text) return bad("messages", "the chat template rejected the messages: " + text.error().message);
    EncodeOptions eo;
    eo.parse_special = true;
    // The template writes the BOS token itself when it wants one.
    eo.add_special = bos.empty() || text->compare(0, bos.size(), bos) != 0;
    out->prompt_texts.push_back(*text);
    out->prompts.push_back(tok.encode(*text, eo));
    if (out->prompts.back().empty()) return bad("messages", "the rendered prompt is empty");
  }
  if (out->logprobs >= 0) out->gen.sampling.n_logprobs = std::max(1, out->logprobs);
  return std::nullopt;
}

}  // namespace kite::tools::server

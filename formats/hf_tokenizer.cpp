#include "formats/hf_tokenizer.h"

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "formats/safetensors.h"

namespace kite::hf {
namespace {

using Json = nlohmann::json;
namespace fs = std::filesystem;

// Token types, as in llama.cpp's llama_token_type / gguf-py's TokenType.
enum TokenType : int32_t { kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6 };

// Without a vocab_size from config.json, ids may exceed the entry count by this much (holes).
constexpr int64_t kMaxIdSlack = 1 << 16;

// Pre-tokenizer regexes as tokenizer.json writes them -> llama.cpp's pre-tokenizer name.
struct PreRow {
  std::string_view regex;
  std::string_view name;
};
constexpr PreRow kPreTokenizers[] = {
    // Llama 3
    {R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
     "llama-bpe"},
    // Qwen2, Qwen2.5, Qwen3: single digits
    {R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
     "qwen2"},
    // GPT-2's regex written out as a Split (ByteLevel's built-in one maps to "gpt-2" too)
    {R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)", "gpt-2"},
};

// Special-token kinds: tokenizer_config field prefix -> GGUF key.
struct SpecialRow {
  std::string_view typ;
  std::string_view key;
};
constexpr SpecialRow kSpecials[] = {
    {"bos", "tokenizer.ggml.bos_token_id"},     {"eos", "tokenizer.ggml.eos_token_id"},
    {"unk", "tokenizer.ggml.unknown_token_id"}, {"sep", "tokenizer.ggml.seperator_token_id"},
    {"pad", "tokenizer.ggml.padding_token_id"}, {"cls", "tokenizer.ggml.cls_token_id"},
    {"mask", "tokenizer.ggml.mask_token_id"},
};

// Added tokens that end a turn (tokenizer.ggml.eot_token_id), as llama.cpp recognizes them.
constexpr std::string_view kEotTexts[] = {"<|eot_id|>", "<|im_end|>", "<end_of_turn>", "<|end|>"};

Result<Json> parse_json(std::string_view text, const std::string& what) {
  try {
    return Json::parse(text.begin(), text.end());
  } catch (const std::exception& e) {
    return make_error(what, ": malformed JSON: ", safetensors::printable(e.what()));
  }
}

bool get_bool_or(const Json& obj, std::string_view key, bool fallback) {
  auto it = obj.find(key);
  return it != obj.end() && it->is_boolean() ? it->get<bool>() : fallback;
}

std::string get_string_or(const Json& obj, std::string_view key, std::string fallback = {}) {
  auto it = obj.find(key);
  return it != obj.end() && it->is_string() ? it->get<std::string>() : fallback;
}

// Walks pre-tokenizers (and Sequences of them).
void walk_pre_tokenizer(const Json& p, TokenizerJson& t) {
  if (!p.is_object()) return;
  const std::string type = get_string_or(p, "type");
  if (type == "Sequence") {
    auto it = p.find("pretokenizers");
    if (it != p.end() && it->is_array())
      for (const Json& q : *it) walk_pre_tokenizer(q, t);
  } else if (type == "Split") {
    auto pat = p.find("pattern");
    if (pat != p.end() && pat->is_object()) {
      std::string re = get_string_or(*pat, "Regex");
      if (re.empty()) re = get_string_or(*pat, "String");
      t.split_regexes.push_back(re);
    }
  } else if (type == "ByteLevel") {
    t.byte_level = true;
    t.byte_level_regex = t.byte_level_regex || get_bool_or(p, "use_regex", true);
  } else if (type == "Metaspace") {
    const std::string scheme = get_string_or(p, "prepend_scheme", "");
    t.metaspace_prefix = scheme.empty() ? get_bool_or(p, "add_prefix_space", true) : scheme != "never";
  }
}

void walk_normalizer(const Json& n, TokenizerJson& t) {
  if (!n.is_object()) return;
  const std::string type = get_string_or(n, "type");
  if (type == "Sequence") {
    auto it = n.find("normalizers");
    if (it != n.end() && it->is_array())
      for (const Json& q : *it) walk_normalizer(q, t);
  } else if (type == "Prepend" && get_string_or(n, "prepend") == "\xe2\x96\x81") {
    t.metaspace_prefix = true;
  }
}

void walk_post_processor(const Json& p, TokenizerJson& t) {
  if (!p.is_object()) return;
  const std::string type = get_string_or(p, "type");
  if (type == "Sequence") {
    auto it = p.find("processors");
    if (it != p.end() && it->is_array())
      for (const Json& q : *it) walk_post_processor(q, t);
  } else if (type == "RobertaProcessing") {
    t.roberta_processing = true;
  } else if (type == "TemplateProcessing") {
    auto single = p.find("single");
    if (single == p.end() || !single->is_array()) return;
    t.template_single.clear();
    for (const Json& piece : *single) {
      if (!piece.is_object()) continue;
      if (auto s = piece.find("SpecialToken"); s != piece.end() && s->is_object())
        t.template_single.push_back(get_string_or(*s, "id"));
      else if (auto q = piece.find("Sequence"); q != piece.end() && q->is_object())
        t.template_single.push_back("$" + get_string_or(*q, "id", "A"));
    }
  }
}

Status parse_model(const Json& model, const std::string& source, TokenizerJson& t) {
  if (!model.is_object()) return make_error(source, ": 'model' must be an object");
  t.model_type = get_string_or(model, "type");
  if (t.model_type.empty() && model.contains("merges")) t.model_type = "BPE";
  if (t.model_type != "BPE") return ok_status();  // reported by the converter
  t.byte_fallback = get_bool_or(model, "byte_fallback", false);
  t.ignore_merges = get_bool_or(model, "ignore_merges", false);
  t.unk_token = get_string_or(model, "unk_token");
  auto vocab = model.find("vocab");
  if (vocab == model.end() || !vocab->is_object()) return make_error(source, ": model.vocab must be an object");
  for (const auto& [tok, id] : vocab->items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0)
      return make_error(source, ": model.vocab entry '", safetensors::printable(tok, 80),
                        "' must have a non-negative integer id");
    t.vocab.emplace_back(tok, id.get<int64_t>());
  }
  std::sort(t.vocab.begin(), t.vocab.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
  auto merges = model.find("merges");
  if (merges == model.end() || merges->is_null()) return ok_status();
  if (!merges->is_array()) return make_error(source, ": model.merges must be an array");
  for (const Json& m : *merges) {
    if (m.is_string()) {  // "left right"
      const std::string s = m.get<std::string>();
      const size_t sp = s.find(' ', 1);
      if (sp == std::string::npos)
        return make_error(source, ": merge '", safetensors::printable(s, 80), "' has no space");
      t.merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {  // ["left", "right"]
      t.merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    } else {
      return make_error(source, ": model.merges entries must be strings or pairs of strings");
    }
  }
  return ok_status();
}

Status parse_added_tokens(const Json& j, const std::string& source, TokenizerJson& t) {
  auto added = j.find("added_tokens");
  if (added == j.end() || added->is_null()) return ok_status();
  if (!added->is_array()) return make_error(source, ": 'added_tokens' must be an array");
  for (const Json& a : *added) {
    if (!a.is_object()) return make_error(source, ": 'added_tokens' entries must be objects");
    auto id = a.find("id");
    auto content = a.find("content");
    if (id == a.end() || !id->is_number_integer() || id->get<int64_t>() < 0 || content == a.end() ||
        !content->is_string())
      return make_error(source, ": an added token lacks a non-negative 'id' or a string 'content'");
    AddedToken tok;
    tok.id = id->get<int64_t>();
    tok.content = content->get<std::string>();
    tok.special = get_bool_or(a, "special", false);
    tok.lstrip = get_bool_or(a, "lstrip", false);
    tok.rstrip = get_bool_or(a, "rstrip", false);
    tok.normalized = get_bool_or(a, "normalized", !tok.special);
    tok.single_word = get_bool_or(a, "single_word", false);
    t.added_tokens.push_back(std::move(tok));
  }
  return ok_status();
}

// llama.cpp's converter marks these added tokens as control even when "special" is false.
bool looks_special(std::string_view s) {
  auto wraps = [&](std::string_view open, std::string_view close) {
    return s.size() >= open.size() + close.size() && s.substr(0, open.size()) == open &&
           s.substr(s.size() - close.size()) == close;
  };
  return s == "<pad>" || s == "<mask>" || s == "<2mass>" || s == "[@BOS@]" || wraps("<|", "|>") ||
         wraps("<\xef\xbd\x9c", "\xef\xbd\x9c>") || wraps("<unused", ">");
}

bool is_byte_token(std::string_view s) {
  auto hex = [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); };
  return s.size() == 6 && s.substr(0, 3) == "<0x" && hex(s[3]) && hex(s[4]) && s[5] == '>';
}

gguf::Value string_array(std::vector<std::string> items) {
  gguf::Array a;
  a.elem_type = gguf::ValueType::STRING;
  a.items.reserve(items.size());
  for (auto& s : items) a.items.emplace_back(std::move(s));
  return gguf::Value(std::move(a));
}

template <class T>
gguf::Value number_array(const std::vector<T>& items, gguf::ValueType type) {
  gguf::Array a;
  a.elem_type = type;
  a.items.reserve(items.size());
  for (T x : items) a.items.emplace_back(x);
  return gguf::Value(std::move(a));
}

// Vocabulary, types and scores. `mode` is "gpt2" or "llama".
Status add_vocab(const TokenizerJson& t, const TokenizerHints& hints, const std::string& mode,
                 const std::string& source, gguf::Metadata& out) {
  int64_t max_id = -1;
  for (const auto& [tok, id] : t.vocab) max_id = std::max(max_id, id);
  for (const auto& a : t.added_tokens) max_id = std::max(max_id, a.id);
  const int64_t entries = static_cast<int64_t>(t.vocab.size() + t.added_tokens.size());
  const int64_t n_vocab = hints.n_vocab > 0 ? hints.n_vocab : max_id + 1;
  if (max_id >= n_vocab)
    return make_error(source, ": tokenizer id ", max_id, " does not fit the vocabulary size ", n_vocab,
                      " from config.json");
  if (hints.n_vocab <= 0 && n_vocab > entries + kMaxIdSlack)
    return make_error(source, ": tokenizer id ", max_id, " is far beyond its ", entries, " entries");
  if (n_vocab <= 0) return make_error(source, ": the tokenizer has no tokens");

  std::vector<std::string> tokens(static_cast<size_t>(n_vocab));
  std::vector<int32_t> types(static_cast<size_t>(n_vocab), kUnused);
  std::vector<bool> present(static_cast<size_t>(n_vocab), false);
  for (const auto& [tok, id] : t.vocab) {
    if (present[id] && tokens[id] != tok)
      return make_error(source, ": tokens '", safetensors::printable(tokens[id], 80), "' and '",
                        safetensors::printable(tok, 80), "' share id ", id);
    tokens[id] = tok;
    present[id] = true;
    types[id] = kNormal;
    if (mode == "llama" && is_byte_token(tok)) types[id] = kByte;
    if (mode == "llama" && !t.unk_token.empty() && tok == t.unk_token) types[id] = kUnknown;
  }
  for (const auto& a : t.added_tokens) {
    tokens[a.id] = a.content;
    present[a.id] = true;
    types[a.id] = (a.special || looks_special(a.content)) ? kControl : kUserDefined;
  }
  for (int64_t i = 0; i < n_vocab; ++i)
    if (!present[i]) tokens[i] = "[PAD" + std::to_string(i) + "]";

  if (mode == "llama") {  // SPM merge priority: a token built by merge r scores -r
    std::unordered_map<std::string, int64_t> id_of;
    for (int64_t i = 0; i < n_vocab; ++i)
      if (present[i]) id_of.emplace(tokens[i], i);
    std::vector<float> scores(static_cast<size_t>(n_vocab), 0.0f);
    std::vector<bool> scored(static_cast<size_t>(n_vocab), false);
    for (size_t r = 0; r < t.merges.size(); ++r) {
      auto it = id_of.find(t.merges[r].first + t.merges[r].second);
      if (it != id_of.end() && !scored[it->second]) {
        scores[it->second] = -static_cast<float>(r + 1);
        scored[it->second] = true;
      }
    }
    out.set("tokenizer.ggml.scores", number_array(scores, gguf::ValueType::F32));
  }
  out.set("tokenizer.ggml.tokens", string_array(std::move(tokens)));
  out.set("tokenizer.ggml.token_type", number_array(types, gguf::ValueType::I32));
  return ok_status();
}

Result<std::string> pre_name(const TokenizerJson& t, const std::string& mode, const std::string& source) {
  if (mode == "llama") return std::string("default");
  if (t.split_regexes.size() > 1)
    return make_error(source, ": pre-tokenizer has ", t.split_regexes.size(),
                      " Split steps; kite knows single-regex ones");
  if (t.split_regexes.size() == 1) {
    auto name = pre_tokenizer_name(t.split_regexes[0]);
    if (!name)
      return make_error(source, ": unknown pre-tokenizer regex '", safetensors::printable(t.split_regexes[0], 120),
                        "' (known: llama-bpe, qwen2, gpt-2)");
    return *name;
  }
  if (t.byte_level_regex) return std::string("gpt-2");
  return make_error(source, ": byte-level tokenizer without a pre-tokenizer regex is not supported");
}

// Id of the added token whose content is the tokenizer_config entry (a string or {content}).
std::optional<int64_t> config_token_id(const Json& cfg, std::string_view typ, const TokenizerJson& t) {
  auto it = cfg.find(std::string(typ) + "_token");
  if (it == cfg.end()) return std::nullopt;
  std::string content;
  if (it->is_string()) {
    content = it->get<std::string>();
  } else if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    content = (*it)["content"].get<std::string>();
  } else {
    return std::nullopt;
  }
  for (const auto& a : t.added_tokens)
    if (a.content == content) return a.id;
  return std::nullopt;
}

// bos/eos/... ids, add_*_token flags and eot, in the precedence llama.cpp's SpecialVocab uses.
void add_specials(const TokenizerJson& t, const Json& cfg, const Json& gen, const TokenizerHints& hints,
                  int64_t n_vocab, gguf::Metadata& out) {
  std::map<std::string, int64_t> ids;
  auto set_id = [&](const std::string& typ, std::optional<int64_t> id) {
    if (id && *id >= 0 && *id < n_vocab && ids.count(typ) == 0) ids[typ] = *id;
  };
  std::map<std::string, bool> add;
  // tokenizer.json's post-processor
  const auto& tpl = t.template_single;
  auto name_of = [&](std::string_view typ) -> std::string {
    std::string s;
    if (auto it = cfg.find(std::string(typ) + "_token"); it != cfg.end()) {
      if (it->is_string())
        s = it->get<std::string>();
      else if (it->is_object())
        s = get_string_or(*it, "content");
    }
    return s;
  };
  if (t.roberta_processing) {
    add["bos"] = add["eos"] = add["sep"] = true;
  } else if (tpl.size() > 1) {
    std::string bos = name_of("bos"), eos = name_of("eos");
    if (bos.empty()) bos = name_of("cls");
    if (eos.empty()) eos = name_of("sep");
    if (tpl.front()[0] != '$') add["bos"] = cfg.empty() || tpl.front() == bos || tpl.front() == name_of("cls");
    add["eos"] = tpl.back()[0] != '$' && (cfg.empty() || tpl.back() == eos);
  }
  // tokenizer_config.json
  for (const auto& row : kSpecials) {
    const std::string typ(row.typ);
    if (auto it = cfg.find("add_" + typ + "_token"); it != cfg.end() && it->is_boolean()) add[typ] = it->get<bool>();
    set_id(typ, config_token_id(cfg, typ, t));
  }
  if (ids.count("bos") == 0) set_id("bos", config_token_id(cfg, "cls", t));
  if (ids.count("eos") == 0) set_id("eos", config_token_id(cfg, "sep", t));
  // config.json
  set_id("bos", hints.bos_token_id);
  if (hints.eos_token_ids.size() == 1) set_id("eos", hints.eos_token_ids[0]);
  set_id("pad", hints.pad_token_id);
  // End of turn: a known end-of-turn token, else another eos id in generation_config.json.
  for (auto text : kEotTexts)
    for (const auto& a : t.added_tokens)
      if (a.content == text) set_id("eot", a.id);
  if (auto it = gen.find("eos_token_id"); it != gen.end() && it->is_array()) {
    for (const Json& e : *it)
      if (e.is_number_integer() && (ids.count("eos") == 0 || e.get<int64_t>() != ids["eos"])) {
        set_id("eot", e.get<int64_t>());
        break;
      }
  }

  for (const auto& row : kSpecials)
    if (auto it = ids.find(std::string(row.typ)); it != ids.end())
      out.set(std::string(row.key), gguf::Value(static_cast<uint32_t>(it->second)));
  if (auto it = ids.find("eot"); it != ids.end())
    out.set("tokenizer.ggml.eot_token_id", gguf::Value(static_cast<uint32_t>(it->second)));
  for (const char* typ : {"bos", "eos", "sep"})
    if (auto it = add.find(typ); it != add.end())
      out.set(std::string("tokenizer.ggml.add_") + typ + "_token", gguf::Value(it->second));
}

Status add_chat_template(const Json& cfg, const std::string& jinja, const std::string& source, gguf::Metadata& out) {
  auto it = cfg.find("chat_template");
  if (it == cfg.end() || it->is_null()) {
    if (!jinja.empty()) out.set("tokenizer.chat_template", jinja);
    return ok_status();
  }
  if (it->is_string()) {
    out.set("tokenizer.chat_template", it->get<std::string>());
    return ok_status();
  }
  if (!it->is_array()) return make_error(source, ": 'chat_template' must be a string or a list of {name, template}");
  for (const Json& e : *it) {
    if (!e.is_object() || !e.contains("name") || !e["name"].is_string() || !e.contains("template") ||
        !e["template"].is_string())
      return make_error(source, ": 'chat_template' list entries must be {name, template} strings");
    const std::string name = e["name"].get<std::string>();
    const std::string key = name == "default" ? "tokenizer.chat_template" : "tokenizer.chat_template." + name;
    out.set(key, e["template"].get<std::string>());
  }
  return ok_status();
}

Result<std::string> read_optional(const fs::path& p) {
  std::error_code ec;
  if (!fs::exists(p, ec)) return std::string();
  KITE_ASSIGN_OR_RETURN(auto map, MappedFile::open(p.string()));
  return std::string(reinterpret_cast<const char*>(map->data()), map->size());
}

}  // namespace

std::optional<std::string> pre_tokenizer_name(std::string_view split_regex) {
  for (const PreRow& row : kPreTokenizers)
    if (row.regex == split_regex) return std::string(row.name);
  return std::nullopt;
}

Result<TokenizerJson> parse_tokenizer_json(std::string_view text, const std::string& source) {
  KITE_ASSIGN_OR_RETURN(Json j, parse_json(text, source));
  if (!j.is_object()) return make_error(source, ": tokenizer.json is a JSON ", j.type_name(), ", not an object");
  TokenizerJson t;
  auto model = j.find("model");
  if (model == j.end()) return make_error(source, ": no 'model' in tokenizer.json");
  KITE_TRY(parse_model(*model, source, t));
  KITE_TRY(parse_added_tokens(j, source, t));
  if (auto p = j.find("pre_tokenizer"); p != j.end()) walk_pre_tokenizer(*p, t);
  if (auto n = j.find("normalizer"); n != j.end()) walk_normalizer(*n, t);
  if (auto d = j.find("decoder"); d != j.end() && d->is_object()) {
    if (get_string_or(*d, "type") == "ByteLevel") t.byte_level = true;
  }
  if (auto p = j.find("post_processor"); p != j.end()) walk_post_processor(*p, t);
  return t;
}

Status add_tokenizer_metadata(const TokenizerFiles& files, const TokenizerHints& hints, gguf::Metadata& out) {
  const std::string& src = files.source;
  KITE_ASSIGN_OR_RETURN(TokenizerJson t, parse_tokenizer_json(files.tokenizer_json, src + "/tokenizer.json"));
  if (t.model_type != "BPE")
    return make_error(src, "/tokenizer.json: tokenizer model '", safetensors::printable(t.model_type, 40),
                      "' is not supported (kite converts BPE)");
  std::string mode;
  if (t.byte_fallback)
    mode = "llama";
  else if (t.byte_level)
    mode = "gpt2";
  else
    return make_error(src, "/tokenizer.json: BPE without byte-level encoding or byte fallback is not supported");

  Json cfg = Json::object(), gen = Json::object();
  if (!files.tokenizer_config_json.empty()) {
    KITE_ASSIGN_OR_RETURN(cfg, parse_json(files.tokenizer_config_json, src + "/tokenizer_config.json"));
    if (!cfg.is_object()) return make_error(src, "/tokenizer_config.json: not a JSON object");
  }
  if (!files.generation_config_json.empty()) {
    auto g = parse_json(files.generation_config_json, src + "/generation_config.json");
    if (g && g->is_object()) gen = std::move(*g);  // optional extras only: ignore a bad one
  }

  KITE_ASSIGN_OR_RETURN(std::string pre, pre_name(t, mode, src + "/tokenizer.json"));
  out.set("tokenizer.ggml.model", mode);
  out.set("tokenizer.ggml.pre", pre);
  KITE_TRY(add_vocab(t, hints, mode, src + "/tokenizer.json", out));
  const int64_t n_vocab = static_cast<int64_t>(out.find("tokenizer.ggml.tokens")->get_if<gguf::Array>()->items.size());
  if (mode == "gpt2") {
    std::vector<std::string> merges;
    merges.reserve(t.merges.size());
    for (const auto& [a, b] : t.merges) {
      auto enc = [](const std::string& s) {  // spaces inside a pair-format merge become U+0120
        std::string r;
        for (char c : s) r += c == ' ' ? std::string("\xc4\xa0") : std::string(1, c);
        return r;
      };
      merges.push_back(enc(a) + " " + enc(b));
    }
    out.set("tokenizer.ggml.merges", string_array(std::move(merges)));
  } else {
    out.set("tokenizer.ggml.add_space_prefix", gguf::Value(t.metaspace_prefix));
  }
  add_specials(t, cfg, gen, hints, n_vocab, out);
  return add_chat_template(cfg, files.chat_template_jinja, src + "/tokenizer_config.json", out);
}

Status add_tokenizer_metadata(const std::string& folder, const TokenizerHints& hints, gguf::Metadata& out) {
  const fs::path dir(folder);
  TokenizerFiles files;
  files.source = folder;
  std::error_code ec;
  if (!fs::exists(dir / "tokenizer.json", ec))
    return make_error(folder, ": no tokenizer.json (kite reads Hugging Face fast-tokenizer files)");
  KITE_ASSIGN_OR_RETURN(files.tokenizer_json, read_optional(dir / "tokenizer.json"));
  KITE_ASSIGN_OR_RETURN(files.tokenizer_config_json, read_optional(dir / "tokenizer_config.json"));
  KITE_ASSIGN_OR_RETURN(files.generation_config_json, read_optional(dir / "generation_config.json"));
  KITE_ASSIGN_OR_RETURN(files.chat_template_jinja, read_optional(dir / "chat_template.jinja"));
  return add_tokenizer_metadata(files, hints, out);
}

std::string tokenizer_json_path(const std::string& folder) {
  return (fs::path(folder) / "tokenizer.json").string();
}

}  // namespace kite::hf

// Loading the vocabulary from tokenizer.ggml.* metadata, with llama.cpp's defaults for keys
// that converters leave out.
#include "src/runtime/tokenizer/vocab.h"

#include <algorithm>

#include "src/runtime/tokenizer/unicode.h"

namespace kite::tokenizer {

namespace {

constexpr std::string_view kSpaceMark = "\xE2\x96\x81";  // U+2581, SentencePiece's space

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  size_t pos = 0;
  while ((pos = s.find(from, pos)) != std::string::npos) {
    s.replace(pos, from.size(), to);
    pos += to.size();
  }
}

// The array stored under `key`, or null when absent; error if present with another type.
Result<const gguf::Array*> find_array(const gguf::Metadata& md, std::string_view key) {
  const gguf::Value* v = md.find(key);
  if (v == nullptr) return static_cast<const gguf::Array*>(nullptr);
  const gguf::Array* a = v->get_if<gguf::Array>();
  if (a == nullptr)
    return make_error(md.source(), ": key '", key, "' has type ", gguf::value_type_name(v->type()), ", expected array");
  return a;
}

// Reads an optional token id key into *id; absent keeps the default.
Status read_id(const gguf::Metadata& md, std::string_view key, size_t n_tokens, TokenId* id) {
  const gguf::Value* v = md.find(key);
  if (v == nullptr) return ok_status();
  std::optional<int64_t> x = v->as_int();
  if (!x) return make_error(md.source(), ": key '", key, "' is not an integer");
  if (*x < 0 || static_cast<uint64_t>(*x) >= n_tokens) {
    *id = kNoToken;  // llama.cpp ignores out-of-range ids as well (some files write -1)
    return ok_status();
  }
  *id = static_cast<TokenId>(*x);
  return ok_status();
}

Status read_bool(const gguf::Metadata& md, std::string_view key, bool* b) {
  const gguf::Value* v = md.find(key);
  if (v == nullptr) return ok_status();
  if (const bool* x = v->get_if<bool>()) {
    *b = *x;
    return ok_status();
  }
  if (auto i = v->as_int()) {
    *b = *i != 0;
    return ok_status();
  }
  return make_error(md.source(), ": key '", key, "' is not a bool");
}

std::string spm_bytes(const TokenData& t) {
  if (t.type == TokenType::kByte && t.text.size() == 6 && t.text.compare(0, 3, "<0x") == 0) {
    return std::string(1, static_cast<char>(std::stoi(t.text.substr(3, 2), nullptr, 16)));
  }
  if (t.type != TokenType::kNormal && t.type != TokenType::kUndefined && t.type != TokenType::kUnused) return t.text;
  std::string s = t.text;
  replace_all(s, kSpaceMark, " ");
  return s;
}

std::string bpe_bytes(const TokenData& t) {
  if (t.type != TokenType::kNormal && t.type != TokenType::kUndefined && t.type != TokenType::kUnused)
    return t.text;  // added tokens are stored as raw text
  const ByteLevelAlphabet& abc = byte_level_alphabet();
  std::string out;
  size_t pos = 0;
  while (pos < t.text.size()) {
    const size_t start = pos;
    const uint32_t cp = decode_utf8(t.text, &pos);
    const int b = abc.decode(cp);
    if (b >= 0) {
      out.push_back(static_cast<char>(b));
    } else {
      out.append(t.text, start, pos - start);  // not a byte-level character: keep it as text
    }
  }
  return out;
}

std::string wpm_bytes(const TokenData& t) {
  if (t.type != TokenType::kNormal && t.type != TokenType::kUndefined) return t.text;
  std::string s = t.text;
  replace_all(s, kSpaceMark, " ");
  return s;
}

bool is_eog_text(std::string_view s) {
  static constexpr std::string_view kNames[] = {"<|eot_id|>",      "<|im_end|>",        "<|end|>", "<end_of_turn>",
                                                "<|endoftext|>",   "<|eom_id|>",        "<EOT>",   "_<EOT>",
                                                "<|end_of_text|>", "<end_of_utterance>"};
  return std::find(std::begin(kNames), std::end(kNames), s) != std::end(kNames);
}

Status load_tokens(const gguf::Metadata& md, Vocab& v) {
  KITE_ASSIGN_OR_RETURN(const gguf::Array* toks, find_array(md, "tokenizer.ggml.tokens"));
  if (toks == nullptr) return make_error(md.source(), ": missing key 'tokenizer.ggml.tokens'");
  if (toks->elem_type != gguf::ValueType::STRING)
    return make_error(md.source(), ": key 'tokenizer.ggml.tokens' is an array of ",
                      gguf::value_type_name(toks->elem_type), ", expected string");
  const size_t n = toks->items.size();
  if (n == 0) return make_error(md.source(), ": key 'tokenizer.ggml.tokens' is empty");
  if (n > static_cast<size_t>(INT32_MAX))
    return make_error(md.source(), ": 'tokenizer.ggml.tokens' has ", n, " entries");
  KITE_ASSIGN_OR_RETURN(const gguf::Array* scores, find_array(md, "tokenizer.ggml.scores"));
  KITE_ASSIGN_OR_RETURN(const gguf::Array* types, find_array(md, "tokenizer.ggml.token_type"));
  if (scores != nullptr && scores->items.size() < n)
    return make_error(md.source(), ": 'tokenizer.ggml.scores' has ", scores->items.size(), " entries, expected ", n);
  if (types != nullptr && types->items.size() < n)
    return make_error(md.source(), ": 'tokenizer.ggml.token_type' has ", types->items.size(), " entries, expected ", n);
  v.tokens.resize(n);
  for (size_t i = 0; i < n; ++i) {
    TokenData& t = v.tokens[i];
    const std::string* s = toks->items[i].get_if<std::string>();
    if (s == nullptr) return make_error(md.source(), ": tokenizer.ggml.tokens[", i, "] is not a string");
    t.text = s->empty() ? "[EMPTY_" + std::to_string(i) + "]" : *s;
    if (scores != nullptr) {
      std::optional<double> f = scores->items[i].as_float();
      if (!f) return make_error(md.source(), ": tokenizer.ggml.scores[", i, "] is not a number");
      t.score = static_cast<float>(*f);
    }
    if (types != nullptr) {
      std::optional<int64_t> ty = types->items[i].as_int();
      if (!ty) return make_error(md.source(), ": tokenizer.ggml.token_type[", i, "] is not an integer");
      t.type = (*ty >= 0 && *ty <= 6) ? static_cast<TokenType>(*ty) : TokenType::kUndefined;
    }
  }
  v.to_id.reserve(n * 2);
  for (size_t i = 0; i < n; ++i) {
    v.to_id.emplace(v.tokens[i].text, static_cast<TokenId>(i));  // a duplicate keeps the first id
    v.max_token_len = std::max(v.max_token_len, v.tokens[i].text.size());
  }
  return ok_status();
}

}  // namespace

TokenId Vocab::byte_token(uint8_t b) const {
  if (type == VocabType::kBpe) return find(byte_level_alphabet().encode(b));
  static constexpr char kHex[] = "0123456789ABCDEF";
  const char buf[6] = {'<', '0', 'x', kHex[b >> 4], kHex[b & 15], '>'};
  TokenId id = find(std::string_view(buf, 6));
  if (id != kNoToken) return id;
  return find(std::string_view(reinterpret_cast<const char*>(&b), 1));
}

Result<Vocab> load_vocab(const gguf::Metadata& md) {
  Vocab v;
  {
    auto m = md.get<std::string>("tokenizer.ggml.model");
    if (!m) return m.error();
    v.model = *m;
  }
  if (const gguf::Value* p = md.find("tokenizer.ggml.pre")) {
    if (const std::string* s = p->get_if<std::string>()) v.pre = *s;
  }
  if (v.model == "llama") {
    v.type = VocabType::kSpm;
    v.bos = 1, v.eos = 2, v.unk = 0;
    v.add_space_prefix = true;
    v.add_bos = true;
  } else if (v.model == "gpt2") {
    v.type = VocabType::kBpe;
    static constexpr std::string_view kLlama3[] = {"llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral"};
    if (std::find(std::begin(kLlama3), std::end(kLlama3), v.pre) != std::end(kLlama3)) {
      v.ignore_merges = true;
      v.add_bos = true;
    }
  } else if (v.model == "bert") {
    v.type = VocabType::kWpm;
    v.bos = 101, v.unk = 100, v.sep = 102, v.pad = 0, v.mask = 103;
    v.add_bos = true;
  } else {
    return make_error(md.source(), ": unsupported tokenizer model '", v.model,
                      "' (tokenizer.ggml.model; supported: llama, gpt2, bert)");
  }
  KITE_TRY(load_tokens(md, v));
  const size_t n = v.tokens.size();
  for (TokenId* id : {&v.bos, &v.eos, &v.unk, &v.pad, &v.sep, &v.mask})
    if (!v.valid(*id)) *id = kNoToken;
  KITE_TRY(read_id(md, "tokenizer.ggml.cls_token_id", n, &v.bos));
  KITE_TRY(read_id(md, "tokenizer.ggml.bos_token_id", n, &v.bos));
  KITE_TRY(read_id(md, "tokenizer.ggml.eos_token_id", n, &v.eos));
  KITE_TRY(read_id(md, "tokenizer.ggml.eot_token_id", n, &v.eot));
  KITE_TRY(read_id(md, "tokenizer.ggml.eom_token_id", n, &v.eom));
  KITE_TRY(read_id(md, "tokenizer.ggml.unknown_token_id", n, &v.unk));
  KITE_TRY(read_id(md, "tokenizer.ggml.seperator_token_id", n, &v.sep));
  KITE_TRY(read_id(md, "tokenizer.ggml.padding_token_id", n, &v.pad));
  KITE_TRY(read_id(md, "tokenizer.ggml.mask_token_id", n, &v.mask));
  KITE_TRY(read_bool(md, "tokenizer.ggml.add_bos_token", &v.add_bos));
  KITE_TRY(read_bool(md, "tokenizer.ggml.add_eos_token", &v.add_eos));
  KITE_TRY(read_bool(md, "tokenizer.ggml.add_space_prefix", &v.add_space_prefix));
  KITE_TRY(read_bool(md, "tokenizer.ggml.ignore_merges", &v.ignore_merges));
  KITE_TRY(read_bool(md, "tokenizer.ggml.normalizer.lowercase", &v.lowercase));
  if (v.add_bos && v.bos == kNoToken) v.add_bos = false;
  if (v.add_eos && v.eos == kNoToken) v.add_eos = false;

  v.eog.assign(n, false);
  for (size_t i = 0; i < n; ++i) {
    TokenData& t = v.tokens[i];
    if (is_eog_text(t.text)) {
      v.eog[i] = true;
      if (t.type == TokenType::kNormal || t.type == TokenType::kUserDefined) t.type = TokenType::kControl;
      if (v.eot == kNoToken && t.text != "<|eom_id|>") v.eot = static_cast<TokenId>(i);
    }
  }
  for (TokenId id : {v.eos, v.eot, v.eom})
    if (id != kNoToken) v.eog[id] = true;

  for (TokenData& t : v.tokens) {
    switch (v.type) {
      case VocabType::kSpm:
        t.bytes = spm_bytes(t);
        break;
      case VocabType::kBpe:
        t.bytes = bpe_bytes(t);
        break;
      case VocabType::kWpm:
        t.bytes = wpm_bytes(t);
        break;
    }
  }
  return v;
}

}  // namespace kite::tokenizer

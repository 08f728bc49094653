// PCRE2-backed pre-tokenizer: the per-model regex lists and Isolated splitting.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "src/runtime/tokenizer/pretokenizer.h"

#include <pcre2.h>

#include <utility>

namespace kite::tokenizer {

namespace {

// The patterns of the models' tokenizer.json pre-tokenizers (and llama.cpp's lists where a
// model's Hugging Face pipeline has parts that are not regexes, e.g. Falcon's Punctuation).
// GPT-2's pattern is shared by many.
constexpr const char* kGpt2 = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";
constexpr const char* kLlama3 =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr const char* kQwen2 =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

struct PreEntry {
  std::vector<std::string_view> names;
  std::vector<std::string> patterns;
};

const std::vector<PreEntry>& pre_table() {
  static const std::vector<PreEntry> kTable = {
      {{"", "default"}, {"[\\p{P}\\$\\+<=>\\^~\\|]+", kGpt2, "\\p{N}+", "[0-9][0-9][0-9]"}},
      {{"llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral", "dbrx", "smaug-bpe", "chatglm-bpe", "glm4"},
       {kLlama3}},
      {{"qwen2", "deepseek-r1-qwen", "stablelm2", "hunyuan"}, {kQwen2}},
      {{"gpt-2", "gpt2", "mpt", "olmo", "jais", "phi-2", "jina-es", "jina-de", "jina-v1-en", "jina-v2-es", "jina-v2-de",
        "jina-v2-code", "roberta-bpe", "trillion", "gigachat"},
       {kGpt2}},
      {{"starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva"}, {"\\p{N}", kGpt2}},
      {{"falcon"}, {"[\\p{P}\\$\\+<=>\\^~\\|`]+", kGpt2, "[0-9][0-9][0-9]"}},
      // Code points whose NFC form differs are written as \x{...} so no editor can normalize them.
      {{"deepseek-llm"},
       {"[\\r\\n]",
        "\\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-"
        "ὅὈ-"
        "Ὅὐ-ὗὙὛὝὟ-\\x{1F7D}ᾀ-ᾴᾶ-ᾼ\\x{1FBE}ῂ-ῄῆ-ῌῐ-\\x{1FD3}ῖ-\\x{1FDB}ῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤ\\x{2126}ℨ\\x{212A}-ℭℯ-ℴℹℼ-ℿⅅ-"
        "ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-"
        "𑣟𞤀-"
        "𞥃]+",
        "\\s?[!-/:-~！-／：-～‘-‟　-。]+", "\\s+$", "[一-龥ࠀ-一가-퟿]+", "\\p{N}+"}},
      {{"deepseek-coder"}, {"[\\r\\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", "[一-龥ࠀ-一가-퟿]+", "\\p{N}"}},
      {{"deepseek-v3"},
       {"\\p{N}{1,3}", "[一-龥぀-ゟ゠-ヿ]+",
        "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
        "| ?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}},
  };
  return kTable;
}

}  // namespace

Result<Regex> Regex::compile(const std::string& pattern) {
  int err = 0;
  PCRE2_SIZE err_off = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY, &err, &err_off, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    return make_error("pre-tokenizer regex '", pattern, "': ", reinterpret_cast<const char*>(msg), " at offset ",
                      err_off);
  }
  // JIT is an optimization: without it (e.g. no JIT support on this CPU) pcre2_match still works.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  Regex r;
  r.pattern_ = pattern;
  r.code_ = code;
  return r;
}

Regex::~Regex() {
  if (code_ != nullptr) pcre2_code_free(static_cast<pcre2_code*>(code_));
}

Regex::Regex(Regex&& o) noexcept : pattern_(std::move(o.pattern_)), code_(std::exchange(o.code_, nullptr)) {}

Regex& Regex::operator=(Regex&& o) noexcept {
  if (this != &o) {
    if (code_ != nullptr) pcre2_code_free(static_cast<pcre2_code*>(code_));
    pattern_ = std::move(o.pattern_);
    code_ = std::exchange(o.code_, nullptr);
  }
  return *this;
}

Result<PreTokenizer> PreTokenizer::for_name(std::string_view pre) {
  for (const PreEntry& e : pre_table()) {
    for (std::string_view n : e.names) {
      if (n == pre) return from_patterns(e.patterns);
    }
  }
  return make_error("unsupported pre-tokenizer '", pre, "' (tokenizer.ggml.pre)");
}

Result<PreTokenizer> PreTokenizer::from_patterns(const std::vector<std::string>& patterns) {
  PreTokenizer p;
  for (const std::string& pat : patterns) {
    KITE_ASSIGN_OR_RETURN(Regex r, Regex::compile(pat));
    p.regexes_.push_back(std::move(r));
  }
  return p;
}

// Per-call PCRE2 state: match data and a JIT stack big enough for long runs of one class.
class MatchState {
 public:
  MatchState() {
    md_ = pcre2_match_data_create(4, nullptr);
    ctx_ = pcre2_match_context_create(nullptr);
    stack_ = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, nullptr);
    if (ctx_ != nullptr && stack_ != nullptr) pcre2_jit_stack_assign(ctx_, nullptr, stack_);
  }
  ~MatchState() {
    pcre2_match_data_free(md_);
    pcre2_match_context_free(ctx_);
    if (stack_ != nullptr) pcre2_jit_stack_free(stack_);
  }
  MatchState(const MatchState&) = delete;
  MatchState& operator=(const MatchState&) = delete;

  // Finds the next match in subject[start, len); returns false when there is none (or on a
  // matching error, which ends the splitting of this piece: the rest stays one piece).
  bool next(const pcre2_code* code, const char* subject, size_t len, size_t start, size_t* mb, size_t* me) {
    int rc = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(subject), len, start, PCRE2_NO_UTF_CHECK, md_, ctx_);
    if (rc < 0) return false;
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md_);
    *mb = ov[0];
    *me = ov[1];
    return true;
  }

 private:
  pcre2_match_data* md_ = nullptr;
  pcre2_match_context* ctx_ = nullptr;
  pcre2_jit_stack* stack_ = nullptr;
};

namespace {

// Length of the UTF-8 character at s[i] (input is valid UTF-8).
inline size_t char_len(const char* s, size_t i) {
  static constexpr uint8_t kLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLen[static_cast<uint8_t>(s[i]) >> 4];
}

}  // namespace

// Regex `level` cuts `piece` into matches and the text between them; each part goes through
// the next regex, and the parts left after the last regex go to `fn`.
void PreTokenizer::split_level(std::string_view piece, size_t level, MatchState& st, PieceFn fn, void* ctx) const {
  if (level == regexes_.size()) {
    fn(ctx, piece);
    return;
  }
  const auto* code = static_cast<const pcre2_code*>(regexes_[level].code());
  const char* s = piece.data();
  const size_t n = piece.size();
  size_t pos = 0;   // where the search continues
  size_t emit = 0;  // start of the text not yet emitted
  size_t mb = 0, me = 0;
  while (pos < n && st.next(code, s, n, pos, &mb, &me)) {
    if (me == mb) {  // empty match: not a piece; search again one character later
      pos = mb + char_len(s, mb);
      continue;
    }
    if (mb > emit) split_level(piece.substr(emit, mb - emit), level + 1, st, fn, ctx);
    split_level(piece.substr(mb, me - mb), level + 1, st, fn, ctx);
    emit = pos = me;
  }
  if (emit < n) split_level(piece.substr(emit), level + 1, st, fn, ctx);
}

void PreTokenizer::for_each_piece(std::string_view text, PieceFn fn, void* ctx) const {
  if (text.empty()) return;
  MatchState st;
  split_level(text, 0, st, fn, ctx);
}

void PreTokenizer::split(std::string_view text, std::vector<Span>& out) const {
  out.clear();
  struct Ctx {
    const char* base;
    std::vector<Span>* out;
  } ctx{text.data(), &out};
  for_each_piece(
      text,
      [](void* c, std::string_view piece) {
        auto* x = static_cast<Ctx*>(c);
        x->out->push_back({static_cast<size_t>(piece.data() - x->base), piece.size()});
      },
      &ctx);
}

}  // namespace kite::tokenizer

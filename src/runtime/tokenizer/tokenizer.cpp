// The Tokenizer facade: encode with special tokens and BOS/EOS, decode, streaming decode.
#include "src/runtime/tokenizer.h"

#include "src/runtime/tokenizer/impl.h"
#include "src/runtime/tokenizer/spm.h"
#include "src/runtime/tokenizer/unicode.h"
#include "src/runtime/tokenizer/wpm.h"

namespace kite {

namespace tokenizer {

Result<std::unique_ptr<Impl>> Impl::load(const gguf::Metadata& md) {
  auto impl = std::make_unique<Impl>();
  {
    KITE_ASSIGN_OR_RETURN(Vocab v, load_vocab(md));
    impl->vocab_ = std::move(v);
  }
  impl->specials_.build(impl->vocab_);
  if (impl->vocab_.type == VocabType::kSpm) impl->vocab_.spm_word_split = spm_splits_at_words(impl->vocab_);
  if (impl->vocab_.type == VocabType::kBpe) {
    auto pre = PreTokenizer::for_name(impl->vocab_.pre);
    if (!pre) return pre.error().with_context(md.source());
    impl->pre_.emplace(std::move(*pre));
    KITE_ASSIGN_OR_RETURN(BpeModel bpe, BpeModel::build(md, impl->vocab_));
    impl->bpe_.emplace(std::move(bpe));
  }
  return impl;
}

void Impl::encode(std::string_view text, const EncodeOptions& opt, std::vector<TokenId>& out) const {
  const Vocab& v = vocab_;
  // BPE and WPM work on characters: ill-formed UTF-8 becomes U+FFFD first (SPM keeps the
  // bytes and encodes them as byte tokens).
  std::string fixed;
  if (v.type != VocabType::kSpm && !is_valid_utf8(text)) {
    append_sanitized_utf8(text, fixed, true);
    text = fixed;
  }
  std::vector<Fragment> frags;
  specials_.partition(text, opt.parse_special, frags);

  if (opt.add_special && v.add_bos && v.bos != kNoToken) out.push_back(v.bos);
  switch (v.type) {
    case VocabType::kSpm: {
      bool prev_special = true;  // the text start counts as "after a special token"
      std::string buf;
      for (const Fragment& f : frags) {
        if (f.token != kNoToken) {
          out.push_back(f.token);
          prev_special = true;
          continue;
        }
        buf.clear();
        if (v.add_space_prefix && prev_special) buf.push_back(' ');
        buf.append(text.substr(f.offset, f.length));
        std::string esc;
        esc.reserve(buf.size() + buf.size() / 2);
        for (char c : buf) {
          if (c == ' ')
            esc.append("\xE2\x96\x81");
          else
            esc.push_back(c);
        }
        spm_encode(esc, v, out);
        prev_special = false;
      }
      break;
    }
    case VocabType::kBpe: {
      BpeSession session(*bpe_, v, *pre_);
      for (const Fragment& f : frags) {
        if (f.token != kNoToken)
          out.push_back(f.token);
        else
          session.encode(text.substr(f.offset, f.length), out);
      }
      break;
    }
    case VocabType::kWpm: {
      for (const Fragment& f : frags) {
        if (f.token != kNoToken)
          out.push_back(f.token);
        else
          wpm_encode(text.substr(f.offset, f.length), v, out);
      }
      if (opt.add_special && v.sep != kNoToken) out.push_back(v.sep);
      break;
    }
  }
  if (opt.add_special && v.add_eos && v.eos != kNoToken && v.type != VocabType::kWpm) out.push_back(v.eos);
}

std::string_view Impl::piece(TokenId id, bool render_special) const {
  if (!vocab_.valid(id)) return {};
  const TokenData& t = vocab_.tokens[id];
  if (!render_special && (t.type == TokenType::kControl || t.type == TokenType::kUnknown)) return {};
  return t.bytes;
}

}  // namespace tokenizer

Tokenizer::Tokenizer(std::unique_ptr<tokenizer::Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

Result<std::shared_ptr<const Tokenizer>> Tokenizer::load(const gguf::Metadata& metadata) {
  KITE_ASSIGN_OR_RETURN(auto impl, tokenizer::Impl::load(metadata));
  return std::shared_ptr<const Tokenizer>(new Tokenizer(std::move(impl)));
}

std::vector<TokenId> Tokenizer::encode(std::string_view text, const EncodeOptions& options) const {
  std::vector<TokenId> out;
  out.reserve(text.size() / 3 + 4);
  impl_->encode(text, options, out);
  return out;
}

std::string Tokenizer::decode(std::span<const TokenId> ids, const DecodeOptions& options) const {
  std::string raw;
  bool first = options.strip_leading_space && impl_->strips_leading_space();
  for (TokenId id : ids) {
    std::string_view p = impl_->piece(id, options.render_special);
    if (p.empty()) continue;
    if (first && p.front() == ' ') p.remove_prefix(1);
    first = false;
    raw.append(p);
  }
  if (tokenizer::is_valid_utf8(raw)) return raw;
  std::string out;
  tokenizer::append_sanitized_utf8(raw, out, true);
  return out;
}

std::string Tokenizer::token_bytes(TokenId id) const {
  return std::string(impl_->piece(id, true));
}

std::string_view Tokenizer::token_text(TokenId id) const {
  const auto& v = impl_->vocab();
  return v.valid(id) ? std::string_view(v.tokens[id].text) : std::string_view();
}

std::optional<TokenId> Tokenizer::find_token(std::string_view text) const {
  TokenId id = impl_->vocab().find(text);
  if (id == kNoToken) return std::nullopt;
  return id;
}

VocabType Tokenizer::type() const {
  return impl_->vocab().type;
}
const std::string& Tokenizer::model_name() const {
  return impl_->vocab().model;
}
const std::string& Tokenizer::pre_name() const {
  return impl_->vocab().pre;
}
int32_t Tokenizer::n_vocab() const {
  return static_cast<int32_t>(impl_->vocab().tokens.size());
}
TokenType Tokenizer::token_type(TokenId id) const {
  const auto& v = impl_->vocab();
  return v.valid(id) ? v.tokens[id].type : TokenType::kUndefined;
}
float Tokenizer::token_score(TokenId id) const {
  const auto& v = impl_->vocab();
  return v.valid(id) ? v.tokens[id].score : 0.0f;
}
TokenId Tokenizer::bos() const {
  return impl_->vocab().bos;
}
TokenId Tokenizer::eos() const {
  return impl_->vocab().eos;
}
TokenId Tokenizer::eot() const {
  return impl_->vocab().eot;
}
TokenId Tokenizer::unk() const {
  return impl_->vocab().unk;
}
TokenId Tokenizer::pad() const {
  return impl_->vocab().pad;
}
TokenId Tokenizer::sep() const {
  return impl_->vocab().sep;
}
bool Tokenizer::add_bos() const {
  return impl_->vocab().add_bos;
}
bool Tokenizer::add_eos() const {
  return impl_->vocab().add_eos;
}
bool Tokenizer::is_eog(TokenId id) const {
  const auto& v = impl_->vocab();
  return v.valid(id) && v.eog[id];
}
bool Tokenizer::is_control(TokenId id) const {
  TokenType t = token_type(id);
  return t == TokenType::kControl || t == TokenType::kUnknown;
}

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, DecodeOptions options) : tok_(&tokenizer), options_(options) {
  first_ = options_.strip_leading_space && tok_->impl().strips_leading_space();
}

std::string StreamDecoder::push(TokenId id) {
  std::string_view p = tok_->impl().piece(id, options_.render_special);
  std::string out;
  if (p.empty()) return out;
  if (first_ && p.front() == ' ') p.remove_prefix(1);
  first_ = false;
  pending_.append(p);
  const size_t used = tokenizer::append_sanitized_utf8(pending_, out, false);
  pending_.erase(0, used);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out;
  tokenizer::append_sanitized_utf8(pending_, out, true);
  pending_.clear();
  return out;
}

void StreamDecoder::reset() {
  pending_.clear();
  first_ = options_.strip_leading_space && tok_->impl().strips_leading_space();
}

}  // namespace kite

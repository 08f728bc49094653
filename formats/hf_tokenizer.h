// kite/formats/hf_tokenizer.h — tokenizer.json + tokenizer_config.json -> GGUF tokenizer keys.
//
// The output is what llama.cpp's converter writes for the same folder, so the runtime tokenizer
// has one input format:
//   tokenizer.ggml.model       "gpt2" (byte-level BPE) or "llama" (BPE with byte fallback, SPM-style)
//   tokenizer.ggml.pre         pre-tokenizer family from the Split regex: "llama-bpe", "qwen2",
//                              "gpt-2" (ByteLevel's own regex), "default" for "llama"
//   tokenizer.ggml.tokens      every id below the vocabulary size, ordered by id, added tokens
//                              included; ids with no token are "[PAD<id>]" (type 5, unused)
//   tokenizer.ggml.token_type  1 normal, 2 unknown, 3 control (special added tokens), 4 user
//                              defined (other added tokens), 5 unused, 6 byte (<0xXX>)
//   tokenizer.ggml.scores      "llama" only: -(merge rank) of the merge that builds the token
//   tokenizer.ggml.merges      "gpt2" only: "left right" strings in rank order
//   tokenizer.ggml.{bos,eos,unknown,seperator,padding,cls,mask,eot}_token_id   (u32)
//   tokenizer.ggml.add_{bos,eos,sep}_token   from the TemplateProcessing post-processor,
//                              overridden by tokenizer_config's add_*_token
//   tokenizer.chat_template[.<name>]
// The parsed tokenizer.json is also available (parse_tokenizer_json) for code that wants the
// Hugging Face view directly.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "formats/gguf.h"
#include "src/base/status.h"

namespace kite::hf {

struct AddedToken {
  int64_t id = 0;
  std::string content;
  bool special = false;
  bool lstrip = false, rstrip = false, normalized = false, single_word = false;
};

// The parts of tokenizer.json a BPE vocabulary needs.
struct TokenizerJson {
  std::string model_type;                                   // "BPE" (others are reported, not converted)
  std::vector<std::pair<std::string, int64_t>> vocab;       // model.vocab in id order
  std::vector<std::pair<std::string, std::string>> merges;  // rank order
  std::vector<AddedToken> added_tokens;
  bool byte_fallback = false;
  bool ignore_merges = false;
  std::string unk_token;                   // model.unk_token ("" if none)
  bool byte_level = false;                 // a ByteLevel pre-tokenizer or decoder is present
  bool byte_level_regex = false;           // ByteLevel pre-tokenizer with use_regex (GPT-2's regex)
  std::vector<std::string> split_regexes;  // Split pre-tokenizer patterns, in order
  bool metaspace_prefix = false;           // SPM-style: a "▁" is prepended to the first word
  // The post-processor's single template, as special token names / "$A" (empty if none).
  std::vector<std::string> template_single;
  bool roberta_processing = false;
};

Result<TokenizerJson> parse_tokenizer_json(std::string_view text, const std::string& source);

// What the folder's config.json / generation_config.json say about the vocabulary.
struct TokenizerHints {
  int64_t n_vocab = 0;                  // config vocab_size (0 = the tokenizer's own size)
  std::optional<int64_t> bos_token_id;  // config.json ids: used when tokenizer_config has none
  std::vector<int64_t> eos_token_ids;
  std::optional<int64_t> pad_token_id;
};

// File contents ("" where a file is absent; only tokenizer_json is required).
struct TokenizerFiles {
  std::string tokenizer_json;
  std::string tokenizer_config_json;
  std::string generation_config_json;
  std::string chat_template_jinja;  // transformers 5 keeps the template in its own file
  std::string source;               // folder, for messages
};

Status add_tokenizer_metadata(const TokenizerFiles& files, const TokenizerHints& hints, gguf::Metadata& out);
// Reads the files from an HF folder and adds the keys.
Status add_tokenizer_metadata(const std::string& folder, const TokenizerHints& hints, gguf::Metadata& out);

// <folder>/tokenizer.json (the runtime tokenizer may want the HF view of an HF source).
std::string tokenizer_json_path(const std::string& folder);

// The llama.cpp pre-tokenizer name for a Split regex, or nullopt if kite does not know it.
std::optional<std::string> pre_tokenizer_name(std::string_view split_regex);

}  // namespace kite::hf

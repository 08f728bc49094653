// libFuzzer target: any bytes given to the safetensors reader end in a File or an Error, never a
// crash, hang or allocation larger than the input. Parsed tensors are walked end to end so the
// pointers and sizes handed out are safe to use. Inputs that look like JSON are also fed to the
// other Hugging Face parsers (shard index, config.json, tokenizer.json).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "formats/hf_config.h"
#include "formats/hf_tokenizer.h"
#include "formats/safetensors.h"
#include "src/base/utf8.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto f = kite::safetensors::File::parse_bytes(data, size, "fuzz.safetensors");
  // Messages travel to logs, HTTP responses and the C API: they must stay valid UTF-8.
  if (!f && !kite::valid_utf8(f.error().message)) __builtin_trap();
  if (f) {
    volatile uint8_t sink = 0;
    for (const auto& t : f->tensors()) {
      if (f->find_tensor(t.name) != &t) __builtin_trap();
      if (t.n_elements() < 0) __builtin_trap();
      for (uint64_t i = 0; i < t.nbytes; ++i) sink = sink ^ t.data[i];
      (void)t.info();
    }
  }
  if (size > 0 && data[0] == '{') {
    const std::string_view text(reinterpret_cast<const char*>(data), size);
    auto index = kite::safetensors::Checkpoint::open_index(text, "/nonexistent-kite-fuzz", "fuzz.index.json");
    if (!index && !kite::valid_utf8(index.error().message)) __builtin_trap();
    auto c = kite::hf::parse_config(text, "fuzz/config.json");
    if (!c && !kite::valid_utf8(c.error().message)) __builtin_trap();
    if (c) {
      kite::gguf::Metadata meta("fuzz");
      kite::hf::add_config_metadata(*c, "fuzz", meta);
      (void)kite::hf::llama3_rope_factors(*c);
    }
    kite::hf::TokenizerFiles files;
    files.tokenizer_json = std::string(text);
    files.source = "fuzz";
    kite::gguf::Metadata meta("fuzz");
    auto st = kite::hf::add_tokenizer_metadata(files, kite::hf::TokenizerHints{}, meta);
    if (!st && !kite::valid_utf8(st.error().message)) __builtin_trap();
  }
  return 0;
}

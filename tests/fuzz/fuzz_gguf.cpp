// libFuzzer target: any bytes given to the GGUF reader end in a File or an Error, never a crash,
// hang or allocation larger than the input. Parsed files are also walked (getters, first rows
// dequantized) so the values handed out are safe to use.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "formats/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto f = kite::gguf::File::parse_bytes(data, size, "fuzz.gguf");
  if (!f) return 0;
  const auto& meta = f->metadata();
  for (const auto& kv : meta.entries()) {
    (void)meta.get_int(kv.key);
    (void)meta.get_float(kv.key);
    (void)meta.get<std::string>(kv.key);
    (void)meta.get_array<std::string>(kv.key);
  }
  std::vector<float> row;
  for (const auto& t : f->tensors()) {
    if (t.ne.empty() || t.ne[0] <= 0 || t.ne[0] > 4096) continue;
    const auto* tr = kite::quant::find_traits(t.type);
    if (tr->dequantize == nullptr) continue;
    row.resize(static_cast<size_t>(t.ne[0]));
    if (t.nbytes >= *kite::quant::row_size(t.type, t.ne[0]))
      (void)kite::quant::dequantize_row(t.type, t.data, row.data(), t.ne[0]);
  }
  return 0;
}

#include "tests/gemma_model.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "formats/gguf.h"
#include "src/base/half.h"

namespace kite::test {

Status gemma3_from_qwen3(const std::string& qwen3_gguf, const std::string& out_gguf, const GemmaFromQwen3& o) {
  KITE_ASSIGN_OR_RETURN(gguf::File in, gguf::File::open(qwen3_gguf));
  const gguf::Metadata& m = in.metadata();
  KITE_ASSIGN_OR_RETURN(const std::string arch, m.get<std::string>("general.architecture"));
  if (arch != "qwen3") return make_error(qwen3_gguf, ": making gemma3 from a '", arch, "' model");
  KITE_ASSIGN_OR_RETURN(const int64_t n_embd, m.get_int("qwen3.embedding_length"));
  const bool tied = in.find_tensor("output.weight") == nullptr;

  gguf::Writer w;
  w.set_version(in.version());
  for (const gguf::KeyValue& kv : m.entries()) {
    std::string key = kv.key;
    if (key.rfind("qwen3.", 0) == 0) key = "gemma3." + key.substr(6);
    w.metadata().set(key, key == "general.architecture" ? gguf::Value(std::string("gemma3")) : kv.value);
  }
  w.metadata().set("gemma3.attention.sliding_window", static_cast<uint32_t>(o.window));
  w.metadata().set("gemma3.attention.sliding_window_pattern", static_cast<uint32_t>(o.pattern));
  w.metadata().set("gemma3.rope.scaling.type", std::string("linear"));
  w.metadata().set("gemma3.rope.scaling.factor", o.rope_linear);

  // Each output tensor: a scaled copy of an input one, or a constant norm.
  struct Out {
    const gguf::TensorInfo* src;  // null: the constant
    float scale;
  };
  std::vector<Out> outs;
  const float embd_scale = 1.f / std::sqrt(static_cast<float>(n_embd));
  for (const gguf::TensorInfo& t : in.tensors()) {
    float s = 1.f;
    const std::string& n = t.name;
    auto ends = [&](const char* suffix) { return n.size() > std::strlen(suffix) && n.ends_with(suffix); };
    if (n == "token_embd.weight") s = embd_scale;
    else if (n == "output_norm.weight" && tied) s = 1.f / embd_scale;
    else if (ends("ffn_gate.weight")) s = 1.f / 1.702f;
    else if (ends("ffn_up.weight")) s = 1.702f;
    if (s != 1.f && t.type != quant::Type::F16 && t.type != quant::Type::F32)
      return make_error(qwen3_gguf, ": tensor '", n, "' is not F16 or F32");
    outs.push_back({&t, s});
    KITE_TRY(w.add_tensor(n, t.type, t.ne));
    const bool attn_out = ends("attn_output.weight"), ffn_down = ends("ffn_down.weight");
    if (attn_out || ffn_down) {
      const std::string blk = n.substr(0, n.find('.', 4) + 1);  // "blk.N."
      outs.push_back({nullptr, attn_out ? o.attn_post_norm : o.ffn_post_norm});
      KITE_TRY(w.add_tensor(blk + (attn_out ? "post_attention_norm.weight" : "post_ffw_norm.weight"),
                            quant::Type::F32, {n_embd}));
    }
  }

  KITE_TRY(w.begin(out_gguf));
  for (const Out& out : outs) {
    if (out.src == nullptr) {
      const std::vector<float> c(static_cast<size_t>(n_embd), out.scale);
      KITE_TRY(w.write_tensor_data(c.data(), c.size() * sizeof(float)));
      continue;
    }
    const gguf::TensorInfo& t = *out.src;
    if (out.scale == 1.f) {
      KITE_TRY(w.write_tensor_data(t.data, t.nbytes));
      continue;
    }
    std::vector<uint8_t> bytes(t.data, t.data + t.nbytes);
    const auto n = static_cast<size_t>(t.n_elements());
    if (t.type == quant::Type::F16) {
      auto* h = reinterpret_cast<uint16_t*>(bytes.data());
      for (size_t i = 0; i < n; ++i) h[i] = fp32_to_fp16(fp16_to_fp32(h[i]) * out.scale);
    } else {
      auto* f = reinterpret_cast<float*>(bytes.data());
      for (size_t i = 0; i < n; ++i) f[i] *= out.scale;
    }
    KITE_TRY(w.write_tensor_data(bytes.data(), bytes.size()));
  }
  return w.finish();
}

}  // namespace kite::test

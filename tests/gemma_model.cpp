#include "tests/gemma_model.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "formats/gguf.h"
#include "src/base/half.h"

namespace kite::test {
namespace {

// llama.cpp writes llama's Q/K rows permuted for its interleaved rope: row (h, 2 b + a) of a head
// holds Hugging Face's row (h, a * hd / 2 + b). The rows back in HF (neox) order.
std::vector<uint8_t> unpermute_rows(const gguf::TensorInfo& t, int64_t n_head) {
  const int64_t rows = t.ne[1], hd = rows / n_head;
  const size_t row = t.nbytes / static_cast<size_t>(rows);
  std::vector<uint8_t> out(t.nbytes);
  for (int64_t h = 0; h < n_head; ++h)
    for (int64_t a = 0; a < 2; ++a)
      for (int64_t b = 0; b < hd / 2; ++b)
        std::memcpy(out.data() + static_cast<size_t>(h * hd + a * hd / 2 + b) * row,
                    t.data + static_cast<size_t>(h * hd + 2 * b + a) * row, row);
  return out;
}

}  // namespace

Status make_gemma(const std::string& dense_gguf, const std::string& out_gguf, const GemmaOptions& o) {
  KITE_ASSIGN_OR_RETURN(gguf::File in, gguf::File::open(dense_gguf));
  const gguf::Metadata& m = in.metadata();
  KITE_ASSIGN_OR_RETURN(const std::string arch, m.get<std::string>("general.architecture"));
  const bool gemma2 = o.arch == "gemma2";
  if (o.arch != "gemma2" && o.arch != "gemma3") return make_error("making a '", o.arch, "' model");
  if (arch != (gemma2 ? "llama" : "qwen3"))
    return make_error(dense_gguf, ": ", o.arch, " is made from ", gemma2 ? "llama" : "qwen3", ", not '", arch, "'");
  const std::string p = arch + ".";
  KITE_ASSIGN_OR_RETURN(const int64_t n_embd, m.get_int(p + "embedding_length"));
  KITE_ASSIGN_OR_RETURN(const int64_t n_head, m.get_int(p + "attention.head_count"));
  const int64_t n_head_kv = m.has(p + "attention.head_count_kv") ? *m.get_int(p + "attention.head_count_kv") : n_head;
  if (in.find_tensor("output.weight") != nullptr) return make_error(dense_gguf, ": gemma ties its LM head");

  gguf::Writer w;
  w.set_version(in.version());
  for (const gguf::KeyValue& kv : m.entries()) {
    std::string key = kv.key;
    if (key.rfind(p, 0) == 0) key = o.arch + "." + key.substr(p.size());
    w.metadata().set(key, key == "general.architecture" ? gguf::Value(o.arch) : kv.value);
  }
  const std::string q = o.arch + ".";
  w.metadata().set(q + "attention.sliding_window", static_cast<uint32_t>(o.window));
  w.metadata().set(q + "attention.sliding_window_pattern", static_cast<uint32_t>(o.pattern));
  if (gemma2) {
    w.metadata().set(q + "attn_logit_softcapping", o.attn_softcap);
    w.metadata().set(q + "final_logit_softcapping", o.final_softcap);
  } else {
    w.metadata().set(q + "rope.scaling.type", std::string("linear"));
    w.metadata().set(q + "rope.scaling.factor", o.rope_linear);
  }

  // Each output tensor: a scaled (or, llama's Q/K, reordered) copy of an input one, or a
  // constant norm.
  struct Out {
    const gguf::TensorInfo* src;  // null: the constant
    float scale;
    int64_t unpermute_heads;  // > 0: rows back in neox order
  };
  std::vector<Out> outs;
  const float embd_scale = 1.f / std::sqrt(static_cast<float>(n_embd));
  for (const gguf::TensorInfo& t : in.tensors()) {
    float s = 1.f;
    const std::string& n = t.name;
    auto ends = [&](const char* suffix) { return n.size() > std::strlen(suffix) && n.ends_with(suffix); };
    if (n == "token_embd.weight") s = embd_scale;
    else if (n == "output_norm.weight") s = 1.f / embd_scale;
    else if (ends("ffn_gate.weight")) s = 1.f / 1.702f;
    else if (ends("ffn_up.weight")) s = 1.702f;
    if (s != 1.f && t.type != quant::Type::F16 && t.type != quant::Type::F32)
      return make_error(dense_gguf, ": tensor '", n, "' is not F16 or F32");
    const int64_t heads = !gemma2 ? 0 : ends("attn_q.weight") ? n_head : ends("attn_k.weight") ? n_head_kv : 0;
    outs.push_back({&t, s, heads});
    KITE_TRY(w.add_tensor(n, t.type, t.ne));
    const bool attn_out = ends("attn_output.weight"), ffn_down = ends("ffn_down.weight");
    if (attn_out || ffn_down) {
      const std::string blk = n.substr(0, n.find('.', 4) + 1);  // "blk.N."
      outs.push_back({nullptr, o.post_norm, 0});
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
    if (out.unpermute_heads > 0) {
      const std::vector<uint8_t> rows = unpermute_rows(t, out.unpermute_heads);
      KITE_TRY(w.write_tensor_data(rows.data(), rows.size()));
      continue;
    }
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

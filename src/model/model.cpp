// Loading a model's weights and building its forward graph (llama, qwen2, qwen3, qwen3moe,
// gemma2 and gemma3 share it: qwen2 adds Q/K/V biases, qwen3 per-head Q/K RMS norms; a
// mixture-of-experts FFN replaces the dense one in qwen3moe and in llama files with experts, e.g.
// Mixtral; gemma adds norms after attention and the FFN, a gelu-gated FFN, a scaled embedding,
// sliding-window layers and (gemma2) soft-capped scores and logits).
#include "src/model/model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <unordered_set>

#include "src/base/half.h"
#include "src/base/mapped_file.h"

namespace kite {

Result<std::shared_ptr<Model>> Model::load(const std::string& path) { return load(path, LoadOptions{}); }

Result<std::shared_ptr<Model>> Model::load(const std::string& path, const LoadOptions& opts) {
  KITE_ASSIGN_OR_RETURN(auto source, WeightSource::open(path));
  return from_source(std::move(source), opts);
}

Result<std::shared_ptr<Model>> Model::from_source(std::unique_ptr<WeightSource> source, const LoadOptions& opts) {
  std::shared_ptr<Model> m(new Model());
  m->source_ = std::move(source);
  KITE_ASSIGN_OR_RETURN(m->hp_, HParams::from(*m->source_));
  KITE_TRY(m->load_weights(opts));
  return m;
}

// Every lookup (found or optional and absent) is one step of the load's progress.
Result<Tensor*> Model::weight(const std::string& name, bool required) {
  if (load_opts_ != nullptr && load_opts_->progress) {
    load_done_ = std::min(load_done_ + 1, load_total_);
    if (!load_opts_->progress(load_done_, load_total_))
      return make_error(source_->path(), ": loading cancelled (at tensor '", name, "', ", load_done_, " of ",
                        load_total_, ")");
  }
  const TensorInfo* info = source_->find_tensor(name);
  if (info == nullptr) {
    if (!required) return static_cast<Tensor*>(nullptr);
    return make_error(source_->path(), ": missing tensor '", name, "'");
  }
  auto t = std::make_unique<Tensor>();
  t->name = name;
  t->type = info->type;
  for (size_t d = 0; d < info->ne.size(); ++d) t->ne[d] = info->ne[d];
  t->data = const_cast<uint8_t*>(info->data);
  if (info->ne.size() == 1 && t->type != DType::F32) {
    // Small 1-D tensors (norms, biases) become F32 rows.
    const quant::TypeTraits* tr = quant::find_traits(t->type);
    if (tr == nullptr || (tr->dequantize == nullptr && t->type != DType::F16 && t->type != DType::BF16))
      return make_error(source_->path(), ": tensor '", name, "' has a type kite cannot read");
    std::vector<float>& f = f32_copies_.emplace_back(static_cast<size_t>(t->ne[0]));
    for (int64_t i = 0; i < t->ne[0]; ++i) {
      if (t->type == DType::F16) f[static_cast<size_t>(i)] = fp16_to_fp32(reinterpret_cast<const uint16_t*>(info->data)[i]);
      else if (t->type == DType::BF16) f[static_cast<size_t>(i)] = bf16_to_fp32(reinterpret_cast<const uint16_t*>(info->data)[i]);
    }
    if (t->type != DType::F16 && t->type != DType::BF16) tr->dequantize(info->data, f.data(), t->ne[0]);
    t->type = DType::F32;
    t->data = f.data();
  }
  t->nb = contiguous_strides(t->type, t->ne);
  tensors_.push_back(std::move(t));
  return tensors_.back().get();
}

Status Model::load_weights(const LoadOptions& opts) {
  const HParams& hp = hp_;
  // The lookups below: 4 model-wide tensors and 14 per layer (15 with experts, 16 in gemma).
  constexpr size_t kGlobalLookups = 4;
  const size_t layer_lookups = hp.n_expert > 0 ? 15 : hp.gemma ? 16 : 14;
  load_opts_ = &opts;
  load_done_ = 0;
  load_total_ = kGlobalLookups + layer_lookups * static_cast<size_t>(std::max<int64_t>(hp.n_layer, 0));
  struct Reset {
    const LoadOptions** p;
    ~Reset() { *p = nullptr; }
  } reset{&load_opts_};
  KITE_ASSIGN_OR_RETURN(tok_embd_, weight("token_embd.weight"));
  KITE_ASSIGN_OR_RETURN(output_norm_, weight("output_norm.weight"));
  KITE_ASSIGN_OR_RETURN(output_, weight("output.weight", false));
  if (output_ == nullptr) output_ = tok_embd_;  // tied embeddings
  KITE_ASSIGN_OR_RETURN(rope_freqs_, weight("rope_freqs.weight", false));
  if (rope_freqs_ != nullptr && rope_freqs_->type != DType::F32)
    return make_error(source_->path(), ": rope_freqs.weight is ", quant::find_traits(rope_freqs_->type)->name,
                      ", expected F32");
  if (rope_freqs_ != nullptr && rope_freqs_->ne[0] * 2 < hp.rope.n_rot)
    return make_error(source_->path(), ": rope_freqs.weight has ", rope_freqs_->ne[0], " entries, expected ",
                      hp.rope.n_rot / 2);
  const int64_t q_dim = hp.n_head * hp.head_dim, kv_dim = hp.n_head_kv * hp.head_dim;
  auto expect = [&](Tensor* t, int64_t ne0, int64_t ne1) -> Status {
    if (t != nullptr && (t->ne[0] != ne0 || t->ne[1] != ne1))
      return make_error(source_->path(), ": tensor '", t->name, "' has shape [", t->ne[0], ", ", t->ne[1],
                        "], expected [", ne0, ", ", ne1, "]");
    return ok_status();
  };
  auto expect3 = [&](Tensor* t, int64_t ne0, int64_t ne1, int64_t ne2) -> Status {
    if (t->ne[0] != ne0 || t->ne[1] != ne1 || t->ne[2] != ne2 || t->ne[3] != 1)
      return make_error(source_->path(), ": tensor '", t->name, "' has shape [", t->ne[0], ", ", t->ne[1], ", ",
                        t->ne[2], ", ", t->ne[3], "], expected [", ne0, ", ", ne1, ", ", ne2, "]");
    return ok_status();
  };
  KITE_TRY(expect(tok_embd_, hp.n_embd, hp.n_vocab));
  KITE_TRY(expect(output_, hp.n_embd, hp.n_vocab));
  layers_.resize(static_cast<size_t>(hp.n_layer));
  for (int64_t i = 0; i < hp.n_layer; ++i) {
    LayerWeights& l = layers_[static_cast<size_t>(i)];
    const std::string b = "blk." + std::to_string(i) + ".";
    KITE_ASSIGN_OR_RETURN(l.attn_norm, weight(b + "attn_norm.weight"));
    KITE_ASSIGN_OR_RETURN(l.wq, weight(b + "attn_q.weight"));
    KITE_ASSIGN_OR_RETURN(l.wk, weight(b + "attn_k.weight"));
    KITE_ASSIGN_OR_RETURN(l.wv, weight(b + "attn_v.weight"));
    KITE_ASSIGN_OR_RETURN(l.wo, weight(b + "attn_output.weight"));
    KITE_ASSIGN_OR_RETURN(l.bq, weight(b + "attn_q.bias", false));
    KITE_ASSIGN_OR_RETURN(l.bk, weight(b + "attn_k.bias", false));
    KITE_ASSIGN_OR_RETURN(l.bv, weight(b + "attn_v.bias", false));
    KITE_ASSIGN_OR_RETURN(l.q_norm, weight(b + "attn_q_norm.weight", false));
    KITE_ASSIGN_OR_RETURN(l.k_norm, weight(b + "attn_k_norm.weight", false));
    KITE_ASSIGN_OR_RETURN(l.ffn_norm, weight(b + "ffn_norm.weight"));
    if (hp.gemma) {
      KITE_ASSIGN_OR_RETURN(l.attn_post_norm, weight(b + "post_attention_norm.weight"));
      KITE_ASSIGN_OR_RETURN(l.ffn_post_norm, weight(b + "post_ffw_norm.weight"));
    }
    if (hp.n_expert > 0) {
      KITE_ASSIGN_OR_RETURN(l.ffn_gate_inp, weight(b + "ffn_gate_inp.weight"));
      KITE_ASSIGN_OR_RETURN(l.ffn_gate_exps, weight(b + "ffn_gate_exps.weight"));
      KITE_ASSIGN_OR_RETURN(l.ffn_up_exps, weight(b + "ffn_up_exps.weight"));
      KITE_ASSIGN_OR_RETURN(l.ffn_down_exps, weight(b + "ffn_down_exps.weight"));
      KITE_TRY(expect(l.ffn_gate_inp, hp.n_embd, hp.n_expert));
      KITE_TRY(expect3(l.ffn_gate_exps, hp.n_embd, hp.n_ff_exp, hp.n_expert));
      KITE_TRY(expect3(l.ffn_up_exps, hp.n_embd, hp.n_ff_exp, hp.n_expert));
      KITE_TRY(expect3(l.ffn_down_exps, hp.n_ff_exp, hp.n_embd, hp.n_expert));
    } else {
      KITE_ASSIGN_OR_RETURN(l.w_gate, weight(b + "ffn_gate.weight"));
      KITE_ASSIGN_OR_RETURN(l.w_up, weight(b + "ffn_up.weight"));
      KITE_ASSIGN_OR_RETURN(l.w_down, weight(b + "ffn_down.weight"));
    }
    KITE_TRY(expect(l.wq, hp.n_embd, q_dim));
    KITE_TRY(expect(l.wk, hp.n_embd, kv_dim));
    KITE_TRY(expect(l.wv, hp.n_embd, kv_dim));
    KITE_TRY(expect(l.wo, q_dim, hp.n_embd));
    KITE_TRY(expect(l.w_gate, hp.n_embd, hp.n_ff));
    KITE_TRY(expect(l.w_up, hp.n_embd, hp.n_ff));
    KITE_TRY(expect(l.w_down, hp.n_ff, hp.n_embd));
    // The 1-D tensors too: a kernel reads a bias or a norm weight as long as its rows.
    for (auto [t, n] : {std::pair{l.attn_norm, hp.n_embd}, {l.ffn_norm, hp.n_embd}, {l.attn_post_norm, hp.n_embd},
                        {l.ffn_post_norm, hp.n_embd}, {l.bq, q_dim}, {l.bk, kv_dim}, {l.bv, kv_dim},
                        {l.q_norm, hp.head_dim}, {l.k_norm, hp.head_dim}})
      KITE_TRY(expect(t, n, 1));
  }
  KITE_TRY(expect(output_norm_, hp.n_embd, 1));
  // The first forward pass reads every weight: read them in now, in address (file) order and
  // in large reads.
  std::vector<std::pair<const uint8_t*, size_t>> spans;
  for (const auto& t : tensors_) spans.emplace_back(static_cast<const uint8_t*>(t->data), t->nbytes());
  std::sort(spans.begin(), spans.end());
  for (size_t i = 0; i < spans.size();) {
    const uint8_t* begin = spans[i].first;
    const uint8_t* end = begin + spans[i].second;
    for (++i; i < spans.size() && spans[i].first <= end + (size_t{1} << 20); ++i)
      end = std::max(end, spans[i].first + spans[i].second);
    populate_mapping(begin, static_cast<size_t>(end - begin));
  }
  // Everything is prepared: the last report is always done == total.
  if (opts.progress && load_done_ < load_total_ && !opts.progress(load_total_, load_total_))
    return make_error(source_->path(), ": loading cancelled (after the last tensor)");
  return ok_status();
}

Tensor* Model::build_forward(Graph& g, const ForwardInputs& in, const KvTensors& kv, OutputKind kind,
                             TpRank tp) const {
  const HParams hp = tp.world > 1 ? rank_hparams(tp.world) : hp_;
  const std::vector<LayerWeights>& layers = layers_for(tp);
  const int64_t n = in.tokens->ne[0];
  const int64_t hd = hp.head_dim;
  AttentionParams ap;
  ap.n_kv_head = static_cast<int32_t>(hp.n_head_kv);
  ap.block_size = kv.block_size;
  ap.scale = hp.attn_scale != 0.f ? hp.attn_scale : 1.f / std::sqrt(static_cast<float>(hd));
  ap.softcap = hp.attn_softcap;

  // Names ("l3.attn_out") make --dump-ops output readable.
  auto nm = [](Tensor* t, size_t il, const char* what) {
    // (Formatted, not concatenated: g++ 12 -O3 warns falsely (-Wrestrict) on the string operators.)
    char buf[96];
    const int n = std::snprintf(buf, sizeof buf, "l%zu.%s", il, what);
    t->name = std::string(buf, static_cast<size_t>(std::clamp(n, 0, static_cast<int>(sizeof buf) - 1)));
    return t;
  };
  g.set_layer(-1);
  Tensor* x = g.get_rows(tok_embd_, in.tokens);  // [n_embd, n]
  x->name = "embd";
  if (hp.gemma) x = g.scale(x, std::sqrt(static_cast<float>(hp.n_embd)));
  // Under tensor parallelism a row-parallel product is this rank's share: sum the ranks'.
  auto reduce = [&](Tensor* t) { return tp.world > 1 ? g.all_reduce(t) : t; };
  for (size_t il = 0; il < layers.size(); ++il) {
    const LayerWeights& l = layers[il];
    g.set_layer(static_cast<int32_t>(il));
    // Attention block: x += Wo · attention(rope(Wq·h), rope(Wk·h), Wv·h), h = norm(x).
    Tensor* h = nm(g.rms_norm(x, l.attn_norm, hp.rms_eps), il, "attn_norm");
    Tensor* q = nm(g.mul_mat(l.wq, h, l.bq), il, "q");  // (biases: qwen2)
    Tensor* k = nm(g.mul_mat(l.wk, h, l.bk), il, "k");
    Tensor* v = nm(g.mul_mat(l.wv, h, l.bv), il, "v");
    q = g.reshape(q, {hd, hp.n_head, n});
    k = g.reshape(k, {hd, hp.n_head_kv, n});
    if (l.q_norm != nullptr) q = nm(g.rms_norm(q, l.q_norm, hp.rms_eps), il, "q_norm");  // qwen3: per head
    if (l.k_norm != nullptr) k = nm(g.rms_norm(k, l.k_norm, hp.rms_eps), il, "k_norm");
    const bool swa = hp.is_swa(static_cast<int64_t>(il));  // (gemma: a sliding-window layer)
    const RopeParams& rope = swa ? hp.rope_swa : hp.rope;
    q = nm(g.rope(q, in.positions, rope, rope_freqs_), il, "q_rope");
    k = nm(g.rope(k, in.positions, rope, rope_freqs_), il, "k_rope");
    Tensor* kc = g.kv_write(kv.k[il], g.reshape(k, {hd * hp.n_head_kv, n}), in.kv_slots);
    Tensor* vc = g.kv_write(kv.v[il], v, in.kv_slots);
    ap.window = swa ? hp.n_swa : 0;
    Tensor* a = nm(g.attention(q, kc, vc, in.positions, in.token_seq, in.block_table, ap), il, "attn");
    Tensor* ao = reduce(nm(g.mul_mat(l.wo, a), il, "attn_out"));
    if (l.attn_post_norm != nullptr) ao = nm(g.rms_norm(ao, l.attn_post_norm, hp.rms_eps), il, "attn_post_norm");
    x = nm(g.add(x, ao), il, "attn_res");
    // Feed-forward block: x += W_down · (silu(W_gate·h) * W_up·h), h = norm(x).
    h = nm(g.rms_norm(x, l.ffn_norm, hp.rms_eps), il, "ffn_norm");
    if (l.ffn_gate_inp != nullptr) {  // the same with each token's chosen experts, weighted
      const auto n_used = static_cast<int32_t>(hp.n_expert_used);
      Tensor* route = nm(g.top_k(nm(g.mul_mat(l.ffn_gate_inp, h), il, "router"), n_used, true), il, "route");
      Tensor* hx = g.reshape(h, {hp.n_embd, 1, n});
      Tensor* f = nm(g.swiglu(nm(g.mul_mat_id(l.ffn_gate_exps, hx, route, n_used), il, "gate_exps"),
                              nm(g.mul_mat_id(l.ffn_up_exps, hx, route, n_used), il, "up_exps")),
                     il, "swiglu_exps");
      Tensor* y = nm(g.mul_mat_id(l.ffn_down_exps, f, route, n_used), il, "down_exps");
      x = nm(g.add(x, nm(g.moe_sum(y, route, n_used, true, hp.expert_weights_scale), il, "ffn_out")), il, "ffn_res");
      continue;
    }
    Tensor* gate = nm(g.mul_mat(l.w_gate, h), il, "gate");
    Tensor* up = nm(g.mul_mat(l.w_up, h), il, "up");
    Tensor* f = hp.gemma ? nm(g.geglu(gate, up), il, "geglu") : nm(g.swiglu(gate, up), il, "swiglu");
    Tensor* fo = reduce(nm(g.mul_mat(l.w_down, f), il, "ffn_out"));
    if (l.ffn_post_norm != nullptr) fo = nm(g.rms_norm(fo, l.ffn_post_norm, hp.rms_eps), il, "ffn_post_norm");
    x = nm(g.add(x, fo), il, "ffn_res");
  }
  // Only the rows whose outputs are wanted go through the final norm and the LM head.
  g.set_layer(static_cast<int32_t>(layers.size()));
  x = g.get_rows(x, in.out_rows);
  x = g.rms_norm(x, output_norm_, hp.rms_eps);
  x->name = "output_norm";
  if (kind == OutputKind::kHidden) {  // embeddings: the normed hidden state, no LM head
    g.build(x);
    return x;
  }
  Tensor* logits = g.mul_mat(output_, x);
  if (hp.final_softcap > 0.f) logits = g.softcap(logits, hp.final_softcap);
  logits->name = "logits";
  g.build(logits);
  return logits;
}

size_t Model::weight_bytes(const std::function<bool(int32_t layer)>& part,
                           const std::function<bool(const Tensor&)>& skip, TpRank tp) const {
  const std::vector<LayerWeights>& layers = layers_for(tp);
  std::unordered_set<const void*> seen;
  size_t bytes = 0;
  auto add = [&](const Tensor* t) {
    if (t != nullptr && seen.insert(t->data).second && !(skip && skip(*t))) bytes += t->nbytes();
  };
  if (part(-1)) add(tok_embd_);
  for (size_t il = 0; il < layers.size(); ++il) {
    if (!part(static_cast<int32_t>(il))) continue;
    const LayerWeights& l = layers[il];
    for (const Tensor* t :
         {l.attn_norm, l.wq, l.wk, l.wv, l.wo, l.bq, l.bk, l.bv, l.q_norm, l.k_norm, l.attn_post_norm, l.ffn_norm,
          l.ffn_post_norm, l.w_gate, l.w_up, l.w_down, l.ffn_gate_inp, l.ffn_gate_exps, l.ffn_up_exps,
          l.ffn_down_exps})
      add(t);
    add(rope_freqs_);
  }
  if (part(static_cast<int32_t>(layers.size()))) {
    add(output_norm_);
    add(output_);
  }
  return bytes;
}

}  // namespace kite

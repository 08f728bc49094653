#include "src/runtime/imatrix.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "formats/gguf.h"
#include "src/runtime/context.h"
#include "src/runtime/perplexity.h"

namespace kite {
namespace {

constexpr std::string_view kSumSuffix = ".in_sum2";
constexpr std::string_view kCountSuffix = ".counts";

bool strip_suffix(std::string& s, std::string_view suffix) {
  if (!s.ends_with(suffix)) return false;
  s.resize(s.size() - suffix.size());
  return true;
}

// The F32 values of a tensor of the file (copied: the mapping gives no alignment guarantee).
Result<std::vector<float>> f32_values(const gguf::File& f, const TensorInfo& t) {
  if (t.type != quant::Type::F32)
    return make_error(f.path(), ": tensor '", t.name, "' is ", quant::find_traits(t.type)->name, ", expected f32");
  std::vector<float> v(static_cast<size_t>(t.n_elements()));
  if (t.nbytes != v.size() * sizeof(float))
    return make_error(f.path(), ": tensor '", t.name, "' has ", t.nbytes, " bytes, expected ", v.size() * sizeof(float));
  std::memcpy(v.data(), t.data, t.nbytes);
  return v;
}

}  // namespace

std::map<std::string, std::vector<float>> Imatrix::importance() const {
  std::map<std::string, std::vector<float>> out;
  for (const auto& [name, e] : entries) {
    if (std::all_of(e.counts.begin(), e.counts.end(), [](int64_t c) { return c <= 0; })) continue;
    std::vector<float>& v = out[name];
    v.resize(e.sum2.size());
    const auto n = static_cast<size_t>(e.n_cols());
    for (size_t j = 0; j < v.size(); ++j) {
      const int64_t c = e.counts[j / n];
      v[j] = c > 0 ? static_cast<float>(e.sum2[j] / static_cast<double>(c)) : 1.f;
    }
  }
  return out;
}

Status save_imatrix(const Imatrix& m, const std::string& path) {
  if (m.entries.empty()) return make_error(path, ": the importance matrix has no entries (no matmul was observed)");
  gguf::Writer w;
  w.metadata().set("general.type", gguf::Value("imatrix"));
  gguf::Array datasets{gguf::ValueType::STRING, {}};
  for (const auto& d : m.datasets) datasets.items.emplace_back(d);
  w.metadata().set("imatrix.datasets", gguf::Value(std::move(datasets)));
  w.metadata().set("imatrix.chunk_count", gguf::Value(m.chunk_count));
  w.metadata().set("imatrix.chunk_size", gguf::Value(m.chunk_size));
  for (const auto& [name, e] : m.entries) {  // std::map: name order, as llama-imatrix writes
    const auto n_mat = static_cast<int64_t>(e.counts.size());
    KITE_TRY(w.add_tensor(name + std::string(kSumSuffix), quant::Type::F32, {e.n_cols(), n_mat}));
    KITE_TRY(w.add_tensor(name + std::string(kCountSuffix), quant::Type::F32, {1, n_mat}));
  }
  KITE_TRY(w.begin(path));
  std::vector<float> buf;
  for (const auto& [name, e] : m.entries) {
    buf.assign(e.sum2.begin(), e.sum2.end());
    KITE_TRY(w.write_tensor_data(buf.data(), buf.size() * sizeof(float)));
    buf.assign(e.counts.begin(), e.counts.end());
    KITE_TRY(w.write_tensor_data(buf.data(), buf.size() * sizeof(float)));
  }
  return w.finish();
}

Result<Imatrix> load_imatrix(const std::string& path) {
  KITE_ASSIGN_OR_RETURN(gguf::File f, gguf::File::open(path));
  const gguf::Metadata& meta = f.metadata();
  if (auto type = meta.get<std::string>("general.type"); type.ok() && *type != "imatrix")
    return make_error(path, ": general.type is '", *type, "', expected 'imatrix'");
  Imatrix m;
  if (meta.has("imatrix.datasets")) {
    KITE_ASSIGN_OR_RETURN(m.datasets, meta.get_array<std::string>("imatrix.datasets"));
  }
  if (auto c = meta.get_int("imatrix.chunk_count"); c.ok()) m.chunk_count = static_cast<uint32_t>(*c);
  if (auto c = meta.get_int("imatrix.chunk_size"); c.ok()) m.chunk_size = static_cast<uint32_t>(*c);

  std::map<std::string, std::pair<const TensorInfo*, const TensorInfo*>> parts;
  for (const TensorInfo& t : f.tensors()) {
    std::string name = t.name;
    if (strip_suffix(name, kSumSuffix)) parts[name].first = &t;
    else if (strip_suffix(name, kCountSuffix)) parts[name].second = &t;
  }
  if (parts.empty()) return make_error(path, ": no '*.in_sum2' / '*.counts' tensors: not an imatrix file");
  for (const auto& [name, p] : parts) {
    if (p.first == nullptr || p.second == nullptr)
      return make_error(path, ": entry '", name, "' has ", p.first ? "in_sum2 but no counts" : "counts but no in_sum2");
    KITE_ASSIGN_OR_RETURN(std::vector<float> sums, f32_values(f, *p.first));
    KITE_ASSIGN_OR_RETURN(std::vector<float> counts, f32_values(f, *p.second));
    // (One matrix, or one an expert: in_sum2 [n_cols, n_mat], counts [1, n_mat].)
    const int64_t n_mat = static_cast<int64_t>(counts.size());
    if (sums.empty() || counts.empty() || p.first->ne[0] * n_mat != static_cast<int64_t>(sums.size()))
      return make_error(path, ": entry '", name, "': in_sum2 has shape [", p.first->ne[0], ", ",
                        p.first->ne.size() > 1 ? p.first->ne[1] : 1, "] for ", n_mat, " counts, expected [n_cols, ",
                        n_mat, "]");
    ImatrixEntry e;
    for (float c : counts) {
      if (!std::isfinite(c) || c < 0) return make_error(path, ": entry '", name, "' has count ", c);
      e.counts.push_back(static_cast<int64_t>(c));
    }
    e.sum2.resize(sums.size());
    for (size_t j = 0; j < sums.size(); ++j) {
      if (!std::isfinite(sums[j]) || sums[j] < 0)
        return make_error(path, ": entry '", name, "' column ", j, " has sum ", sums[j], " (expected finite, >= 0)");
      e.sum2[j] = sums[j];
    }
    m.entries.emplace(name, std::move(e));
  }
  return m;
}

std::function<Status(const Tensor&, const Backend&)> ImatrixCollector::observer() {
  return [this](const Tensor& node, const Backend& backend) { return observe(node, backend); };
}

// A mixture-of-experts product: each (token, slot) row of the activations under the expert the
// route chose for it.
Status ImatrixCollector::observe_experts(const Tensor& node, const Backend& backend) {
  const Tensor* w = node.src[0];
  const Tensor* a = node.src[1];
  const Tensor* route = node.src[2];
  const int32_t n_used = node.params.i[0];
  const int64_t k = w->ne[0], n_expert = w->ne[2];
  if (a->type != DType::F32 || route->type != DType::F32 || !route->is_contiguous())
    return make_error("imatrix: the activations or route of '", w->name, "' are not F32");
  bytes_.resize(a->nbytes());
  KITE_TRY(backend.download(*a, bytes_.data(), bytes_.size()));
  std::vector<float> r(static_cast<size_t>(route->n_elements()));
  KITE_TRY(backend.download(*route, r.data(), r.size() * sizeof(float)));
  ImatrixEntry& e = m_.entries[w->name];
  if (e.sum2.empty()) {
    e.sum2.assign(static_cast<size_t>(k * n_expert), 0.0);
    e.counts.assign(static_cast<size_t>(n_expert), 0);
  }
  if (e.counts.size() != static_cast<size_t>(n_expert) || e.n_cols() != k)
    return make_error("imatrix: '", w->name, "' seen as ", n_expert, " experts of ", k, " columns, earlier as ",
                      e.counts.size(), " of ", e.n_cols());
  for (int64_t t = 0; t < a->ne[2]; ++t)
    for (int32_t j = 0; j < n_used; ++j) {
      const float id = r[static_cast<size_t>(t * route->ne[0] + n_used + j)];
      if (!(id >= 0.f && id < static_cast<float>(n_expert))) continue;  // (a route's padding)
      const auto ex = static_cast<size_t>(id);
      const auto* x = reinterpret_cast<const float*>(bytes_.data() + (a->ne[1] == 1 ? 0 : j) * a->nb[1] + t * a->nb[2]);
      double* acc = e.sum2.data() + ex * static_cast<size_t>(k);
      for (int64_t i = 0; i < k; ++i) acc[i] += static_cast<double>(x[i]) * x[i];
      ++e.counts[ex];
    }
  for (double v : e.sum2)
    if (!std::isfinite(v)) return make_error("imatrix: non-finite activations in the input of '", w->name, "'");
  return ok_status();
}

Status ImatrixCollector::observe(const Tensor& node, const Backend& backend) {
  if (node.op == Op::kMulMatId && node.src[0]->name.starts_with("blk.")) return observe_experts(node, backend);
  if (node.op != Op::kMulMat) return ok_status();
  const Tensor* w = node.src[0];
  const Tensor* a = node.src[1];
  if (w == nullptr || a == nullptr || w->name.empty()) return ok_status();
  if (!w->name.starts_with("blk.") && !include_output_) return ok_status();
  if (w->ne[2] != 1 || w->ne[3] != 1) return ok_status();  // only 2-D weights
  if (a->type != DType::F32)
    return make_error("imatrix: the activations of '", w->name, "' are not F32");
  if (a->ne[0] != w->ne[0])
    return make_error("imatrix: '", w->name, "' has ", w->ne[0], " columns but its activations have ", a->ne[0]);
  bytes_.resize(a->nbytes());
  KITE_TRY(backend.download(*a, bytes_.data(), bytes_.size()));
  ImatrixEntry& e = m_.entries[w->name];
  if (e.sum2.empty()) {
    e.sum2.assign(static_cast<size_t>(w->ne[0]), 0.0);
    e.counts.assign(1, 0);
  }
  if (e.sum2.size() != static_cast<size_t>(w->ne[0]) || e.counts.size() != 1)
    return make_error("imatrix: '", w->name, "' seen with ", w->ne[0], " columns, earlier with ", e.n_cols());
  for (int64_t i3 = 0; i3 < a->ne[3]; ++i3)
    for (int64_t i2 = 0; i2 < a->ne[2]; ++i2)
      for (int64_t i1 = 0; i1 < a->ne[1]; ++i1) {
        const auto* x = reinterpret_cast<const float*>(bytes_.data() + i1 * a->nb[1] + i2 * a->nb[2] + i3 * a->nb[3]);
        for (int64_t j = 0; j < a->ne[0]; ++j) e.sum2[static_cast<size_t>(j)] += static_cast<double>(x[j]) * x[j];
      }
  e.counts[0] += a->n_rows();
  for (int64_t j = 0; j < a->ne[0]; ++j)
    if (!std::isfinite(e.sum2[static_cast<size_t>(j)]))
      return make_error("imatrix: non-finite activations in the input of '", w->name, "'");
  return ok_status();
}

Result<ImatrixRun> compute_imatrix(std::shared_ptr<const Model> model, std::span<const TokenId> tokens, TokenId bos,
                                   const ImatrixOptions& opt, const std::function<void(int64_t, int64_t)>& progress) {
  if (opt.n_ctx < 4) return make_error("imatrix: context ", opt.n_ctx, " is too small");
  const int64_t available = static_cast<int64_t>(tokens.size()) / opt.n_ctx;
  const int64_t n_chunks = opt.max_chunks > 0 ? std::min(available, opt.max_chunks) : available;
  if (n_chunks == 0)
    return make_error("imatrix: the text has ", tokens.size(), " tokens, fewer than one chunk of ", opt.n_ctx);
  ImatrixCollector collector(opt.include_output);
  ContextOptions co;
  co.n_ctx = opt.n_ctx;
  co.n_threads = opt.n_threads;
  co.op_observer = collector.observer();
  KITE_ASSIGN_OR_RETURN(auto ctx, Context::create(std::move(model), co));
  double nll = 0;
  int64_t scored = 0;
  std::vector<TokenId> chunk;
  for (int64_t c = 0; c < n_chunks; ++c) {
    // Chunks spread evenly over the text (all of it when every chunk is used).
    const int64_t start = c * available / n_chunks * opt.n_ctx;
    chunk.assign(tokens.begin() + start, tokens.begin() + start + opt.n_ctx);
    if (bos != kNoToken) chunk[0] = bos;
    ctx->kv().clear(0);
    KITE_TRY(ctx->eval(chunk, 0, /*all_logits=*/true));
    for (size_t j = static_cast<size_t>(opt.n_ctx / 2); j + 1 < chunk.size(); ++j) {
      auto logits = ctx->logits(j);
      float max_l = logits[0];
      for (float v : logits) max_l = std::max(max_l, v);
      double sum = 0;
      for (float v : logits) sum += std::exp(static_cast<double>(v - max_l));
      nll += std::log(sum) + max_l - logits[static_cast<size_t>(chunk[j + 1])];
      ++scored;
    }
    if (progress) progress(c + 1, n_chunks);
  }
  ImatrixRun run;
  run.imatrix = std::move(collector.imatrix());
  run.imatrix.chunk_count = static_cast<uint32_t>(n_chunks);
  run.imatrix.chunk_size = static_cast<uint32_t>(opt.n_ctx);
  if (!opt.dataset.empty()) run.imatrix.datasets.push_back(opt.dataset);
  run.ppl = scored > 0 ? std::exp(nll / static_cast<double>(scored)) : 0;
  if (run.imatrix.entries.empty()) return make_error("imatrix: the model ran no matmul with a named weight");
  return run;
}

}  // namespace kite

// ---------------------------------------------------------------------------------------------
// Sensitivity.

namespace kite {
namespace {

// The source with some tensors replaced (same names and shapes, other type and bytes).
class OverlaySource final : public WeightSource {
 public:
  OverlaySource(std::shared_ptr<const WeightSource> base, std::map<std::string, std::vector<uint8_t>> data,
                quant::Type type)
      : base_(std::move(base)), data_(std::move(data)), tensors_(base_->tensors()) {
    for (TensorInfo& t : tensors_) {
      auto it = data_.find(t.name);
      if (it == data_.end()) continue;
      t.type = type;
      t.data = it->second.data();
      t.nbytes = it->second.size();
    }
  }
  std::string_view format() const override { return base_->format(); }
  const std::string& path() const override { return base_->path(); }
  const gguf::Metadata& metadata() const override { return base_->metadata(); }
  const std::vector<TensorInfo>& tensors() const override { return tensors_; }
  const TensorInfo* find_tensor(std::string_view name) const override {
    for (const TensorInfo& t : tensors_)
      if (t.name == name) return &t;
    return nullptr;
  }
  bool qk_hf_order() const override { return base_->qk_hf_order(); }

 private:
  std::shared_ptr<const WeightSource> base_;
  std::map<std::string, std::vector<uint8_t>> data_;
  std::vector<TensorInfo> tensors_;
};

// "blk.3.attn_q.weight" -> ("attn_q", 3); "token_embd.weight" -> ("token_embd", -1).
std::pair<std::string, int> tensor_group(const std::string& name) {
  int layer = -1;
  std::string rest = name;
  if (name.starts_with("blk.")) {
    const size_t dot = name.find('.', 4);
    if (dot == std::string::npos) return {"", -1};
    layer = std::atoi(name.substr(4, dot - 4).c_str());
    rest = name.substr(dot + 1);
  }
  if (!rest.ends_with(".weight")) return {"", -1};
  rest.resize(rest.size() - 7);
  return {rest, layer};
}

int layer_of(const std::string& group) {
  int layer = -1;
  return std::sscanf(group.c_str(), "blk.%d.", &layer) == 1 ? layer : -1;
}

Result<double> measure(std::unique_ptr<WeightSource> src, std::span<const TokenId> tokens, TokenId bos,
                       const SensitivityOptions& opt) {
  KITE_ASSIGN_OR_RETURN(auto model, Model::from_source(std::move(src)));
  ContextOptions co;
  co.n_ctx = opt.n_ctx;
  co.n_threads = opt.n_threads;
  KITE_ASSIGN_OR_RETURN(auto ctx, Context::create(std::move(model), co));
  KITE_ASSIGN_OR_RETURN(PerplexityResult r, perplexity_llama_cpp(*ctx, tokens, bos, opt.n_ctx));
  return r.ppl;
}

// The tensor quantized to `type` (dequantized from whatever the source holds).
Result<std::vector<uint8_t>> quantize_tensor(const TensorInfo& t, quant::Type type, const std::vector<float>* imp) {
  const int64_t n = t.ne[0], rows = t.n_elements() / n;
  KITE_ASSIGN_OR_RETURN(const size_t in_row, quant::row_size(t.type, n));
  KITE_ASSIGN_OR_RETURN(const size_t out_row, quant::row_size(type, n));
  std::vector<uint8_t> out(out_row * static_cast<size_t>(rows));
  std::vector<float> buf(static_cast<size_t>(n));
  for (int64_t r = 0; r < rows; ++r) {
    KITE_TRY(quant::dequantize_row(t.type, t.data + r * in_row, buf.data(), n));
    Status st = imp && static_cast<int64_t>(imp->size()) == n
                    ? quant::quantize_rows_importance(type, buf.data(), out.data() + r * out_row, 1, n, imp->data())
                    : quant::quantize_row(type, buf.data(), out.data() + r * out_row, n);
    if (!st) return make_error("tensor '", t.name, "' row ", r, ": ", st.error().message);
  }
  return out;
}

}  // namespace

Result<SensitivityReport> quantization_sensitivity(std::shared_ptr<const WeightSource> source,
                                                   std::span<const TokenId> tokens, TokenId bos,
                                                   const SensitivityOptions& opt,
                                                   const std::function<void(int64_t, int64_t)>& progress) {
  static const char* kGroups[] = {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate",
                                  "ffn_up", "ffn_down", "token_embd", "output"};
  if (!quant::can_quantize(opt.type)) return make_error("sensitivity: kite cannot produce the type");
  SensitivityReport rep;
  // Group -> its tensors, in the table's order (per layer: by layer, then the table's order).
  std::vector<std::pair<std::string, std::vector<const TensorInfo*>>> groups;
  auto group_of = [&](const std::string& key) -> std::vector<const TensorInfo*>& {
    for (auto& g : groups)
      if (g.first == key) return g.second;
    return groups.emplace_back(key, std::vector<const TensorInfo*>{}).second;
  };
  const int64_t block = quant::find_traits(opt.type)->block_size;
  for (const std::string_view want : kGroups) {
    for (const TensorInfo& t : source->tensors()) {
      auto [g, layer] = tensor_group(t.name);
      if (g != want || t.ne.size() != 2) continue;
      if (t.ne[0] % block != 0) {
        rep.skipped.push_back(t.name);
        continue;
      }
      group_of(opt.per_layer && layer >= 0 ? "blk." + std::to_string(layer) + "." + g : g).push_back(&t);
    }
  }
  if (opt.per_layer)
    std::stable_sort(groups.begin(), groups.end(), [](const auto& a, const auto& b) {
      return layer_of(a.first) < layer_of(b.first);
    });
  if (groups.empty()) return make_error(source->path(), ": no tensor of the groups can be quantized to the type");
  const int64_t total = static_cast<int64_t>(groups.size()) + 1;
  if (opt.n_ctx < 4) return make_error("sensitivity: context ", opt.n_ctx, " is too small");
  if (opt.max_chunks > 0 && static_cast<int64_t>(tokens.size()) > opt.max_chunks * opt.n_ctx)
    tokens = tokens.first(static_cast<size_t>(opt.max_chunks * opt.n_ctx));
  KITE_ASSIGN_OR_RETURN(rep.base_ppl,
                        measure(std::make_unique<OverlaySource>(source, std::map<std::string, std::vector<uint8_t>>{},
                                                                opt.type),
                                tokens, bos, opt));
  rep.chunks = static_cast<int64_t>(tokens.size()) / opt.n_ctx;
  if (progress) progress(1, total);
  for (size_t i = 0; i < groups.size(); ++i) {
    SensitivityRow row;
    row.group = groups[i].first;
    std::map<std::string, std::vector<uint8_t>> data;
    for (const TensorInfo* t : groups[i].second) {
      const std::vector<float>* imp = nullptr;
      if (opt.importance)
        if (auto it = opt.importance->find(t->name); it != opt.importance->end()) imp = &it->second;
      KITE_ASSIGN_OR_RETURN(auto bytes, quantize_tensor(*t, opt.type, imp));
      row.bytes_before += t->nbytes;
      row.bytes_after += bytes.size();
      data.emplace(t->name, std::move(bytes));
      ++row.n_tensors;
    }
    KITE_ASSIGN_OR_RETURN(row.ppl, measure(std::make_unique<OverlaySource>(source, std::move(data), opt.type), tokens,
                                           bos, opt));
    rep.rows.push_back(std::move(row));
    if (progress) progress(static_cast<int64_t>(i) + 2, total);
  }
  std::stable_sort(rep.rows.begin(), rep.rows.end(), [](const auto& a, const auto& b) { return a.ppl > b.ppl; });
  return rep;
}

}  // namespace kite

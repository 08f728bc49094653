#include "formats/convert.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <thread>

#include "formats/gguf.h"

namespace kite {
namespace {

std::string type_name(quant::Type t) {
  const quant::TypeTraits* tr = quant::find_traits(t);
  return tr ? std::string(tr->name) : "type " + std::to_string(static_cast<uint32_t>(t));
}

std::string join_names(const std::vector<std::string>& names) {
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "" : ", ") + n;
  return s;
}

// The head count that splits this tensor's rows, or 0 when it is not a permuted Q/K tensor.
int64_t permute_heads(const WeightSource& src, const std::string& arch, const TensorInfo& t) {
  if (!src.qk_hf_order() || arch != "llama") return 0;
  const std::string_view n = t.name;
  const bool q = n.ends_with(".attn_q.weight") || n.ends_with(".attn_q.bias");
  const bool k = n.ends_with(".attn_k.weight") || n.ends_with(".attn_k.bias");
  if (!q && !k) return 0;
  const auto& meta = src.metadata();
  auto n_head = meta.get_int(arch + ".attention.head_count");
  if (!n_head) return 0;
  if (q) return *n_head;
  auto n_kv = meta.get_int(arch + ".attention.head_count_kv");
  return n_kv ? *n_kv : *n_head;
}

struct Job {
  const TensorInfo* in;
  quant::Type out_type;
  int64_t row_len;   // elements per row as processed (1 for a permuted bias)
  int64_t n_rows;
  int64_t n_head;    // > 0: permute rows
  const std::vector<float>* importance = nullptr;  // per column (and expert), or null
  int64_t rows_per_matrix = 0;                     // rows sharing one importance slice (an expert; 0: all)
};

// Converts one tensor into `out` (row_size(out_type, row_len) * n_rows bytes).
Status convert_tensor(const Job& job, uint8_t* out, int threads) {
  KITE_ASSIGN_OR_RETURN(const size_t in_row, quant::row_size(job.in->type, job.row_len));
  KITE_ASSIGN_OR_RETURN(const size_t out_row, quant::row_size(job.out_type, job.row_len));
  if (job.in->nbytes != in_row * static_cast<uint64_t>(job.n_rows))
    return make_error("tensor '", job.in->name, "': ", job.in->nbytes, " bytes of data, expected ",
                      in_row * job.n_rows);
  const int64_t n_threads = std::clamp<int64_t>(job.n_rows * job.row_len / 16384, 1, threads);
  std::mutex mu;
  Status first = Status();
  std::atomic<bool> failed{false};
  auto work = [&](int64_t r0, int64_t r1) {
    std::vector<float> buf(static_cast<size_t>(job.row_len));
    for (int64_t r = r0; r < r1 && !failed.load(std::memory_order_relaxed); ++r) {
      const int64_t sr = job.n_head > 0 ? qk_permuted_source_row(r, job.n_rows, job.n_head) : r;
      const uint8_t* in = job.in->data + static_cast<size_t>(sr) * in_row;
      uint8_t* dst = out + static_cast<size_t>(r) * out_row;
      Status st = job.in->type == job.out_type ? Status() : quant::dequantize_row(job.in->type, in, buf.data(), job.row_len);
      if (st.ok() && job.in->type == job.out_type) std::copy(in, in + in_row, dst);
      else if (st.ok() && job.importance != nullptr)
        st = quant::quantize_rows_importance(
            job.out_type, buf.data(), dst, 1, job.row_len,
            job.importance->data() + (job.rows_per_matrix > 0 ? r / job.rows_per_matrix * job.row_len : 0));
      else if (st.ok()) st = quant::quantize_row(job.out_type, buf.data(), dst, job.row_len);
      if (!st.ok()) {
        std::lock_guard<std::mutex> lock(mu);
        if (!failed.exchange(true))
          first = make_error("tensor '", job.in->name, "' row ", sr, ": ", st.error().message);
        return;
      }
    }
  };
  if (n_threads == 1) {
    work(0, job.n_rows);
  } else {
    std::vector<std::thread> pool;
    const int64_t per = (job.n_rows + n_threads - 1) / n_threads;
    for (int64_t i = 0; i < n_threads; ++i)
      pool.emplace_back(work, std::min(job.n_rows, i * per), std::min(job.n_rows, (i + 1) * per));
    for (auto& t : pool) t.join();
  }
  return first;
}

// Looks up the tensor's importance for a quantized output type (stats count what happened).
Status attach_importance(const ConvertOptions& opt, const TensorInfo& t, Job* job, ConvertStats* stats) {
  if (opt.importance == nullptr || !quant::find_traits(job->out_type)->is_quantized || job->out_type == t.type)
    return ok_status();
  auto it = opt.importance->find(t.name);
  if (it == opt.importance->end() || !quant::uses_weights(job->out_type) || t.ne.size() < 2 || t.ne.size() > 3) {
    ++stats->n_unweighted;
    if (opt.log)
      opt.log(it == opt.importance->end() ? "note: " + t.name + ": no importance data; quantized without"
                                          : "note: " + t.name + ": " + type_name(job->out_type) +
                                                " ignores importance data");
    return ok_status();
  }
  // (A 3-D tensor, a layer's experts: one slice of importance an expert.)
  const int64_t n_mat = t.ne.size() == 3 ? t.ne[2] : 1;
  if (static_cast<int64_t>(it->second.size()) != t.ne[0] * n_mat)
    return make_error("importance data for tensor '", t.name, "' has ", it->second.size(), " values, the tensor needs ",
                      t.ne[0], n_mat > 1 ? " x " + std::to_string(n_mat) + " experts" : std::string(" columns"),
                      " (an importance matrix of another model?)");
  job->importance = &it->second;
  job->rows_per_matrix = n_mat > 1 ? t.ne[1] : 0;
  ++stats->n_weighted;
  return ok_status();
}

}  // namespace

int64_t qk_permuted_source_row(int64_t row, int64_t n_rows, int64_t n_head) {
  const int64_t head_dim = n_rows / n_head;
  const int64_t half = head_dim / 2;
  const int64_t h = row / head_dim, j = row % head_dim;
  const int64_t i = j / 2, s = j % 2;
  return h * head_dim + s * half + i;
}

bool llama_tensor_order_less(const std::string& a, const std::string& b) {
  auto layer = [](const std::string& n) {
    int l = -1;
    return std::sscanf(n.c_str(), "blk.%d.", &l) == 1 ? l : -1;
  };
  const int la = layer(a), lb = layer(b);
  return la != lb ? la < lb : a < b;
}

Result<ConvertStats> convert_model(const WeightSource& src, const std::string& out_path, const ConvertOptions& opt) {
  const quant::Mix* mix = quant::find_mix(opt.type);
  if (mix == nullptr)
    return make_error("unknown type '", opt.type, "'; known types: ", join_names(quant::known_mix_names()));
  if (out_path.empty()) return make_error("no output path given");
  const std::filesystem::path out_dir = std::filesystem::path(out_path).parent_path();
  std::error_code ec;
  if (!out_dir.empty() && !std::filesystem::is_directory(out_dir, ec))
    return make_error(out_path, ": cannot write: folder '", out_dir.string(), "' does not exist");
  std::vector<TensorInfo> tensors = src.tensors();
  if (opt.llama_quantize_order)
    std::stable_sort(tensors.begin(), tensors.end(),
                     [](const TensorInfo& a, const TensorInfo& b) { return llama_tensor_order_less(a.name, b.name); });
  if (tensors.empty()) return make_error(src.path(), ": no tensors to convert");
  for (const auto& t : tensors) {
    const quant::TypeTraits* tr = quant::find_traits(t.type);
    if (tr == nullptr)
      return make_error(src.path(), ": tensor '", t.name, "' has unknown type id ", static_cast<uint32_t>(t.type));
    if (tr->is_quantized && !opt.allow_requantize)
      return make_error(src.path(), ": tensor '", t.name, "' is already quantized (", tr->name,
                        "); requantizing a lossy file loses more quality than quantizing the original. "
                        "Quantize from an f32/f16/bf16 file, or pass --allow-requantize");
  }
  quant::PlanOptions popt;
  popt.small_tensors_f32 = opt.small_tensors_f32;
  popt.pure = opt.pure;
  popt.token_embedding_type = opt.token_embedding_type;
  popt.output_tensor_type = opt.output_tensor_type;
  popt.tensor_types = opt.tensor_types;
  popt.has_imatrix = opt.importance != nullptr;
  KITE_ASSIGN_OR_RETURN(auto plan, quant::plan_types(*mix, tensors, src.metadata(), popt));

  std::string arch;
  if (auto a = src.metadata().get<std::string>("general.architecture")) arch = *a;
  const int threads = opt.threads > 0 ? opt.threads : std::max(1u, std::thread::hardware_concurrency());

  ConvertStats stats;
  stats.file_type = mix->file_type;
  gguf::Writer w;
  bool any_quantized = false;
  std::vector<Job> jobs;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorInfo& t = tensors[i];
    Job job{&t, plan[i].type, t.ne[0], 1, permute_heads(src, arch, t)};
    for (size_t d = 1; d < t.ne.size(); ++d) job.n_rows *= t.ne[d];
    KITE_TRY(attach_importance(opt, t, &job, &stats));
    if (job.importance == nullptr && job.out_type != t.type && quant::needs_importance(*mix, t.name, job.out_type)) {
      if (opt.importance == nullptr)
        return make_error("tensor '", t.name, "' would be quantized to ", type_name(job.out_type),
                          ", which needs an importance matrix: pass --imatrix FILE (make one with kite imatrix)");
      return make_error("tensor '", t.name, "' would be quantized to ", type_name(job.out_type),
                        ", which needs an importance matrix, and the one given has no data for it");
    }
    if (job.n_head > 0) {
      if (t.ne.size() == 1) std::swap(job.row_len, job.n_rows);  // a bias: each element is a row
      if (job.n_rows % (2 * job.n_head) != 0)
        return make_error(src.path(), ": tensor '", t.name, "' has ", job.n_rows, " rows, not a multiple of 2 x ",
                          job.n_head, " heads");
    }
    if (job.out_type != t.type || job.n_head > 0) {
      if (!quant::can_dequantize(t.type))
        return make_error(src.path(), ": tensor '", t.name, "' is in ", type_name(t.type),
                          ", which kite cannot convert from");
      if (!quant::can_quantize(job.out_type))
        return make_error("kite cannot produce type ", type_name(job.out_type), " (tensor '", t.name, "')");
    }
    any_quantized |= quant::find_traits(job.out_type)->is_quantized;
    stats.n_fallback += plan[i].fallback;
    stats.n_permuted += job.n_head > 0;
    stats.bytes_in += t.nbytes;
    KITE_TRY(w.add_tensor(t.name, job.out_type, t.ne));
    jobs.push_back(job);
    if (plan[i].fallback && opt.log)
      opt.log("warning: " + t.name + ": rows of " + std::to_string(t.ne[0]) + " are not whole blocks of the mix's type; using " +
              type_name(job.out_type));
  }
  for (const auto& kv : src.metadata().entries()) w.metadata().set(kv.key, kv.value);
  w.metadata().set("general.file_type", gguf::Value(mix->file_type));
  if (any_quantized) w.metadata().set("general.quantization_version", gguf::Value(uint32_t{2}));
  else w.metadata().remove("general.quantization_version");

  KITE_TRY(w.begin(out_path));
  std::vector<uint8_t> buf;
  uint64_t done = 0;
  for (size_t i = 0; i < jobs.size(); ++i) {
    const Job& job = jobs[i];
    const TensorInfo& out = w.tensors()[i];
    if (job.out_type == job.in->type && job.n_head == 0) {
      KITE_TRY(w.write_tensor_data(job.in->data, job.in->nbytes));
    } else {
      buf.assign(out.nbytes, 0);
      KITE_TRY(convert_tensor(job, buf.data(), threads));
      KITE_TRY(w.write_tensor_data(buf.data(), buf.size()));
    }
    stats.bytes_out += out.nbytes;
    ++stats.n_tensors;
    done += job.in->nbytes;
    if (opt.log) opt.log(job.in->name + ": " + type_name(job.in->type) + " -> " + type_name(job.out_type) +
                         (job.n_head > 0 ? " (Q/K rows permuted)" : ""));
    if (opt.progress) opt.progress(done, stats.bytes_in);
  }
  KITE_TRY(w.finish());
  return stats;
}

}  // namespace kite

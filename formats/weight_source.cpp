// WeightSource implementations: a GGUF file as written, and a Hugging Face folder translated
// to GGUF keys and tensor names (see hf_config.h, hf_tokenizer.h, hf_names.h).
#include "formats/weight_source.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <filesystem>
#include <unordered_map>

#include "formats/hf_config.h"
#include "formats/hf_names.h"
#include "formats/hf_tokenizer.h"
#include "formats/safetensors.h"
#include "src/base/half.h"

namespace kite {
namespace {

namespace fs = std::filesystem;

class GgufSource final : public WeightSource {
 public:
  explicit GgufSource(gguf::File file) : file_(std::move(file)) {}

  std::string_view format() const override { return "gguf"; }
  const std::string& path() const override { return file_.path(); }
  const gguf::Metadata& metadata() const override { return file_.metadata(); }
  const std::vector<TensorInfo>& tensors() const override { return file_.tensors(); }
  const TensorInfo* find_tensor(std::string_view name) const override { return file_.find_tensor(name); }
  bool qk_hf_order() const override { return false; }

 private:
  gguf::File file_;
};

class HfSource final : public WeightSource {
 public:
  static Result<std::unique_ptr<WeightSource>> open(const std::string& folder);

  std::string_view format() const override { return "safetensors"; }
  const std::string& path() const override { return path_; }
  const gguf::Metadata& metadata() const override { return meta_; }
  const std::vector<TensorInfo>& tensors() const override { return tensors_; }
  const TensorInfo* find_tensor(std::string_view name) const override {
    auto it = index_.find(std::string(name));
    return it == index_.end() ? nullptr : &tensors_[it->second];
  }
  bool qk_hf_order() const override { return true; }

 private:
  explicit HfSource(std::string folder) : path_(folder), meta_(std::move(folder)) {}
  Status add_tensor(TensorInfo info);
  Status add_checkpoint_tensors(const hf::Config& config);
  Status add_stacked(const std::string& name, const std::vector<const safetensors::Tensor*>& pieces);
  Status add_shifted(TensorInfo info, float shift);

  std::string path_;
  gguf::Metadata meta_;
  safetensors::Checkpoint checkpoint_;  // keeps the shard mappings alive
  std::vector<float> rope_factors_;     // backing data of rope_freqs.weight (llama3 scaling)
  std::deque<std::vector<uint8_t>> stacked_;  // experts copied together (add_stacked)
  std::deque<std::vector<float>> shifted_;    // gemma's norms, plus one (add_shifted)
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, size_t> index_;
};

Status HfSource::add_tensor(TensorInfo info) {
  if (!index_.emplace(info.name, tensors_.size()).second)
    return make_error(path_, ": two checkpoint tensors map to '", info.name, "'");
  tensors_.push_back(std::move(info));
  return ok_status();
}

Status HfSource::add_checkpoint_tensors(const hf::Config& config) {
  // Experts' matrices by the stacked tensor they belong to (in checkpoint order of first sight).
  std::vector<std::pair<std::string, std::vector<const safetensors::Tensor*>>> stacks;
  for (const safetensors::Tensor& t : checkpoint_.tensors()) {
    if (config.num_experts > 0) {
      if (std::optional<hf::ExpertPiece> piece = hf::expert_piece(config.arch, t.name)) {
        if (piece->expert >= config.num_experts)
          return make_error(path_, ": tensor '", t.name, "' is expert ", piece->expert, " but config.json has ",
                            config.num_experts, " experts");
        auto it =
            std::find_if(stacks.begin(), stacks.end(), [&](const auto& s) { return s.first == piece->gguf_name; });
        if (it == stacks.end()) {
          stacks.emplace_back(piece->gguf_name, std::vector<const safetensors::Tensor*>(
                                                    static_cast<size_t>(config.num_experts), nullptr));
          it = stacks.end() - 1;
        }
        const safetensors::Tensor*& slot = it->second[static_cast<size_t>(piece->expert)];
        if (slot != nullptr) return make_error(path_, ": two checkpoint tensors are '", t.name, "'");
        slot = &t;
        continue;
      }
    }
    auto name = hf::gguf_tensor_name(config.arch, t.name);
    if (!name) return name.error().with_context(path_);
    if (!name->has_value()) continue;  // known and not needed (rotary_emb.inv_freq)
    const std::string& gguf_name = **name;
    if (gguf_name.compare(0, 4, "blk.") == 0) {
      const int64_t layer = std::stoll(gguf_name.substr(4));
      if (layer >= config.num_hidden_layers)
        return make_error(path_, ": tensor '", t.name, "' is in layer ", layer, " but config.json has ",
                          config.num_hidden_layers, " layers");
    }
    TensorInfo info = t.info();
    info.name = gguf_name;
    // Gemma's RMS norms scale by 1 + weight; GGUF (llama.cpp's converter) stores 1 + weight.
    const bool gemma = config.arch == "gemma2" || config.arch == "gemma3";
    if (gemma && gguf_name.ends_with("norm.weight")) {
      KITE_TRY(add_shifted(std::move(info), 1.f));
      continue;
    }
    KITE_TRY(add_tensor(std::move(info)));
  }
  for (const auto& [name, pieces] : stacks) KITE_TRY(add_stacked(name, pieces));
  return ok_status();
}

// GGUF keeps a layer's experts as one [k, m, n_expert] tensor; the checkpoint's are apart, so
// they are copied together into memory the source owns (not the mapping's pages).
Status HfSource::add_stacked(const std::string& name, const std::vector<const safetensors::Tensor*>& pieces) {
  const safetensors::Tensor* first = pieces[0];
  for (size_t e = 0; e < pieces.size(); ++e) {
    const safetensors::Tensor* p = pieces[e];
    if (p == nullptr) return make_error(path_, ": expert ", e, " of '", name, "' is missing from the checkpoint");
    if (first == nullptr || p->type != first->type || p->ne != first->ne || p->ne.size() != 2)
      return make_error(path_, ": the experts of '", name, "' differ in type or shape (expert ", e, ": '", p->name,
                        "')");
  }
  std::vector<uint8_t>& bytes = stacked_.emplace_back(first->nbytes * pieces.size());
  for (size_t e = 0; e < pieces.size(); ++e)
    std::memcpy(bytes.data() + e * first->nbytes, pieces[e]->data, first->nbytes);
  TensorInfo info = first->info();
  info.name = name;
  info.ne = {first->ne[0], first->ne[1], static_cast<int64_t>(pieces.size())};
  info.nbytes = bytes.size();
  info.offset = 0;
  info.data = bytes.data();
  return add_tensor(std::move(info));
}

// A 1-D F32/F16/BF16 tensor plus `shift`, as F32 in memory the source owns.
Status HfSource::add_shifted(TensorInfo info, float shift) {
  if (info.ne.size() != 1 || (info.type != quant::Type::F32 && info.type != quant::Type::F16 &&
                              info.type != quant::Type::BF16))
    return make_error(path_, ": tensor '", info.name, "' is not a 1-D F32, F16 or BF16 norm");
  std::vector<float>& v = shifted_.emplace_back(static_cast<size_t>(info.ne[0]));
  const auto* h = reinterpret_cast<const uint16_t*>(info.data);
  for (size_t i = 0; i < v.size(); ++i) {
    const float x = info.type == quant::Type::F32   ? reinterpret_cast<const float*>(info.data)[i]
                    : info.type == quant::Type::F16 ? fp16_to_fp32(h[i])
                                                    : bf16_to_fp32(h[i]);
    v[i] = x + shift;
  }
  info.type = quant::Type::F32;
  info.nbytes = v.size() * sizeof(float);
  info.offset = 0;
  info.data = reinterpret_cast<const uint8_t*>(v.data());
  return add_tensor(std::move(info));
}

Result<std::unique_ptr<WeightSource>> HfSource::open(const std::string& folder) {
  const fs::path dir(folder);
  std::error_code ec;
  if (!fs::exists(dir / "config.json", ec))
    return make_error(folder, ": no config.json (a Hugging Face model folder has config.json and *.safetensors)");
  KITE_ASSIGN_OR_RETURN(hf::Config config, hf::load_config((dir / "config.json").string()));

  std::unique_ptr<HfSource> src(new HfSource(folder));
  std::string name = dir.filename().string();
  if (name.empty()) name = dir.parent_path().filename().string();  // "models/x/"
  hf::add_config_metadata(config, name, src->meta_);

  hf::TokenizerHints hints;
  hints.n_vocab = config.vocab_size;
  hints.bos_token_id = config.bos_token_id;
  hints.eos_token_ids = config.eos_token_ids;
  hints.pad_token_id = config.pad_token_id;
  KITE_TRY(hf::add_tokenizer_metadata(folder, hints, src->meta_));

  KITE_ASSIGN_OR_RETURN(src->checkpoint_, safetensors::Checkpoint::open(folder));
  KITE_TRY(src->add_checkpoint_tensors(config));

  src->rope_factors_ = hf::llama3_rope_factors(config);
  if (!src->rope_factors_.empty()) {  // as llama.cpp's converter stores llama3 rope scaling
    TensorInfo t;
    t.name = "rope_freqs.weight";
    t.type = quant::Type::F32;
    t.ne = {static_cast<int64_t>(src->rope_factors_.size())};
    t.nbytes = src->rope_factors_.size() * sizeof(float);
    t.data = reinterpret_cast<const uint8_t*>(src->rope_factors_.data());
    KITE_TRY(src->add_tensor(std::move(t)));
  }
  if (src->find_tensor("token_embd.weight") == nullptr)
    return make_error(folder, ": the checkpoint has no model.embed_tokens.weight");
  return std::unique_ptr<WeightSource>(std::move(src));
}

}  // namespace

Result<std::unique_ptr<WeightSource>> WeightSource::open(const std::string& path) {
  std::error_code ec;
  const auto status = fs::status(path, ec);
  if (ec || !fs::exists(status)) return make_error(path, ": no such file or folder");
  if (fs::is_directory(status)) return HfSource::open(path);
  const std::string ext = fs::path(path).extension().string();
  if (ext == ".safetensors" || ext == ".json")
    return make_error(path, ": pass the Hugging Face model folder, not one of its files");
  KITE_ASSIGN_OR_RETURN(gguf::File file, gguf::File::open(path));
  return std::unique_ptr<WeightSource>(std::make_unique<GgufSource>(std::move(file)));
}

}  // namespace kite

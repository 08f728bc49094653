// kite/formats/memory_source.h — a WeightSource whose tensors live in memory it owns: synthetic
// benchmark models, and models built or transformed in memory before being written out.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "formats/weight_source.h"

namespace kite {

class MemorySource final : public WeightSource {
 public:
  explicit MemorySource(std::string name) : path_(name), meta_(std::move(name)) {}

  std::string_view format() const override { return "memory"; }
  const std::string& path() const override { return path_; }
  const gguf::Metadata& metadata() const override { return meta_; }
  gguf::Metadata& metadata() { return meta_; }
  const std::vector<TensorInfo>& tensors() const override { return tensors_; }
  const TensorInfo* find_tensor(std::string_view name) const override;
  bool qk_hf_order() const override { return qk_hf_order_; }
  void set_qk_hf_order(bool v) { qk_hf_order_ = v; }

  // Adds a tensor and returns its (zeroed) bytes to fill. Errors on a duplicate name or a shape
  // that is not whole blocks of `type`.
  Result<uint8_t*> add_tensor(std::string name, quant::Type type, std::vector<int64_t> ne);

 private:
  std::string path_;
  gguf::Metadata meta_;
  std::vector<TensorInfo> tensors_;
  std::vector<std::unique_ptr<uint8_t[]>> storage_;
  std::unordered_map<std::string, size_t> index_;
  bool qk_hf_order_ = false;
};

// Writes any source as a GGUF file (metadata and tensors as they are), with progress calls.
Status write_gguf(const WeightSource& src, const std::string& path,
                  const std::function<void(size_t done, size_t total)>& progress = {});

}  // namespace kite

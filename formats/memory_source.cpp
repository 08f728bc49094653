#include "formats/memory_source.h"

namespace kite {

const TensorInfo* MemorySource::find_tensor(std::string_view name) const {
  auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

Result<uint8_t*> MemorySource::add_tensor(std::string name, quant::Type type, std::vector<int64_t> ne) {
  if (index_.count(name) != 0) return make_error(path_, ": duplicate tensor '", name, "'");
  KITE_ASSIGN_OR_RETURN(size_t row, quant::row_size(type, ne.empty() ? 1 : ne[0]));
  uint64_t rows = 1;
  for (size_t d = 1; d < ne.size(); ++d) rows *= static_cast<uint64_t>(ne[d]);
  TensorInfo t;
  t.name = std::move(name);
  t.type = type;
  t.ne = std::move(ne);
  t.nbytes = row * rows;
  storage_.emplace_back(new uint8_t[t.nbytes]());
  t.data = storage_.back().get();
  index_.emplace(t.name, tensors_.size());
  tensors_.push_back(std::move(t));
  return storage_.back().get();
}

Status write_gguf(const WeightSource& src, const std::string& path,
                  const std::function<void(size_t, size_t)>& progress) {
  gguf::Writer w;
  for (const auto& kv : src.metadata().entries()) w.metadata().set(kv.key, kv.value);
  for (const auto& t : src.tensors()) KITE_TRY(w.add_tensor(t.name, t.type, t.ne));
  KITE_TRY(w.begin(path));
  size_t done = 0;
  for (const auto& t : src.tensors()) {
    KITE_TRY(w.write_tensor_data(t.data, t.nbytes));
    if (progress) progress(++done, src.tensors().size());
  }
  return w.finish();
}

}  // namespace kite

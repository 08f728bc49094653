// GGUF metadata values and the ordered, indexed Metadata map with typed getters.
#include <cmath>
#include <limits>

#include "formats/gguf.h"

namespace kite::gguf {

std::string_view value_type_name(ValueType t) {
  switch (t) {
    case ValueType::U8: return "u8";
    case ValueType::I8: return "i8";
    case ValueType::U16: return "u16";
    case ValueType::I16: return "i16";
    case ValueType::U32: return "u32";
    case ValueType::I32: return "i32";
    case ValueType::F32: return "f32";
    case ValueType::BOOL: return "bool";
    case ValueType::STRING: return "string";
    case ValueType::ARRAY: return "array";
    case ValueType::U64: return "u64";
    case ValueType::I64: return "i64";
    case ValueType::F64: return "f64";
  }
  return "unknown";
}

std::optional<int64_t> Value::as_int() const {
  return std::visit(
      [](const auto& x) -> std::optional<int64_t> {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, uint64_t>) {
          if (x > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
          return static_cast<int64_t>(x);
        } else if constexpr (std::is_integral_v<T>) {
          return static_cast<int64_t>(x);
        } else {
          return std::nullopt;
        }
      },
      v);
}

std::optional<double> Value::as_float() const {
  if (auto f = get_if<float>()) return *f;
  if (auto d = get_if<double>()) return *d;
  if (type() == ValueType::BOOL) return std::nullopt;
  if (auto i = as_int()) return static_cast<double>(*i);
  if (auto u = get_if<uint64_t>()) return static_cast<double>(*u);
  return std::nullopt;
}

bool Metadata::insert(std::string key, Value value) {
  if (index_.count(key) != 0) return false;
  index_.emplace(key, kv_.size());
  kv_.push_back({std::move(key), std::move(value)});
  return true;
}

void Metadata::set(std::string key, Value value) {
  auto it = index_.find(key);
  if (it != index_.end()) {
    kv_[it->second].value = std::move(value);
    return;
  }
  insert(std::move(key), std::move(value));
}

void Metadata::remove(std::string_view key) {
  auto it = index_.find(std::string(key));
  if (it == index_.end()) return;
  kv_.erase(kv_.begin() + static_cast<ptrdiff_t>(it->second));
  index_.clear();
  for (size_t i = 0; i < kv_.size(); ++i) index_.emplace(kv_[i].key, i);
}

const Value* Metadata::find(std::string_view key) const {
  auto it = index_.find(std::string(key));
  return it == index_.end() ? nullptr : &kv_[it->second].value;
}

namespace {

template <class T>
constexpr ValueType type_of() {
  if constexpr (std::is_same_v<T, uint8_t>) return ValueType::U8;
  else if constexpr (std::is_same_v<T, int8_t>) return ValueType::I8;
  else if constexpr (std::is_same_v<T, uint16_t>) return ValueType::U16;
  else if constexpr (std::is_same_v<T, int16_t>) return ValueType::I16;
  else if constexpr (std::is_same_v<T, uint32_t>) return ValueType::U32;
  else if constexpr (std::is_same_v<T, int32_t>) return ValueType::I32;
  else if constexpr (std::is_same_v<T, float>) return ValueType::F32;
  else if constexpr (std::is_same_v<T, bool>) return ValueType::BOOL;
  else if constexpr (std::is_same_v<T, std::string>) return ValueType::STRING;
  else if constexpr (std::is_same_v<T, uint64_t>) return ValueType::U64;
  else if constexpr (std::is_same_v<T, int64_t>) return ValueType::I64;
  else if constexpr (std::is_same_v<T, double>) return ValueType::F64;
}

std::string describe(const Value& v) {
  if (const Array* a = v.get_if<Array>())
    return std::string("array of ") + std::string(value_type_name(a->elem_type));
  return std::string(value_type_name(v.type()));
}

}  // namespace

template <class T>
Result<T> Metadata::get(std::string_view key) const {
  const Value* v = find(key);
  if (v == nullptr) return make_error(source_, ": missing key '", key, "'");
  if (const T* x = v->get_if<T>()) return *x;
  return make_error(source_, ": key '", key, "' has type ", describe(*v), ", expected ",
                    value_type_name(type_of<T>()));
}

template <class T>
Result<std::vector<T>> Metadata::get_array(std::string_view key) const {
  const Value* v = find(key);
  if (v == nullptr) return make_error(source_, ": missing key '", key, "'");
  const Array* a = v->get_if<Array>();
  if (a == nullptr || a->elem_type != type_of<T>())
    return make_error(source_, ": key '", key, "' has type ", describe(*v), ", expected array of ",
                      value_type_name(type_of<T>()));
  std::vector<T> out;
  out.reserve(a->items.size());
  for (const Value& item : a->items) out.push_back(std::get<T>(item.v));
  return out;
}

Result<int64_t> Metadata::get_int(std::string_view key) const {
  const Value* v = find(key);
  if (v == nullptr) return make_error(source_, ": missing key '", key, "'");
  if (v->type() != ValueType::BOOL)
    if (auto i = v->as_int()) return *i;
  return make_error(source_, ": key '", key, "' has type ", describe(*v), ", expected an integer");
}

Result<double> Metadata::get_float(std::string_view key) const {
  const Value* v = find(key);
  if (v == nullptr) return make_error(source_, ": missing key '", key, "'");
  if (auto f = v->as_float()) return *f;
  return make_error(source_, ": key '", key, "' has type ", describe(*v), ", expected a number");
}

#define KITE_GGUF_INSTANTIATE(T)                                         \
  template Result<T> Metadata::get<T>(std::string_view) const;          \
  template Result<std::vector<T>> Metadata::get_array<T>(std::string_view) const;
KITE_GGUF_INSTANTIATE(uint8_t)
KITE_GGUF_INSTANTIATE(int8_t)
KITE_GGUF_INSTANTIATE(uint16_t)
KITE_GGUF_INSTANTIATE(int16_t)
KITE_GGUF_INSTANTIATE(uint32_t)
KITE_GGUF_INSTANTIATE(int32_t)
KITE_GGUF_INSTANTIATE(float)
KITE_GGUF_INSTANTIATE(bool)
KITE_GGUF_INSTANTIATE(std::string)
KITE_GGUF_INSTANTIATE(uint64_t)
KITE_GGUF_INSTANTIATE(int64_t)
KITE_GGUF_INSTANTIATE(double)
#undef KITE_GGUF_INSTANTIATE

int64_t TensorInfo::n_elements() const {
  int64_t n = 1;
  for (int64_t d : ne) n *= d;
  return n;
}

}  // namespace kite::gguf

// GGUF reader: parse and validate a mapped file before anything is handed out.
//
// Invariant of the Parser: every read is bounds-checked against the real bytes, and every count
// read from the file is checked against the bytes left before anything is reserved, so the work
// and memory spent on a file are bounded by its size.
#include <algorithm>
#include <cstring>
#include <limits>

#include "formats/gguf.h"
#include "src/base/utf8.h"

namespace kite::gguf {
namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" little-endian
constexpr int kMaxArrayDepth = 8;         // nested arrays; real files use 1

// Smallest encoding of one value of a type, used to bound counts read from the file.
uint64_t min_value_size(ValueType t) {
  switch (t) {
    case ValueType::U8: case ValueType::I8: case ValueType::BOOL: return 1;
    case ValueType::U16: case ValueType::I16: return 2;
    case ValueType::U32: case ValueType::I32: case ValueType::F32: return 4;
    case ValueType::U64: case ValueType::I64: case ValueType::F64: return 8;
    case ValueType::STRING: return 8;
    case ValueType::ARRAY: return 12;
  }
  return 1;
}

bool known_value_type(uint32_t t) { return t <= static_cast<uint32_t>(ValueType::F64); }

}  // namespace

class Parser {
 public:
  Parser(const uint8_t* data, size_t size, std::string name) : p_(data), size_(size), name_(std::move(name)) {}

  Result<File> parse() {
    File f;
    f.path_ = name_;
    f.file_size_ = size_;
    f.meta_ = Metadata(name_);

    KITE_ASSIGN_OR_RETURN(uint32_t magic, read_pod<uint32_t>("magic"));
    if (magic != kMagic) {
      return fail("not a GGUF file (magic is not 'GGUF')");
    }
    KITE_ASSIGN_OR_RETURN(f.version_, read_pod<uint32_t>("version"));
    if (f.version_ == 0x03000000 || f.version_ == 0x02000000)
      return fail("big-endian GGUF files are not supported");
    if (f.version_ == 1) return fail("GGUF version 1 is not supported (only versions 2 and 3)");
    if (f.version_ != 2 && f.version_ != 3)
      return fail(make_error("unknown GGUF version ", f.version_, " (supported: 2, 3)").message);

    KITE_ASSIGN_OR_RETURN(uint64_t n_tensors, read_pod<uint64_t>("tensor count"));
    KITE_ASSIGN_OR_RETURN(uint64_t n_kv, read_pod<uint64_t>("metadata count"));
    // A key/value takes at least 8 (key length) + 4 (type) + 1 bytes; a tensor info at least
    // 8 (name length) + 1 (name) + 4 (n_dims) + 4 (type) + 8 (offset).
    if (n_kv > remaining() / 13)
      return fail(make_error("metadata count ", n_kv, " is more than the file's ", size_, " bytes can hold").message);
    if (n_tensors > remaining() / 25)
      return fail(make_error("tensor count ", n_tensors, " is more than the file's ", size_, " bytes can hold").message);

    for (uint64_t i = 0; i < n_kv; ++i) {
      const size_t at = pos_;
      KITE_ASSIGN_OR_RETURN(std::string key, read_string("metadata key"));
      if (key.empty()) return fail_at(at, "empty metadata key");
      if (!valid_utf8(key)) return fail_at(at, "metadata key is not valid UTF-8");
      KITE_ASSIGN_OR_RETURN(uint32_t type, read_pod<uint32_t>("value type"));
      KITE_ASSIGN_OR_RETURN(Value value, read_value(type, 0, key));
      if (!f.meta_.insert(key, std::move(value))) return fail_at(at, "duplicate metadata key '" + key + "'");
    }

    if (const Value* a = f.meta_.find("general.alignment")) {
      const uint32_t* v = a->get_if<uint32_t>();
      if (v == nullptr) return fail("general.alignment has type " + std::string(value_type_name(a->type())) + ", expected u32");
      if (*v == 0 || (*v & (*v - 1)) != 0)
        return fail(make_error("general.alignment = ", *v, " is not a power of two").message);
      f.alignment_ = *v;
    }

    f.tensors_.reserve(n_tensors);
    for (uint64_t i = 0; i < n_tensors; ++i) {
      KITE_ASSIGN_OR_RETURN(TensorInfo t, read_tensor_info(f.alignment_));
      if (!f.tensor_index_.emplace(t.name, f.tensors_.size()).second)
        return fail("duplicate tensor name '" + t.name + "'");
      f.tensors_.push_back(std::move(t));
    }

    const uint64_t header_end = pos_;
    f.data_offset_ = (header_end + f.alignment_ - 1) / f.alignment_ * f.alignment_;
    if (f.tensors_.empty()) {
      f.data_offset_ = std::min<uint64_t>(f.data_offset_, size_);
      return f;
    }
    if (f.data_offset_ > size_)
      return fail(make_error("file ends at ", size_, " before its tensor data section (at ", f.data_offset_, ")").message);
    KITE_TRY(check_data(f));
    return f;
  }

 private:
  size_t remaining() const { return size_ - pos_; }

  Error fail(const std::string& what) const { return Error{name_ + ": " + what}; }
  Error fail_at(size_t at, const std::string& what) const {
    return Error{name_ + ": at byte " + std::to_string(at) + ": " + what};
  }

  template <class T>
  Result<T> read_pod(const char* what) {
    if (remaining() < sizeof(T))
      return fail_at(pos_, std::string("truncated file: ") + what + " needs " + std::to_string(sizeof(T)) +
                               " bytes, " + std::to_string(remaining()) + " left");
    T v;
    std::memcpy(&v, p_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  Result<std::string> read_string(const char* what) {
    const size_t at = pos_;
    KITE_ASSIGN_OR_RETURN(uint64_t len, read_pod<uint64_t>(what));
    if (len > remaining())
      return fail_at(at, std::string(what) + " length " + std::to_string(len) + " is past the end of the file (" +
                             std::to_string(remaining()) + " bytes left)");
    std::string s(reinterpret_cast<const char*>(p_ + pos_), static_cast<size_t>(len));
    pos_ += static_cast<size_t>(len);
    return s;
  }

  Result<Value> read_value(uint32_t type, int depth, const std::string& key) {
    if (!known_value_type(type))
      return fail_at(pos_ - 4, "key '" + key + "' has unknown value type " + std::to_string(type));
    switch (static_cast<ValueType>(type)) {
      case ValueType::U8: return wrap(read_pod<uint8_t>("u8 value"));
      case ValueType::I8: return wrap(read_pod<int8_t>("i8 value"));
      case ValueType::U16: return wrap(read_pod<uint16_t>("u16 value"));
      case ValueType::I16: return wrap(read_pod<int16_t>("i16 value"));
      case ValueType::U32: return wrap(read_pod<uint32_t>("u32 value"));
      case ValueType::I32: return wrap(read_pod<int32_t>("i32 value"));
      case ValueType::F32: return wrap(read_pod<float>("f32 value"));
      case ValueType::U64: return wrap(read_pod<uint64_t>("u64 value"));
      case ValueType::I64: return wrap(read_pod<int64_t>("i64 value"));
      case ValueType::F64: return wrap(read_pod<double>("f64 value"));
      case ValueType::BOOL: {
        const size_t at = pos_;
        KITE_ASSIGN_OR_RETURN(uint8_t b, read_pod<uint8_t>("bool value"));
        if (b > 1) return fail_at(at, "key '" + key + "': bool value " + std::to_string(b) + " is not 0 or 1");
        return Value(b == 1);
      }
      case ValueType::STRING: return wrap(read_string("string value"));
      case ValueType::ARRAY: return read_array(depth, key);
    }
    return fail("unreachable");
  }

  Result<Value> read_array(int depth, const std::string& key) {
    const size_t at = pos_;
    if (depth >= kMaxArrayDepth)
      return fail_at(at, "key '" + key + "': arrays nested deeper than " + std::to_string(kMaxArrayDepth));
    KITE_ASSIGN_OR_RETURN(uint32_t elem, read_pod<uint32_t>("array element type"));
    if (!known_value_type(elem))
      return fail_at(at, "key '" + key + "': array has unknown element type " + std::to_string(elem));
    KITE_ASSIGN_OR_RETURN(uint64_t n, read_pod<uint64_t>("array length"));
    const ValueType et = static_cast<ValueType>(elem);
    if (n > remaining() / min_value_size(et))
      return fail_at(at, "key '" + key + "': array length " + std::to_string(n) + " of " +
                             std::string(value_type_name(et)) + " is past the end of the file");
    Array arr;
    arr.elem_type = et;
    arr.items.reserve(static_cast<size_t>(n));
    for (uint64_t i = 0; i < n; ++i) {
      KITE_ASSIGN_OR_RETURN(Value v, read_value(elem, depth + 1, key));
      arr.items.push_back(std::move(v));
    }
    return Value(std::move(arr));
  }

  template <class T>
  static Result<Value> wrap(Result<T> r) {
    if (!r) return r.error();
    return Value(std::move(*r));
  }

  Result<TensorInfo> read_tensor_info(uint32_t alignment) {
    const size_t at = pos_;
    TensorInfo t;
    KITE_ASSIGN_OR_RETURN(t.name, read_string("tensor name"));
    if (t.name.empty()) return fail_at(at, "empty tensor name");
    if (!valid_utf8(t.name)) return fail_at(at, "tensor name is not valid UTF-8");
    const std::string where = "tensor '" + t.name + "'";
    KITE_ASSIGN_OR_RETURN(uint32_t n_dims, read_pod<uint32_t>("tensor dimension count"));
    if (n_dims > static_cast<uint32_t>(kMaxDims))
      return fail_at(at, where + " has " + std::to_string(n_dims) + " dimensions (at most 4)");
    t.ne.resize(n_dims);
    int64_t n_elem = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      KITE_ASSIGN_OR_RETURN(uint64_t ne, read_pod<uint64_t>("tensor dimension"));
      if (ne > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        return fail_at(at, where + " dimension " + std::to_string(d) + " = " + std::to_string(ne) + " is negative or too large");
      t.ne[d] = static_cast<int64_t>(ne);
      if (t.ne[d] != 0 && n_elem > std::numeric_limits<int64_t>::max() / t.ne[d])
        return fail_at(at, where + " has more elements than fit in 64 bits");
      n_elem *= t.ne[d];
    }
    KITE_ASSIGN_OR_RETURN(uint32_t type, read_pod<uint32_t>("tensor type"));
    const quant::TypeTraits* tr = quant::find_traits(type);
    if (tr == nullptr) return fail_at(at, where + " has unknown type id " + std::to_string(type));
    t.type = tr->type;
    const int64_t ne0 = n_dims > 0 ? t.ne[0] : 1;
    if (ne0 % tr->block_size != 0)
      return fail_at(at, where + " row length " + std::to_string(ne0) + " is not a multiple of the " +
                             std::string(tr->name) + " block size " + std::to_string(tr->block_size));
    // bytes = elements / block_size * type_size, checked for overflow
    const uint64_t blocks = static_cast<uint64_t>(n_elem / tr->block_size);
    if (blocks > std::numeric_limits<uint64_t>::max() / tr->type_size)
      return fail_at(at, where + " is larger than 2^64 bytes");
    t.nbytes = blocks * tr->type_size;
    KITE_ASSIGN_OR_RETURN(t.offset, read_pod<uint64_t>("tensor data offset"));
    if (t.offset % alignment != 0)
      return fail_at(at, where + " data offset " + std::to_string(t.offset) + " is not a multiple of the alignment " +
                             std::to_string(alignment));
    return t;
  }

  Status check_data(File& f) {
    const uint64_t data_size = size_ - f.data_offset_;
    const uint8_t* base = p_ + f.data_offset_;
    std::vector<const TensorInfo*> by_offset;
    by_offset.reserve(f.tensors_.size());
    for (TensorInfo& t : f.tensors_) {
      if (t.offset > data_size || t.nbytes > data_size - t.offset)
        return fail(make_error("tensor '", t.name, "' data [", t.offset, ", +", t.nbytes,
                               ") is past the end of the data section (", data_size, " bytes; file truncated?)")
                        .message);
      // Kernels read block fields (halves, floats) in place: the data must sit at the type's
      // natural alignment in the file. Only files with general.alignment < 4 can break this.
      const quant::TypeTraits* tr = quant::find_traits(t.type);
      const uint64_t need = tr->is_quantized ? 4 : std::min<uint64_t>(tr->type_size, 8);
      if ((f.data_offset_ + t.offset) % need != 0)
        return fail(make_error("tensor '", t.name, "' data at byte ", f.data_offset_ + t.offset, " is not ", need,
                               "-byte aligned for ", tr->name, " (general.alignment = ", f.alignment_, ")")
                        .message);
      t.data = base + t.offset;
      by_offset.push_back(&t);
    }
    std::sort(by_offset.begin(), by_offset.end(),
              [](const TensorInfo* a, const TensorInfo* b) { return a->offset < b->offset; });
    for (size_t i = 1; i < by_offset.size(); ++i) {
      const TensorInfo* prev = by_offset[i - 1];
      const TensorInfo* cur = by_offset[i];
      if (prev->nbytes > 0 && cur->nbytes > 0 && cur->offset < prev->offset + prev->nbytes)
        return fail(make_error("tensors '", prev->name, "' and '", cur->name, "' overlap (offsets ", prev->offset,
                               "+", prev->nbytes, " and ", cur->offset, ")")
                        .message);
    }
    return ok_status();
  }

  const uint8_t* p_;
  size_t size_;
  size_t pos_ = 0;
  std::string name_;
};

Result<File> File::open(const std::string& path) {
  KITE_ASSIGN_OR_RETURN(auto map, MappedFile::open(path));
  return parse(std::move(map));
}

Result<File> File::parse(std::shared_ptr<const MappedFile> file) {
  Parser parser(file->data(), file->size(), file->path());
  KITE_ASSIGN_OR_RETURN(File f, parser.parse());
  f.map_ = std::move(file);
  return f;
}

Result<File> File::parse_bytes(const uint8_t* data, size_t size, std::string name) {
  auto owned = std::make_shared<std::vector<uint8_t>>(data, data + size);
  Parser parser(owned->data(), owned->size(), std::move(name));
  KITE_ASSIGN_OR_RETURN(File f, parser.parse());
  f.owned_ = std::move(owned);
  return f;
}

const TensorInfo* File::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(std::string(name));
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace kite::gguf

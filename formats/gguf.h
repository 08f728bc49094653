// kite/formats/gguf.h — GGUF (v2, v3) reader and streaming writer.
//
// Reading maps the file and validates everything before handing anything out: every count,
// length, offset and size is checked against the bytes that are really there, so a hostile
// file costs at most its own size in work and memory and ends in an Error naming the file
// and what is wrong. Tensor data is never copied: TensorInfo::data points into the mapping,
// which the File keeps alive.
//
// Shapes use ggml's order: ne[0] is the innermost (contiguous) dimension, the one quant
// blocks run along.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <variant>
#include <vector>

#include "formats/quant/types.h"
#include "src/base/mapped_file.h"
#include "src/base/status.h"

namespace kite::gguf {

inline constexpr uint32_t kDefaultAlignment = 32;
inline constexpr int kMaxDims = 4;

// Wire type ids of metadata values (the variant index of Value::v equals the id).
enum class ValueType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, BOOL = 7,
  STRING = 8, ARRAY = 9, U64 = 10, I64 = 11, F64 = 12,
};
std::string_view value_type_name(ValueType t);

struct Value;
struct Array {
  ValueType elem_type = ValueType::U8;
  std::vector<Value> items;
};

struct Value {
  std::variant<uint8_t, int8_t, uint16_t, int16_t, uint32_t, int32_t, float, bool, std::string, Array,
               uint64_t, int64_t, double>
      v;

  Value() = default;
  template <class T>
    requires(!std::is_same_v<std::decay_t<T>, Value>)
  Value(T x) : v(std::move(x)) {}  // NOLINT: Value(uint32_t{7}), Value(std::string("x"))
  Value(const char* s) : v(std::string(s)) {}  // NOLINT

  ValueType type() const { return static_cast<ValueType>(v.index()); }
  template <class T>
  const T* get_if() const { return std::get_if<T>(&v); }
  // Any integer type (and bool) as int64 / any number as double; nullopt otherwise or on overflow.
  std::optional<int64_t> as_int() const;
  std::optional<double> as_float() const;
};

struct KeyValue {
  std::string key;
  Value value;
};

struct TensorInfo {
  std::string name;
  quant::Type type = quant::Type::F32;
  std::vector<int64_t> ne;   // ggml order, 1..4 dims
  uint64_t offset = 0;       // relative to the start of the data section
  uint64_t nbytes = 0;
  const uint8_t* data = nullptr;  // into the mapping (null for infos built for writing)

  int64_t n_elements() const;
};

// Ordered key/value metadata with an index and typed getters. Shared by GGUF files and
// every WeightSource (an HF folder presents its config.json under the same GGUF keys).
class Metadata {
 public:
  explicit Metadata(std::string source = {}) : source_(std::move(source)) {}

  // Adds a key; returns false (and changes nothing) if it is already present.
  bool insert(std::string key, Value value);
  // Adds or replaces a key (a replaced key keeps its position).
  void set(std::string key, Value value);
  void remove(std::string_view key);

  const std::vector<KeyValue>& entries() const { return kv_; }
  size_t size() const { return kv_.size(); }
  const Value* find(std::string_view key) const;
  bool has(std::string_view key) const { return find(key) != nullptr; }

  // Typed getters: an error names the source, the key, and the expected vs actual type.
  //   get<uint32_t>("llama.block_count"), get<std::string>("general.architecture"),
  //   get_array<std::string>("tokenizer.ggml.tokens").
  template <class T>
  Result<T> get(std::string_view key) const;
  template <class T>
  Result<std::vector<T>> get_array(std::string_view key) const;
  // Lenient getters for keys that writers store with varying widths.
  Result<int64_t> get_int(std::string_view key) const;
  Result<double> get_float(std::string_view key) const;

  const std::string& source() const { return source_; }

 private:
  std::string source_;  // file or folder, for messages
  std::vector<KeyValue> kv_;
  std::unordered_map<std::string, size_t> index_;
};

class File {
 public:
  static Result<File> open(const std::string& path);
  // Parses a mapped file / an in-memory image (the fuzzer); `name` is used in messages.
  static Result<File> parse(std::shared_ptr<const MappedFile> file);
  static Result<File> parse_bytes(const uint8_t* data, size_t size, std::string name);

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  // start of the tensor data section
  uint64_t file_size() const { return file_size_; }

  const Metadata& metadata() const { return meta_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }  // file order
  const TensorInfo* find_tensor(std::string_view name) const;

 private:
  friend class Parser;
  std::shared_ptr<const MappedFile> map_;   // keeps TensorInfo::data valid
  std::shared_ptr<std::vector<uint8_t>> owned_;  // backing bytes for parse_bytes()
  std::string path_;
  uint32_t version_ = 3;
  uint32_t alignment_ = kDefaultAlignment;
  uint64_t data_offset_ = 0;
  uint64_t file_size_ = 0;
  Metadata meta_;
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, size_t> tensor_index_;
};

// Streaming writer. Usage:
//   Writer w;  w.metadata().set("general.architecture", "llama"); ...
//   KITE_TRY(w.add_tensor(name, type, ne));  ...
//   KITE_TRY(w.begin(path));           // writes header + infos to a temp file beside path
//   for each tensor in add order: KITE_TRY(w.write_tensor_data(bytes, n));
//   KITE_TRY(w.finish());              // pads, flushes, renames onto path
// Nothing is ever left at `path` half-written: until finish() the output lives in a temp file,
// removed if the writer is destroyed unfinished. Offsets are assigned in add order, each
// tensor aligned to `alignment` (from general.alignment if set, else 32) and zero-padded.
class Writer {
 public:
  Writer();
  ~Writer();
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;

  void set_version(uint32_t v) { version_ = v; }
  Metadata& metadata() { return meta_; }
  const Metadata& metadata() const { return meta_; }
  Status add_tensor(std::string name, quant::Type type, std::vector<int64_t> ne);
  const std::vector<TensorInfo>& tensors() const { return tensors_; }

  Status begin(const std::string& path);
  // Writes the data of the next tensor (in add_tensor order); size must equal its nbytes.
  Status write_tensor_data(const void* data, size_t size);
  Status finish();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  uint32_t version_ = 3;
  Metadata meta_;
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, size_t> tensor_index_;
  size_t next_tensor_ = 0;
};

// Copies a file through Writer with every key and tensor unchanged (the round-trip check).
Status rewrite(const File& in, const std::string& out_path);

}  // namespace kite::gguf

// kite/formats/safetensors.h — safetensors reader (single files and sharded checkpoints).
//
// Layout of a file: an 8-byte little-endian header length N, N bytes of JSON (an object:
// tensor name -> {dtype, shape, data_offsets}, plus an optional "__metadata__" string map),
// then the data section; data_offsets are [begin, end) relative to the data section.
//
// Reading maps the file and validates the whole header before handing anything out: sizes,
// offsets, shapes and names are checked against the bytes really there, so a hostile file
// costs at most its own size in work and memory and ends in an Error naming the file and what
// is wrong. Tensor data is never copied: Tensor::data points into the mapping, which the File
// keeps alive.
//
// Shapes are given twice: `shape` as written (outermost first) and `ne` in ggml's order
// (ne[0] = innermost = the last safetensors dimension; a 0-dim scalar is ne = {1}).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "formats/gguf.h"
#include "formats/quant/types.h"
#include "src/base/mapped_file.h"
#include "src/base/status.h"

namespace kite::safetensors {

inline constexpr int kMaxDims = 4;  // ggml's limit; files with more dims are rejected

struct Tensor {
  std::string name;
  std::string dtype;                    // as written: "BF16", "F32", "U8", ...
  quant::Type type = quant::Type::F32;  // how kite stores it (U8 -> I8, BOOL -> I8, ...)
  std::vector<int64_t> shape;           // as written, outermost first (empty for a scalar)
  std::vector<int64_t> ne;              // ggml order, 1..4 dims
  uint64_t offset = 0;                  // relative to the start of the data section
  uint64_t nbytes = 0;
  const uint8_t* data = nullptr;  // into the mapping

  int64_t n_elements() const;
  // The same tensor as a GGUF-style TensorInfo (name, type, ne, offset, nbytes, data).
  gguf::TensorInfo info() const;
};

// Maps a safetensors dtype name to kite's storage type; an error for dtypes kite cannot
// represent (F8_*, complex, ...). Unsigned and bool types are kept as raw data of the same width.
Result<quant::Type> dtype_to_type(std::string_view dtype);

class File {
 public:
  static Result<File> open(const std::string& path);
  // Parses a mapped file / an in-memory image (the fuzzer); `name` is used in messages.
  static Result<File> parse(std::shared_ptr<const MappedFile> file);
  static Result<File> parse_bytes(const uint8_t* data, size_t size, std::string name);

  const std::string& path() const { return path_; }
  uint64_t header_size() const { return header_size_; }
  uint64_t data_offset() const { return 8 + header_size_; }  // start of the data section
  uint64_t file_size() const { return file_size_; }

  const std::map<std::string, std::string>& metadata() const { return meta_; }  // __metadata__
  const std::vector<Tensor>& tensors() const { return tensors_; }               // ordered by data offset
  const Tensor* find_tensor(std::string_view name) const;

 private:
  friend class HeaderParser;
  std::shared_ptr<const MappedFile> map_;        // keeps Tensor::data valid
  std::shared_ptr<std::vector<uint8_t>> owned_;  // backing bytes for parse_bytes()
  std::string path_;
  uint64_t header_size_ = 0;
  uint64_t file_size_ = 0;
  std::map<std::string, std::string> meta_;
  std::vector<Tensor> tensors_;
  std::unordered_map<std::string, size_t> index_;
};

// One checkpoint: a single .safetensors file or the shards listed by a
// model.safetensors.index.json ({"weight_map": {tensor: shard file}}). Every tensor the index
// lists must be in its shard, and a tensor may live in only one shard.
class Checkpoint {
 public:
  // `path`: a .safetensors file, an *.index.json, or a folder holding model.safetensors or
  // model.safetensors.index.json.
  static Result<Checkpoint> open(const std::string& path);
  // Parses an index given as text; shard names are resolved against `folder`.
  static Result<Checkpoint> open_index(std::string_view index_json, const std::string& folder,
                                       const std::string& index_name);

  const std::vector<File>& shards() const { return shards_; }
  const std::vector<Tensor>& tensors() const { return tensors_; }  // shard order, then offset
  const Tensor* find_tensor(std::string_view name) const;

 private:
  Status add_shard(File file);
  std::vector<File> shards_;
  std::vector<Tensor> tensors_;
  std::unordered_map<std::string, size_t> index_;
};

// Text safe to put in an error message: whole characters up to about `max_bytes` (then "..."),
// malformed bytes and control characters written as \xNN.
std::string printable(std::string_view s, size_t max_bytes = std::string::npos);

}  // namespace kite::safetensors

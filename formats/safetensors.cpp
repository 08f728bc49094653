#include "formats/safetensors.h"
#include "src/base/utf8.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <unordered_set>

namespace kite::safetensors {
namespace {

using Json = nlohmann::json;

// Deeper JSON than this is not a safetensors header (real ones nest 3 levels).
constexpr int kMaxJsonDepth = 64;
// A single dimension larger than this cannot describe real data (and keeps products sane).
constexpr uint64_t kMaxDim = uint64_t{1} << 62;

struct DtypeRow {
  std::string_view name;
  quant::Type type;
  size_t size;  // bytes per element
};

// Floats map 1:1; integer and bool types are raw data of the same width (ggml has no
// unsigned types, so U8 is stored as I8 etc.; the dtype string keeps the original).
constexpr DtypeRow kDtypes[] = {
    {"F32", quant::Type::F32, 4}, {"F16", quant::Type::F16, 2}, {"BF16", quant::Type::BF16, 2},
    {"F64", quant::Type::F64, 8}, {"I8", quant::Type::I8, 1},   {"U8", quant::Type::I8, 1},
    {"BOOL", quant::Type::I8, 1}, {"I16", quant::Type::I16, 2}, {"U16", quant::Type::I16, 2},
    {"I32", quant::Type::I32, 4}, {"U32", quant::Type::I32, 4}, {"I64", quant::Type::I64, 8},
    {"U64", quant::Type::I64, 8},
};

// Known dtypes that kite cannot represent (so the error says "unsupported", not "unknown").
constexpr std::string_view kUnsupportedDtypes[] = {"F8_E4M3", "F8_E5M2", "F8_E8M0", "F6_E2M3", "F6_E3M2", "F4", "C64"};

const DtypeRow* find_dtype(std::string_view name) {
  for (const auto& row : kDtypes)
    if (row.name == name) return &row;
  return nullptr;
}

}  // namespace

std::string printable(std::string_view s, size_t max_bytes) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    if (out.size() >= max_bytes) {
      out += "...";
      break;
    }
    const size_t n = utf8_seq_len(s, i);
    if (n == 0 || (n == 1 && static_cast<unsigned char>(s[i]) < 0x20)) {
      static const char* kHex = "0123456789abcdef";
      const auto c = static_cast<unsigned char>(s[i]);
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
      ++i;
    } else {
      out.append(s.substr(i, n));
      i += n;
    }
  }
  return out;
}

namespace {

// A user-supplied string, quoted and shortened, for an error message.
std::string show(std::string_view s) {
  return "'" + printable(s, 80) + "'";
}

std::string json_type(const Json& j) {
  return j.type_name();
}

// Parses JSON text, rejecting duplicate keys (nlohmann would silently keep the last one) and
// absurd nesting; never throws.
Result<Json> parse_json_strict(std::string_view text) {
  std::vector<std::unordered_set<std::string>> open_objects;
  std::string duplicate;
  int max_depth = 0;
  auto callback = [&](int depth, Json::parse_event_t event, Json& parsed) {
    max_depth = std::max(max_depth, depth);
    if (max_depth > kMaxJsonDepth) return false;
    switch (event) {
      case Json::parse_event_t::object_start:
        open_objects.emplace_back();
        break;
      case Json::parse_event_t::object_end:
        if (!open_objects.empty()) open_objects.pop_back();
        break;
      case Json::parse_event_t::key:
        if (!open_objects.empty() && parsed.is_string() && duplicate.empty() &&
            !open_objects.back().insert(parsed.get<std::string>()).second)
          duplicate = parsed.get<std::string>();
        break;
      default:
        break;
    }
    return true;
  };
  try {
    Json j = Json::parse(text.begin(), text.end(), callback, /*allow_exceptions=*/true);
    if (max_depth > kMaxJsonDepth) return make_error("JSON nests deeper than ", kMaxJsonDepth, " levels");
    if (!duplicate.empty()) return make_error("duplicate key ", show(duplicate));
    return j;
  } catch (const std::exception& e) {
    return make_error("malformed JSON: ", printable(e.what()));
  }
}

// A non-negative JSON integer, or an error naming `what`.
Result<uint64_t> get_uint(const Json& j, std::string_view what) {
  if (j.is_number_unsigned()) return j.get<uint64_t>();
  if (j.is_number_integer()) return make_error(what, " is negative (", j.get<int64_t>(), ")");
  return make_error(what, " must be a non-negative integer, got ", json_type(j));
}

}  // namespace

Result<quant::Type> dtype_to_type(std::string_view dtype) {
  if (const DtypeRow* row = find_dtype(dtype)) return row->type;
  for (auto u : kUnsupportedDtypes)
    if (u == dtype) return make_error("dtype ", dtype, " is not supported by kite");
  return make_error("unknown dtype ", show(dtype), " (expected F32, F16, BF16, F64, I8..I64, U8..U64 or BOOL)");
}

int64_t Tensor::n_elements() const {
  int64_t n = 1;
  for (int64_t d : ne) n *= d;
  return n;
}

gguf::TensorInfo Tensor::info() const {
  gguf::TensorInfo t;
  t.name = name;
  t.type = type;
  t.ne = ne;
  t.offset = offset;
  t.nbytes = nbytes;
  t.data = data;
  return t;
}

// Validates one header and fills a File. All errors are relative (the caller adds the name).
class HeaderParser {
 public:
  HeaderParser(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  Status parse(File& out) {
    if (size_ < 8) return make_error("file is ", size_, " bytes, too short for the 8-byte header length");
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | data_[i];
    if (n > size_ - 8)
      return make_error("header length ", n, " runs past the end of the file (", size_ - 8,
                        " bytes follow the length)");
    if (n < 2) return make_error("header length ", n, " is too short for a JSON object");
    out.header_size_ = n;
    out.file_size_ = size_;
    data_size_ = size_ - 8 - n;
    const uint8_t* data_section = data_ + 8 + n;

    std::string_view text(reinterpret_cast<const char*>(data_ + 8), n);
    if (text.front() != '{') return make_error("header does not start with '{'");
    auto parsed = parse_json_strict(text);
    if (!parsed) return parsed.error().with_context("header");
    const Json& header = *parsed;
    if (!header.is_object()) return make_error("header is a JSON ", json_type(header), ", not an object");

    for (const auto& [key, value] : header.items()) {
      if (key == "__metadata__") {
        KITE_TRY(parse_metadata(value, out));
        continue;
      }
      KITE_ASSIGN_OR_RETURN(Tensor t, parse_tensor(key, value));
      t.data = data_section + t.offset;
      out.tensors_.push_back(std::move(t));
    }
    KITE_TRY(check_overlaps(out.tensors_));
    for (size_t i = 0; i < out.tensors_.size(); ++i) out.index_.emplace(out.tensors_[i].name, i);
    return ok_status();
  }

 private:
  static Status parse_metadata(const Json& value, File& out) {
    if (!value.is_object()) return make_error("__metadata__ must be an object of strings, got ", json_type(value));
    for (const auto& [k, v] : value.items()) {
      if (!v.is_string()) return make_error("__metadata__ key ", show(k), " must be a string, got ", json_type(v));
      out.meta_.emplace(k, v.get<std::string>());
    }
    return ok_status();
  }

  Result<Tensor> parse_tensor(const std::string& name, const Json& value) const {
    auto fail = [&](const Error& e) { return e.with_context("tensor " + show(name)); };
    if (name.empty()) return make_error("a tensor has an empty name");
    if (!valid_utf8(name)) return make_error("a tensor name is not valid UTF-8");
    if (!value.is_object()) return fail(make_error("entry must be an object, got ", json_type(value)));

    Tensor t;
    t.name = name;
    const auto dtype_it = value.find("dtype");
    if (dtype_it == value.end() || !dtype_it->is_string()) return fail(make_error("missing or non-string 'dtype'"));
    t.dtype = dtype_it->get<std::string>();
    const DtypeRow* row = find_dtype(t.dtype);
    if (row == nullptr) {
      auto r = dtype_to_type(t.dtype);
      return fail(r.error());
    }
    t.type = row->type;

    const auto shape_it = value.find("shape");
    if (shape_it == value.end() || !shape_it->is_array()) return fail(make_error("missing or non-array 'shape'"));
    if (shape_it->size() > static_cast<size_t>(kMaxDims))
      return fail(make_error("has ", shape_it->size(), " dimensions; at most ", kMaxDims, " are supported"));
    uint64_t n_elements = 1;
    for (size_t i = 0; i < shape_it->size(); ++i) {
      auto d = get_uint((*shape_it)[i], "shape[" + std::to_string(i) + "]");
      if (!d) return fail(d.error());
      if (*d > kMaxDim) return fail(make_error("shape[", i, "] = ", *d, " is too large"));
      if (__builtin_mul_overflow(n_elements, *d, &n_elements) || n_elements > kMaxDim)
        return fail(make_error("element count of the shape overflows"));
      t.shape.push_back(static_cast<int64_t>(*d));
    }
    t.ne.assign(t.shape.rbegin(), t.shape.rend());
    if (t.ne.empty()) t.ne.push_back(1);

    const auto off_it = value.find("data_offsets");
    if (off_it == value.end() || !off_it->is_array() || off_it->size() != 2)
      return fail(make_error("'data_offsets' must be an array of two integers"));
    auto begin = get_uint((*off_it)[0], "data_offsets[0]");
    if (!begin) return fail(begin.error());
    auto end = get_uint((*off_it)[1], "data_offsets[1]");
    if (!end) return fail(end.error());
    if (*begin > *end) return fail(make_error("data_offsets [", *begin, ", ", *end, "] are reversed"));
    if (*end > data_size_)
      return fail(
          make_error("data_offsets [", *begin, ", ", *end, "] run past the data section (", data_size_, " bytes)"));
    uint64_t nbytes = 0;
    if (__builtin_mul_overflow(n_elements, static_cast<uint64_t>(row->size), &nbytes))
      return fail(make_error("byte size of the shape overflows"));
    if (nbytes != *end - *begin)
      return fail(make_error("data_offsets [", *begin, ", ", *end, "] hold ", *end - *begin, " bytes but shape x ",
                             t.dtype, " needs ", nbytes));
    t.offset = *begin;
    t.nbytes = nbytes;
    return t;
  }

  // Sorts by offset and rejects tensors whose bytes overlap (empty tensors overlap nothing).
  static Status check_overlaps(std::vector<Tensor>& tensors) {
    std::sort(tensors.begin(), tensors.end(), [](const Tensor& a, const Tensor& b) {
      return a.offset != b.offset ? a.offset < b.offset : a.name < b.name;
    });
    const Tensor* prev = nullptr;
    for (const Tensor& t : tensors) {
      if (t.nbytes == 0) continue;
      if (prev != nullptr && t.offset < prev->offset + prev->nbytes)
        return make_error("tensors ", show(prev->name), " [", prev->offset, ", ", prev->offset + prev->nbytes, ") and ",
                          show(t.name), " [", t.offset, ", ", t.offset + t.nbytes, ") overlap");
      prev = &t;
    }
    return ok_status();
  }

  const uint8_t* data_;
  size_t size_;
  uint64_t data_size_ = 0;
};

Result<File> File::open(const std::string& path) {
  KITE_ASSIGN_OR_RETURN(auto map, MappedFile::open(path));
  return parse(std::move(map));
}

Result<File> File::parse(std::shared_ptr<const MappedFile> file) {
  File out;
  out.path_ = file->path();
  HeaderParser parser(file->data(), file->size());
  auto st = parser.parse(out);
  if (!st) return st.error().with_context(out.path_);
  out.map_ = std::move(file);
  return out;
}

Result<File> File::parse_bytes(const uint8_t* data, size_t size, std::string name) {
  File out;
  out.path_ = std::move(name);
  out.owned_ = std::make_shared<std::vector<uint8_t>>(data, data + size);
  HeaderParser parser(out.owned_->data(), out.owned_->size());
  auto st = parser.parse(out);
  if (!st) return st.error().with_context(out.path_);
  return out;
}

const Tensor* File::find_tensor(std::string_view name) const {
  auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

// ---------------------------------------------------------------------------------------------
// Checkpoint

namespace {

namespace fs = std::filesystem;

constexpr std::string_view kSingleName = "model.safetensors";
constexpr std::string_view kIndexName = "model.safetensors.index.json";

// A shard must be a plain relative path inside the checkpoint folder.
Status check_shard_name(const std::string& shard) {
  if (shard.empty()) return make_error("empty shard file name");
  if (!valid_utf8(shard)) return make_error("shard file name is not valid UTF-8");
  fs::path p(shard);
  if (p.is_absolute()) return make_error("shard ", show(shard), " is an absolute path");
  for (const auto& part : p)
    if (part == "..") return make_error("shard ", show(shard), " leaves the checkpoint folder");
  return ok_status();
}

Result<std::string> read_text(const std::string& path) {
  KITE_ASSIGN_OR_RETURN(auto map, MappedFile::open(path));
  return std::string(reinterpret_cast<const char*>(map->data()), map->size());
}

}  // namespace

Status Checkpoint::add_shard(File file) {
  for (const Tensor& t : file.tensors()) {
    if (index_.count(t.name) != 0) {
      std::string other;
      for (const File& f : shards_)
        if (f.find_tensor(t.name) != nullptr) other = f.path();
      return make_error("tensor ", show(t.name), " is in two shards: ", other, " and ", file.path());
    }
    index_.emplace(t.name, tensors_.size());
    tensors_.push_back(t);
  }
  shards_.push_back(std::move(file));
  return ok_status();
}

Result<Checkpoint> Checkpoint::open(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    const fs::path dir(path);
    if (fs::exists(dir / kIndexName, ec)) return open((dir / kIndexName).string());
    if (fs::exists(dir / kSingleName, ec)) return open((dir / kSingleName).string());
    return make_error(path, ": no ", kSingleName, " or ", kIndexName, " in this folder");
  }
  const std::string name = fs::path(path).filename().string();
  if (name.size() >= 5 && name.compare(name.size() - 5, 5, ".json") == 0) {
    KITE_ASSIGN_OR_RETURN(std::string text, read_text(path));
    return open_index(text, fs::path(path).parent_path().string(), path);
  }
  KITE_ASSIGN_OR_RETURN(File file, File::open(path));
  Checkpoint out;
  KITE_TRY(out.add_shard(std::move(file)));
  return out;
}

Result<Checkpoint> Checkpoint::open_index(std::string_view index_json, const std::string& folder,
                                          const std::string& index_name) {
  auto fail = [&](const Error& e) { return e.with_context(index_name); };
  auto parsed = parse_json_strict(index_json);
  if (!parsed) return fail(parsed.error());
  const Json& index = *parsed;
  if (!index.is_object()) return fail(make_error("index is a JSON ", json_type(index), ", not an object"));
  const auto wm = index.find("weight_map");
  if (wm == index.end() || !wm->is_object()) return fail(make_error("missing or non-object 'weight_map'"));
  if (wm->empty()) return fail(make_error("'weight_map' lists no tensors"));

  std::map<std::string, std::vector<std::string>> by_shard;  // shard -> tensors it should hold
  for (const auto& [tensor, shard] : wm->items()) {
    if (!shard.is_string())
      return fail(
          make_error("weight_map entry for tensor ", show(tensor), " must be a string, got ", json_type(shard)));
    const std::string s = shard.get<std::string>();
    auto st = check_shard_name(s);
    if (!st) return fail(st.error().with_context("tensor " + show(tensor)));
    by_shard[s].push_back(tensor);
  }

  Checkpoint out;
  for (const auto& [shard, names] : by_shard) {
    const std::string shard_path = (fs::path(folder) / shard).string();
    auto file = File::open(shard_path);
    if (!file) return fail(file.error().with_context("shard " + show(shard)));
    for (const std::string& t : names)
      if (file->find_tensor(t) == nullptr)
        return fail(make_error("tensor ", show(t), " is listed in shard ", show(shard), " but not in it"));
    for (const Tensor& t : file->tensors()) {
      auto it = wm->find(t.name);
      if (it == wm->end())
        return fail(make_error("tensor ", show(t.name), " of shard ", show(shard), " is not in the weight_map"));
    }
    auto st = out.add_shard(std::move(*file));
    if (!st) return fail(st.error());
  }
  return out;
}

const Tensor* Checkpoint::find_tensor(std::string_view name) const {
  auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace kite::safetensors

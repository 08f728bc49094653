// GGUF streaming writer: header and tensor infos first, then tensor data one tensor at a time,
// into a temp file that is renamed onto the target only when everything was written.
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "formats/gguf.h"

namespace kite::gguf {

struct Writer::Impl {
  std::string path;
  std::string tmp_path;
  FILE* out = nullptr;
  uint64_t written = 0;  // bytes written so far
  uint64_t data_start = 0;
  uint32_t alignment = kDefaultAlignment;
  bool failed = false;

  ~Impl() {
    if (out != nullptr) std::fclose(out);
    if (!tmp_path.empty()) std::remove(tmp_path.c_str());
  }

  Status write(const void* data, size_t n) {
    if (n == 0) return ok_status();
    if (std::fwrite(data, 1, n, out) != n) {
      failed = true;
      return make_error(path, ": write failed: ", std::strerror(errno));
    }
    written += n;
    return ok_status();
  }
  template <class T>
  Status pod(T v) { return write(&v, sizeof(T)); }
  Status str(const std::string& s) {
    KITE_TRY(pod<uint64_t>(s.size()));
    return write(s.data(), s.size());
  }
  Status pad_to_alignment() {
    static const uint8_t zeros[256] = {};
    uint64_t pad = (alignment - written % alignment) % alignment;
    while (pad > 0) {
      const size_t k = static_cast<size_t>(std::min<uint64_t>(pad, sizeof(zeros)));
      KITE_TRY(write(zeros, k));
      pad -= k;
    }
    return ok_status();
  }

  Status value(const Value& v) {
    return std::visit(
        [this](const auto& x) -> Status {
          using T = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<T, std::string>) {
            return str(x);
          } else if constexpr (std::is_same_v<T, Array>) {
            KITE_TRY(pod<uint32_t>(static_cast<uint32_t>(x.elem_type)));
            KITE_TRY(pod<uint64_t>(x.items.size()));
            for (const Value& item : x.items) {
              if (item.type() != x.elem_type) return make_error(path, ": array item of the wrong type");
              KITE_TRY(value(item));
            }
            return ok_status();
          } else if constexpr (std::is_same_v<T, bool>) {
            return pod<uint8_t>(x ? 1 : 0);
          } else {
            return pod<T>(x);
          }
        },
        v.v);
  }
};

Writer::Writer() = default;
Writer::~Writer() = default;

Status Writer::add_tensor(std::string name, quant::Type type, std::vector<int64_t> ne) {
  if (impl_) return make_error("gguf writer: add_tensor('", name, "') after begin()");
  if (name.empty()) return make_error("gguf writer: empty tensor name");
  if (ne.size() > static_cast<size_t>(kMaxDims))
    return make_error("gguf writer: tensor '", name, "' has ", ne.size(), " dimensions (at most 4)");
  const quant::TypeTraits* tr = quant::find_traits(type);
  if (tr == nullptr) return make_error("gguf writer: tensor '", name, "' has unknown type");
  TensorInfo t;
  t.name = std::move(name);
  t.type = type;
  t.ne = std::move(ne);
  for (int64_t d : t.ne)
    if (d < 0) return make_error("gguf writer: tensor '", t.name, "' has a negative dimension");
  KITE_ASSIGN_OR_RETURN(size_t row, quant::row_size(type, t.ne.empty() ? 1 : t.ne[0]));
  const int64_t rows = t.ne.empty() || t.ne[0] == 0 ? 0 : t.n_elements() / t.ne[0];
  t.nbytes = static_cast<uint64_t>(row) * static_cast<uint64_t>(rows);
  if (!tensor_index_.emplace(t.name, tensors_.size()).second)
    return make_error("gguf writer: duplicate tensor name '", t.name, "'");
  tensors_.push_back(std::move(t));
  return ok_status();
}

Status Writer::begin(const std::string& path) {
  if (impl_) return make_error(path, ": gguf writer: begin() called twice");
  uint32_t alignment = kDefaultAlignment;
  if (const Value* a = meta_.find("general.alignment")) {
    const uint32_t* v = a->get_if<uint32_t>();
    if (v == nullptr || *v == 0 || (*v & (*v - 1)) != 0)
      return make_error(path, ": general.alignment must be a u32 power of two");
    alignment = *v;
  }
  // Assign offsets in add order, each aligned.
  uint64_t offset = 0;
  for (TensorInfo& t : tensors_) {
    t.offset = offset;
    offset += (t.nbytes + alignment - 1) / alignment * alignment;
  }

  auto impl = std::make_unique<Impl>();
  impl->path = path;
  impl->alignment = alignment;
  const std::filesystem::path target(path);
  std::string tmpl = (target.parent_path() / ("." + target.filename().string() + ".tmp.XXXXXX")).string();
  int fd = ::mkstemp(tmpl.data());
  if (fd < 0) return make_error(path, ": cannot create a temp file beside it: ", std::strerror(errno));
  impl->tmp_path = tmpl;
  const mode_t mask = ::umask(0);  // mkstemp creates 0600; give the result the usual permissions
  ::umask(mask);
  ::fchmod(fd, 0666 & ~mask);
  impl->out = ::fdopen(fd, "wb");
  if (impl->out == nullptr) {
    ::close(fd);
    return make_error(path, ": fdopen failed: ", std::strerror(errno));
  }
  std::setvbuf(impl->out, nullptr, _IOFBF, 1 << 20);

  KITE_TRY(impl->pod<uint32_t>(0x46554747));
  KITE_TRY(impl->pod<uint32_t>(version_));
  KITE_TRY(impl->pod<uint64_t>(tensors_.size()));
  KITE_TRY(impl->pod<uint64_t>(meta_.size()));
  for (const KeyValue& kv : meta_.entries()) {
    KITE_TRY(impl->str(kv.key));
    KITE_TRY(impl->pod<uint32_t>(static_cast<uint32_t>(kv.value.type())));
    KITE_TRY(impl->value(kv.value));
  }
  for (const TensorInfo& t : tensors_) {
    KITE_TRY(impl->str(t.name));
    KITE_TRY(impl->pod<uint32_t>(static_cast<uint32_t>(t.ne.size())));
    for (int64_t d : t.ne) KITE_TRY(impl->pod<uint64_t>(static_cast<uint64_t>(d)));
    KITE_TRY(impl->pod<uint32_t>(static_cast<uint32_t>(t.type)));
    KITE_TRY(impl->pod<uint64_t>(t.offset));
  }
  // llama.cpp pads to the data section only when there is one (vocab-only files end here).
  if (!tensors_.empty()) KITE_TRY(impl->pad_to_alignment());
  impl->data_start = impl->written;
  impl_ = std::move(impl);
  next_tensor_ = 0;
  return ok_status();
}

Status Writer::write_tensor_data(const void* data, size_t size) {
  if (!impl_) return make_error("gguf writer: write_tensor_data() before begin()");
  if (next_tensor_ >= tensors_.size())
    return make_error(impl_->path, ": more tensor data written than tensors declared");
  const TensorInfo& t = tensors_[next_tensor_];
  if (size != t.nbytes)
    return make_error(impl_->path, ": tensor '", t.name, "' expects ", t.nbytes, " bytes, got ", size);
  KITE_TRY(impl_->write(data, size));
  KITE_TRY(impl_->pad_to_alignment());
  ++next_tensor_;
  return ok_status();
}

Status Writer::finish() {
  if (!impl_) return make_error("gguf writer: finish() before begin()");
  if (next_tensor_ != tensors_.size())
    return make_error(impl_->path, ": only ", next_tensor_, " of ", tensors_.size(), " tensors were written");
  if (std::fflush(impl_->out) != 0 || ::fsync(::fileno(impl_->out)) != 0)
    return make_error(impl_->path, ": flush failed: ", std::strerror(errno));
  std::fclose(impl_->out);
  impl_->out = nullptr;
  if (std::rename(impl_->tmp_path.c_str(), impl_->path.c_str()) != 0)
    return make_error(impl_->path, ": cannot move the finished file into place: ", std::strerror(errno));
  impl_->tmp_path.clear();
  impl_.reset();
  return ok_status();
}

Status rewrite(const File& in, const std::string& out_path) {
  Writer w;
  w.set_version(in.version());
  for (const KeyValue& kv : in.metadata().entries()) w.metadata().set(kv.key, kv.value);
  for (const TensorInfo& t : in.tensors()) KITE_TRY(w.add_tensor(t.name, t.type, t.ne));
  KITE_TRY(w.begin(out_path));
  for (const TensorInfo& t : in.tensors()) KITE_TRY(w.write_tensor_data(t.data, t.nbytes));
  return w.finish();
}

}  // namespace kite::gguf

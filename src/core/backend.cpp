#include "src/core/backend.h"

#include <charconv>
#include <mutex>

namespace kite {
namespace {

struct Registry {
  std::mutex mu;
  std::vector<std::pair<std::string, BackendFactory>> entries;
};

Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

Status Backend::copy(const Tensor& dst, size_t dst_offset, const Tensor& src, size_t src_offset, size_t bytes) {
  std::vector<uint8_t> host(bytes);
  KITE_TRY(download(src, host.data(), bytes, src_offset));
  return upload(dst, host.data(), bytes, dst_offset);
}

// Defined in backends/registry.cpp, the one place that knows which backends were compiled in.
void register_builtin_backends();

static void ensure_builtins() {
  static std::once_flag once;
  std::call_once(once, [] { register_builtin_backends(); });
}

void register_backend(std::string name, BackendFactory factory) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.entries.emplace_back(std::move(name), std::move(factory));
}

std::vector<std::string> backend_names() {
  ensure_builtins();
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<std::string> names;
  for (const auto& e : r.entries) names.push_back(e.first);
  return names;
}

Result<std::unique_ptr<Backend>> create_backend(std::string_view name, const BackendOptions& options) {
  ensure_builtins();
  BackendOptions opts = options;
  // "cuda:1", "vulkan:2": a device index after the name.
  if (const size_t colon = name.find(':'); colon != std::string_view::npos) {
    const std::string_view index = name.substr(colon + 1);
    int d = 0;
    const auto [end, ec] = std::from_chars(index.data(), index.data() + index.size(), d);
    if (ec != std::errc() || end != index.data() + index.size() || d < 0)
      return make_error("device '", name, "': expected a device index (a number >= 0) after ':'");
    opts.device = d;
    name = name.substr(0, colon);
  }
  BackendFactory factory;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    for (const auto& e : r.entries)
      if (e.first == name) factory = e.second;
  }
  if (!factory) {
    std::string known;
    for (const auto& n : backend_names()) known += (known.empty() ? "" : ", ") + n;
    return make_error("unknown device '", name, "' (available: ", known, ")");
  }
  return factory(opts);
}

}  // namespace kite

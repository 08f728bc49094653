#include "src/core/backend.h"

#include <charconv>
#include <mutex>

#include "src/core/devices.h"

namespace kite {
namespace {

struct Entry {
  std::string name;
  BackendFactory factory;
  DeviceLister lister;  // (register_device_lister)
  ChoiceReporter choices;  // (register_choice_reporter)
};

struct Registry {
  std::mutex mu;
  std::vector<Entry> entries;
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

Result<std::string> Backend::set_profile(OpProfile*) {
  return make_error(name(), ": this backend cannot time its launches (--profile)");
}

Status Backend::download_many(const Tensor& t, std::span<const size_t> offsets, size_t bytes, void* dst) const {
  for (size_t i = 0; i < offsets.size(); ++i)
    KITE_TRY(download(t, static_cast<uint8_t*>(dst) + i * bytes, bytes, offsets[i]));
  return ok_status();
}

// Defined in backends/registry.cpp, the one place that knows which backends were compiled in.
void register_builtin_backends();

static void ensure_builtins() {
  static std::once_flag once;
  std::call_once(once, [] { register_builtin_backends(); });
}

// The registry's entry for backend `name` (a copy: factories run outside the lock).
static Result<Entry> find_entry(std::string_view name) {
  ensure_builtins();
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    for (const auto& e : r.entries)
      if (e.name == name) return e;
  }
  std::string known;
  for (const auto& n : backend_names()) known += (known.empty() ? "" : ", ") + n;
  return make_error("unknown device '", name, "' (available: ", known, ")");
}

void register_backend(std::string name, BackendFactory factory) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.entries.push_back({std::move(name), std::move(factory), nullptr, nullptr});
}

void register_device_lister(std::string backend, DeviceLister lister) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (auto& e : r.entries)
    if (e.name == backend) e.lister = std::move(lister);
}

void register_choice_reporter(std::string backend, ChoiceReporter reporter) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (auto& e : r.entries)
    if (e.name == backend) e.choices = std::move(reporter);
}

std::vector<std::string> backend_names() {
  ensure_builtins();
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<std::string> names;
  for (const auto& e : r.entries) names.push_back(e.name);
  return names;
}

Result<std::unique_ptr<Backend>> create_backend(std::string_view name, const BackendOptions& options) {
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
  KITE_ASSIGN_OR_RETURN(const Entry e, find_entry(name));
  return e.factory(opts);
}

Result<std::vector<DeviceInfo>> list_devices(std::string_view backend) {
  KITE_ASSIGN_OR_RETURN(const Entry e, find_entry(backend));
  if (!e.lister) return make_error(backend, ": this backend does not list its devices");
  return e.lister();
}

std::vector<std::string> measured_choices(std::string_view backend) {
  const Result<Entry> e = find_entry(backend.substr(0, backend.find(':')));
  return e.ok() && e->choices ? e->choices() : std::vector<std::string>{};
}

}  // namespace kite

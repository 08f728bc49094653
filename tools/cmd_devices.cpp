// kite devices [--json]
// The devices kite can compute on, per backend compiled into this build, with the --device value
// that selects each (cuda:1, vulkan:0, cpu), its memory and what tells it apart; a backend
// without devices says why (no driver, no GPU). Exit 0 whenever the listing itself worked: the
// CPU is always there.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "src/core/backend.h"
#include "src/core/devices.h"
#include "tools/commands.h"

namespace kite::tools {
namespace {

std::string gib(size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f GiB", static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

// What --device takes for device `i` of `backend`: the CPU is one device, a GPU backend's
// first is also its bare name.
std::string device_spec(const std::string& backend, size_t i) {
  return backend == "cpu" ? backend : backend + ":" + std::to_string(i);
}

int run_devices(bool json) {
  nlohmann::json doc = nlohmann::json::array();
  for (const std::string& backend : backend_names()) {
    auto devs = list_devices(backend);
    if (json) {
      nlohmann::json b = {{"backend", backend}, {"devices", nlohmann::json::array()}};
      if (!devs.ok()) b["error"] = devs.error().message;
      for (size_t i = 0; devs.ok() && i < devs->size(); ++i) {
        const DeviceInfo& d = (*devs)[i];
        b["devices"].push_back({{"device", device_spec(backend, i)},
                                {"name", d.name},
                                {"details", d.details},
                                {"memory_total", d.memory_total},
                                {"memory_free", d.memory_free}});
      }
      doc.push_back(std::move(b));
      continue;
    }
    if (!devs.ok()) {
      std::printf("%-9s  none: %s\n", backend.c_str(), devs.error().message.c_str());
      continue;
    }
    for (size_t i = 0; i < devs->size(); ++i) {
      const DeviceInfo& d = (*devs)[i];
      std::string mem = d.memory_total > 0 ? gib(d.memory_total) : "?";
      if (d.memory_free > 0) mem += " (" + gib(d.memory_free) + " free)";
      std::printf("%-9s  %s  |  %s  |  %s\n", device_spec(backend, i).c_str(), d.name.c_str(), mem.c_str(),
                  d.details.c_str());
    }
  }
  if (json) std::printf("%s\n", doc.dump(2).c_str());
  return kExitOk;
}

}  // namespace

void register_devices(CLI::App& app, Action* run) {
  auto json = std::make_shared<bool>(false);
  CLI::App* cmd = app.add_subcommand("devices", "List the devices kite can compute on (the values --device takes)");
  cmd->add_flag("--json", *json, "Print a JSON array: per backend its devices, or the error saying why it has none");
  cmd->callback([json, run] { *run = [json] { return run_devices(*json); }; });
}

}  // namespace kite::tools

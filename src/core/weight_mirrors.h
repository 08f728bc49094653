// kite/src/core/weight_mirrors.h — device copies of host weights, shared by every backend
// (context) on one device, for the device backends (CUDA, Vulkan).
//
// A weight in host memory (a leaf of the file mapping) is copied to the device on first use by
// any backend; a backend that uses it takes a hold (recorded in its MirrorHolds) and drops all
// of them when it goes. A copy lives while a backend holds it, so contexts on one model share
// one copy, and a model unloaded after its contexts leaves nothing behind that a later mapping
// at the same address could be mistaken for. Copies are keyed by host address and size: a
// request is served by a copy of the same address at least as large. Not thread-safe: the
// owner locks.
#pragma once

#include <algorithm>
#include <cstddef>
#include <map>
#include <utility>
#include <vector>

#include "src/base/status.h"

namespace kite {

// What one backend holds.
using MirrorHolds = std::vector<std::pair<const void*, size_t>>;

template <class Mem>  // the device memory of one copy (moved in, destroyed when released)
class WeightMirrors {
 public:
  // The copy of `bytes` at `host`, made by `upload(bytes) -> Result<Mem>` when there is none;
  // `holds` gets the hold (once per backend). `*made` says whether this call made the copy
  // or this backend first held it (device addresses it captured before are still valid).
  template <class Upload>
  Result<const Mem*> acquire(const void* host, size_t bytes, MirrorHolds& holds, Upload&& upload,
                             bool* newly_held = nullptr) {
    auto it = copies_.lower_bound({host, bytes});
    if (it == copies_.end() || it->first.first != host) {
      KITE_ASSIGN_OR_RETURN(Mem mem, upload(bytes));
      it = copies_.emplace(std::make_pair(host, bytes), Copy{std::move(mem), 0}).first;
      bytes_ += bytes;
    }
    const bool first = std::find(holds.begin(), holds.end(), it->first) == holds.end();
    if (first) {
      holds.push_back(it->first);
      ++it->second.holders;
    }
    if (newly_held != nullptr) *newly_held = first;
    return &it->second.mem;
  }

  // Drops a backend's holds; copies nobody holds are freed.
  void release(MirrorHolds& holds) {
    for (const auto& key : holds) {
      auto it = copies_.find(key);
      if (it == copies_.end() || --it->second.holders > 0) continue;
      bytes_ -= it->first.second;
      copies_.erase(it);
    }
    holds.clear();
  }

  // Whether some backend holds a copy serving `bytes` at `host`.
  bool has(const void* host, size_t bytes) const {
    auto it = copies_.lower_bound({host, bytes});
    return it != copies_.end() && it->first.first == host;
  }

  size_t bytes() const { return bytes_; }  // host bytes copied, all copies

 private:
  struct Copy {
    Mem mem;
    int holders = 0;
  };
  std::map<std::pair<const void*, size_t>, Copy> copies_;
  size_t bytes_ = 0;
};

}  // namespace kite

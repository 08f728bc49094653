#include "backends/cpu/one_row.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "backends/cpu/cpu_features.h"

namespace kite::cpu {
namespace {

constexpr double kMinBytes = 256.0 * 1024 * 1024;  // per way
constexpr double kSmallBytes = 64.0 * 1024 * 1024;
constexpr double kTilesMargin = 1.03;

constexpr int kMeasure = -1;
int way_from_env() {
  const char* v = std::getenv("KITE_CPU_DECODE");
  if (v != nullptr && std::strcmp(v, "rows") == 0) return static_cast<int>(OneRowWay::kRows);
  if (v != nullptr && std::strcmp(v, "tiles") == 0) return static_cast<int>(OneRowWay::kTiles);
  return kMeasure;
}
std::atomic<int> g_forced{way_from_env()};

std::mutex g_mu;
std::vector<OneRowDecision> g_decisions;  // guarded by g_mu

// The decision for (level, type), or kMeasure. Caller holds g_mu.
int find_decision(const char* level, DType t) {
  for (const OneRowDecision& d : g_decisions)
    if (d.level == level && d.type == t) return static_cast<int>(d.way);
  return kMeasure;
}

// Bytes a calibration pass reads: twice the last-level cache, so that each pass finds the
// weights in DRAM as decode does (at least kMinBytes; a model with fewer bytes of the type
// reads what it has, as its decode steps do).
double pass_bytes() {
  const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
  return std::max(kMinBytes, l3 > 0 ? 2.0 * static_cast<double>(l3) : 0.0);
}

}  // namespace

void set_one_row_way(std::optional<OneRowWay> way) {
  g_forced.store(way ? static_cast<int>(*way) : kMeasure, std::memory_order_relaxed);
}

std::vector<OneRowDecision> one_row_decisions() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_decisions;
}

void reset_one_row_decisions() {
  std::lock_guard<std::mutex> lock(g_mu);
  g_decisions.clear();
}

void OneRowTuner::prepare(std::span<Tensor* const> nodes, const TimeNode& time_node) {
  const int level = static_cast<int>(active_simd_level());
  if (level != level_) way_.fill(kMeasure), level_ = level;
  if (g_forced.load(std::memory_order_relaxed) != kMeasure) return;
  for (Tensor* n : nodes) {
    if (!one_row_has_choice(n)) continue;
    const DType t = n->src[0]->type;
    int8_t& w = way_[static_cast<size_t>(t)];
    if (w != kMeasure) continue;
    {
      std::lock_guard<std::mutex> lock(g_mu);
      w = static_cast<int8_t>(find_decision(simd_level_name(static_cast<SimdLevel>(level_)), t));
    }
    if (w == kMeasure) decide(t, nodes, time_node);
  }
}

OneRowWay OneRowTuner::way(const Tensor* n) const {
  if (!one_row_has_choice(n)) return OneRowWay::kRows;
  if (const int f = g_forced.load(std::memory_order_relaxed); f != kMeasure) return static_cast<OneRowWay>(f);
  const int w = way_[static_cast<size_t>(n->src[0]->type)];
  return w == kMeasure ? OneRowWay::kRows : static_cast<OneRowWay>(w);
}

void OneRowTuner::decide(DType t, std::span<Tensor* const> nodes, const TimeNode& time_node) {
  // Copies of the step's one-row mul_mats of type t, in graph order, up to a pass's bytes: the
  // same weights, against one activation row of ones into a scratch output, without bias.
  struct Copy {
    Tensor x, y;
  };
  std::vector<Tensor*> of_type;
  double total = 0;
  for (Tensor* n : nodes)
    if (one_row_has_choice(n) && n->src[0]->type == t) {
      of_type.push_back(n);
      total += static_cast<double>(n->src[0]->nbytes());
    }
  if (total < kSmallBytes) {  // fits in caches, and decode takes no time: the row kernels, unmeasured
    way_[static_cast<size_t>(t)] = static_cast<int8_t>(OneRowWay::kRows);
    return;
  }
  std::vector<Copy> copies;
  std::vector<float> x, y;
  double bytes = 0;
  const double budget = pass_bytes();
  for (Tensor* n : of_type) {
    if (bytes >= budget) break;
    const int64_t k = n->src[0]->ne[0], m = n->src[0]->ne[1];
    x.resize(std::max<size_t>(x.size(), static_cast<size_t>(k)), 1.f);
    y.resize(std::max<size_t>(y.size(), static_cast<size_t>(m)));
    Copy& c = copies.emplace_back();
    c.x.type = DType::F32;
    c.x.ne = {k, 1, 1, 1};
    c.x.nb = contiguous_strides(DType::F32, c.x.ne);
    c.y = *n;
    c.y.src = {n->src[0], nullptr, nullptr};
    c.y.ne = {m, 1, 1, 1};
    c.y.nb = contiguous_strides(DType::F32, c.y.ne);
    c.y.buffer = nullptr;
    bytes += static_cast<double>(n->src[0]->nbytes());
  }
  for (Copy& c : copies) c.x.data = x.data(), c.y.data = y.data(), c.y.src[1] = &c.x;
  // An untimed pass first (it maps the weights' pages into this process where no step has yet),
  // then ABBA passes until each way has read kMinBytes.
  for (Copy& c : copies) time_node(&c.y, OneRowWay::kRows);
  std::array<double, 2> seconds{}, read{};
  while (std::min(read[0], read[1]) < kMinBytes) {
    for (const int w : {0, 1, 1, 0}) {
      for (Copy& c : copies) seconds[w] += time_node(&c.y, static_cast<OneRowWay>(w));
      read[w] += bytes;
    }
  }
  const double rows = read[0] / seconds[0] / 1e9, tiles = read[1] / seconds[1] / 1e9;
  const OneRowWay way = tiles > rows * kTilesMargin ? OneRowWay::kTiles : OneRowWay::kRows;
  const char* level = simd_level_name(static_cast<SimdLevel>(level_));
  std::lock_guard<std::mutex> lock(g_mu);
  int w = find_decision(level, t);  // another backend's, if it got there first
  if (w == kMeasure) {
    g_decisions.push_back({level, t, way, rows, tiles});
    w = static_cast<int>(way);
  }
  way_[static_cast<size_t>(t)] = static_cast<int8_t>(w);
}

}  // namespace kite::cpu

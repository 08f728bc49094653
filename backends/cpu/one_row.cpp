#include "backends/cpu/one_row.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "backends/cpu/cpu_features.h"
#include "formats/quant/types.h"

namespace kite::cpu {
namespace {

constexpr double kMinBytes = 256.0 * 1024 * 1024;  // per way
constexpr double kSmallBytes = 64.0 * 1024 * 1024;
constexpr double kTilesMargin = 1.03;

constexpr int kMeasure = -1;
int way_from_env() {
  const char* v = std::getenv("KITE_CPU_DECODE");
  for (const OneRowWay w : {OneRowWay::kRows, OneRowWay::kRows4, OneRowWay::kTiles})
    if (v != nullptr && std::strcmp(v, one_row_way_name(w)) == 0) return static_cast<int>(w);
  return kMeasure;
}
std::atomic<int> g_forced{way_from_env()};

std::mutex g_mu;
std::vector<OneRowDecision> g_decisions;  // guarded by g_mu

// The decision for (level, type) at `threads`, else any thread count's (nullptr: none). Caller
// holds g_mu.
const OneRowDecision* find_decision(const char* level, DType t, int threads) {
  const OneRowDecision* other = nullptr;
  for (const OneRowDecision& d : g_decisions) {
    if (d.level != level || d.type != t) continue;
    if (d.threads == threads) return &d;
    other = &d;
  }
  return other;
}

// Bytes a calibration pass reads: twice the last-level cache, so that each pass finds the
// weights in DRAM as decode does (at least kMinBytes; a model with fewer bytes of the type
// reads what it has, as its decode steps do).
double pass_bytes() {
  const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
  return std::max(kMinBytes, l3 > 0 ? 2.0 * static_cast<double>(l3) : 0.0);
}

}  // namespace

const char* one_row_way_name(OneRowWay way) {
  switch (way) {
    case OneRowWay::kRows: return "rows";
    case OneRowWay::kRows4: return "rows4";
    case OneRowWay::kTiles: return "tiles";
  }
  return "?";
}

void set_one_row_way(std::optional<OneRowWay> way) {
  g_forced.store(way ? static_cast<int>(*way) : kMeasure, std::memory_order_relaxed);
}

std::vector<OneRowDecision> one_row_decisions() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_decisions;
}

std::vector<std::string> one_row_report() {
  std::vector<std::string> lines;
  for (const OneRowDecision& d : one_row_decisions()) {
    const quant::TypeTraits* tr = quant::find_traits(d.type);
    std::string s = "decode " + (tr != nullptr ? std::string(tr->name) : "?") + ": " + one_row_way_name(d.way) +
                    " at " + std::to_string(d.threads) + (d.threads == 1 ? " thread (" : " threads (");
    const char* sep = "";
    for (const OneRowWay w : {OneRowWay::kRows, OneRowWay::kRows4, OneRowWay::kTiles}) {
      const double gbps = w == OneRowWay::kRows ? d.rows_gbps : w == OneRowWay::kRows4 ? d.rows4_gbps : d.tiles_gbps;
      if (gbps <= 0) continue;
      char b[64];
      std::snprintf(b, sizeof b, "%s%s %.1f", sep, one_row_way_name(w), gbps);
      s += b;
      sep = ", ";
    }
    lines.push_back(s + " GB/s)");
  }
  return lines;
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
    if (one_row_choices(n) == 0) continue;
    const DType t = n->src[0]->type;
    if (way_[static_cast<size_t>(t)] == kMeasure) decide(t, nodes, time_node);
  }
}

OneRowWay OneRowTuner::way(const Tensor* n) const {
  const unsigned ways = one_row_choices(n);
  if (ways == 0) return OneRowWay::kRows;
  int w = g_forced.load(std::memory_order_relaxed);
  if (w == kMeasure) w = way_[static_cast<size_t>(n->src[0]->type)];
  if (w == kMeasure) return OneRowWay::kRows;
  const auto way = static_cast<OneRowWay>(w);
  return ways & one_row_bit(way) ? way : OneRowWay::kRows;
}

void OneRowTuner::decide(DType t, std::span<Tensor* const> nodes, const TimeNode& time_node) {
  const char* level = simd_level_name(static_cast<SimdLevel>(level_));
  int8_t& decided = way_[static_cast<size_t>(t)];
  // The step's one-row mul_mats of type t, and the ways they have.
  std::vector<Tensor*> of_type;
  unsigned ways = 0;
  double total = 0;
  for (Tensor* n : nodes)
    if (const unsigned w = one_row_choices(n); w != 0 && n->src[0]->type == t) {
      of_type.push_back(n);
      ways |= w;
      total += static_cast<double>(n->src[0]->nbytes());
    }
  const bool four = (ways & one_row_bit(OneRowWay::kRows4)) != 0;
  // Which ways to time: all, or one row against four where a backend of another thread count
  // decided for the rows (in place it decided for every thread count).
  std::vector<OneRowWay> timed = {OneRowWay::kRows};
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (const OneRowDecision* d = find_decision(level, t, threads_)) {
      if (d->threads == threads_ || d->way == OneRowWay::kTiles || !four) {
        decided = static_cast<int8_t>(d->way);
        return;
      }
    } else if (ways & one_row_bit(OneRowWay::kTiles)) {
      timed.push_back(OneRowWay::kTiles);
    }
  }
  if (total < kSmallBytes) {  // fits in caches, and decode takes no time: the row kernels, unmeasured
    decided = static_cast<int8_t>(four ? OneRowWay::kRows4 : OneRowWay::kRows);
    return;
  }
  if (four) timed.push_back(OneRowWay::kRows4);

  // Copies of those mul_mats in graph order, up to a pass's bytes: the same weights, against one
  // activation row of ones into a scratch output, without bias.
  struct Copy {
    Tensor x, y;
  };
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
  // then the ways forward and back (ABC, CBA: a drift of the host's speed weighs on each alike)
  // until each has read kMinBytes.
  for (Copy& c : copies) time_node(&c.y, OneRowWay::kRows);
  std::array<double, 3> seconds{}, read{};
  auto pass = [&](OneRowWay w) {
    const auto i = static_cast<size_t>(w);
    for (Copy& c : copies) seconds[i] += time_node(&c.y, w);
    read[i] += bytes;
  };
  while (read[0] < kMinBytes) {
    for (auto it = timed.begin(); it != timed.end(); ++it) pass(*it);
    for (auto it = timed.rbegin(); it != timed.rend(); ++it) pass(*it);
  }
  std::array<double, 3> gbps{};
  for (const OneRowWay w : timed)
    gbps[static_cast<size_t>(w)] = read[static_cast<size_t>(w)] / seconds[static_cast<size_t>(w)] / 1e9;
  const double rows = gbps[static_cast<size_t>(OneRowWay::kRows)];
  const double rows4 = gbps[static_cast<size_t>(OneRowWay::kRows4)];
  const double tiles = gbps[static_cast<size_t>(OneRowWay::kTiles)];
  const OneRowWay best_rows = rows4 > rows ? OneRowWay::kRows4 : OneRowWay::kRows;
  OneRowWay way = tiles > std::max(rows, rows4) * kTilesMargin ? OneRowWay::kTiles : best_rows;
  std::lock_guard<std::mutex> lock(g_mu);
  const OneRowDecision* d = find_decision(level, t, threads_);  // another backend's, if it got there first
  if (d != nullptr && d->threads == threads_) {
    way = d->way;
  } else {
    if (d != nullptr)  // another thread count's: its rows or tiles (their bits), then our faster rows
      way = d->way == OneRowWay::kTiles ? OneRowWay::kTiles : best_rows;
    g_decisions.push_back({level, t, threads_, way, rows, rows4, tiles});
  }
  decided = static_cast<int8_t>(way);
}

}  // namespace kite::cpu

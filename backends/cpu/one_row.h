// kite/backends/cpu/one_row.h — which OneRowWay (ops.h) a decode step's mul_mats take, measured.
//
// A decode step streams every weight from DRAM once, so its speed is how fast each core pulls
// weight bytes in while it multiplies them, and which way does that faster depends on the
// machine: on a 2-core Zen 5 whose cores each read 27 GB/s the one-row kernels led; on a 2-vCPU
// Sapphire Rapids VM whose cores read 11-14 GB/s at most, wgemm's 16 row streams ran 1.3-1.6x
// faster (bench/RESULTS.md, 2026-12-06). So the CPU backend measures, once per process, SIMD
// level and weight type: the first time a step holds one-row mul_mats of an undecided type,
// before the step runs, copies of them (the same weights; activations and outputs in scratch, so
// nothing the step computes is touched) run once untimed (faulting the weights' pages in), then
// both ways in ABBA passes, each pass over at least twice the last-level cache's bytes where the
// model has them (weights come from DRAM, as in decode), until each way has read kMinBytes. The
// in-place way must win by 3%, else the row kernels stay. A type with under kSmallBytes (64 MiB)
// of one-row weights in the step (a small model, cache-resident, fast either way) takes the row
// kernels unmeasured, so that its runs give the same bits in every process. Deciding before the
// first use keeps every context of the process on one way, so two contexts computing the same
// step get the same bits. A decision reads about five passes over min(the type's one-row
// weights, max(256 MiB, 2 x L3)) once per process: 2.6 GB for an 8B model on a 260 MiB-L3 host.
// KITE_CPU_DECODE=rows|tiles forces a way (anything else: measure), for runs that must give the
// same bits on every machine and run.
#pragma once

#include <array>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "backends/cpu/matmul.h"
#include "backends/cpu/ops.h"

namespace kite::cpu {

// Forces one way for every backend (nullopt: measure), over KITE_CPU_DECODE. For tests and
// benchmarks; not thread-safe against a running compute.
void set_one_row_way(std::optional<OneRowWay> way);

// A decision this process made, with the rates (weight GB/s) each way measured.
struct OneRowDecision {
  std::string level;  // the SIMD level's name
  DType type;
  OneRowWay way;
  double rows_gbps, tiles_gbps;
};
std::vector<OneRowDecision> one_row_decisions();
// Forgets them (a backend keeps the ways it already took). For tests.
void reset_one_row_decisions();

// One backend's view of the decisions; a backend computes one graph at a time, so no locking
// here (decisions are shared through a mutex-guarded table).
class OneRowTuner {
 public:
  // Runs a node one way and returns the seconds it took (the backend's thread team).
  using TimeNode = std::function<double(Tensor*, OneRowWay)>;
  // Before a step: decides every weight type of its one-row mul_mats that no one has decided.
  void prepare(std::span<Tensor* const> nodes, const TimeNode& time_node);
  // The way for node n (kRows where it has no choice).
  OneRowWay way(const Tensor* n) const;

 private:
  void decide(DType t, std::span<Tensor* const> nodes, const TimeNode& time_node);

  int level_ = -1;                        // the SimdLevel of the ways below
  std::array<int8_t, kTypeSlots> way_{};  // per type: -1 undecided, else a OneRowWay
};

}  // namespace kite::cpu

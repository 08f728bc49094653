// kite/backends/cpu/one_row.h — which OneRowWay (ops.h) a decode step's mul_mats take, measured.
//
// A decode step streams every weight from DRAM once, so its speed is how fast each core pulls
// weight bytes in while it multiplies them, and which way does that faster depends on the
// machine: on a 2-core Zen 5 whose cores each read 27 GB/s the one-row kernels led; on a 2-vCPU
// Sapphire Rapids VM whose cores read 11-14 GB/s at most, wgemm's 16 row streams ran 1.3-1.6x
// faster (bench/RESULTS.md, 2026-12-06); whether four rows a call (kRows4) beat one depended on
// the thread count and even the phase of a noisy VM (+-6%, 2026-12-06). So the CPU backend
// measures, once per process, SIMD level, weight type and thread count: the first time a step
// holds one-row mul_mats of an undecided type, before the step runs, copies of them (the same
// weights; activations and outputs in scratch, so nothing the step computes is touched) run once
// untimed (faulting the weights' pages in), then every way the type has in ABC..CBA passes, each
// pass over at least twice the last-level cache's bytes where the model has them (weights come
// from DRAM, as in decode), until each way has read kMinBytes. The rows take four a call where
// that measured faster; the in-place way must beat the faster of them by 3%. A type with under
// kSmallBytes (64 MiB) of one-row weights in the step (a small model, cache-resident, where the
// kernel rather than DRAM sets the pace) takes the row kernels unmeasured, four a call where it
// can, so that its runs give the same bits in every process. Rows or in place (different bits)
// is decided once per level and type: a backend with another thread count keeps that choice and
// measures only one row against four, which give the same bits. So every context of the process
// takes one of the ways that give the same bits, and two contexts computing the same step agree.
// A decision reads about seven passes over min(the type's one-row weights, max(256 MiB, 2 x L3))
// once per process: 3.6 GB for an 8B model on a 260 MiB-L3 host. KITE_CPU_DECODE=rows|rows4|tiles
// forces a way (anything else: measure; rows4 is rows where the type has no four-row kernel), for
// runs that must give the same bits on every machine and run, and for benchmarks.
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
// "rows", "rows4" or "tiles", as KITE_CPU_DECODE names them.
const char* one_row_way_name(OneRowWay way);

// A decision this process made, with the rates (weight GB/s) each way measured (0: not measured,
// as the in-place way where another thread count had decided against it).
struct OneRowDecision {
  std::string level;  // the SIMD level's name
  DType type;
  int threads;  // the backend's thread count
  OneRowWay way;
  double rows_gbps, rows4_gbps, tiles_gbps;
};
std::vector<OneRowDecision> one_row_decisions();
// The decisions as lines ("decode q4_K: rows4 at 2 threads (rows 36.9, rows4 37.3, tiles 35.1
// GB/s)"), for `kite bench` (register_choice_reporter).
std::vector<std::string> one_row_report();
// Forgets them (a backend keeps the ways it already took). For tests.
void reset_one_row_decisions();

// One backend's view of the decisions; a backend computes one graph at a time, so no locking
// here (decisions are shared through a mutex-guarded table).
class OneRowTuner {
 public:
  explicit OneRowTuner(int threads) : threads_(threads) {}
  // Runs a node one way and returns the seconds it took (the backend's thread team).
  using TimeNode = std::function<double(Tensor*, OneRowWay)>;
  // Before a step: decides every weight type of its one-row mul_mats that no one has decided.
  void prepare(std::span<Tensor* const> nodes, const TimeNode& time_node);
  // The way for node n (kRows where it has no choice).
  OneRowWay way(const Tensor* n) const;

 private:
  void decide(DType t, std::span<Tensor* const> nodes, const TimeNode& time_node);

  int threads_;
  int level_ = -1;                        // the SimdLevel of the ways below
  std::array<int8_t, kTypeSlots> way_{};  // per type: -1 undecided, else a OneRowWay
};

}  // namespace kite::cpu

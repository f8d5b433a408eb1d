// dmuon/sim/rank_prediction.h — the per-stage timelines of ranks that were not measured,
// predicted from those that were.
//
// Each phase of a stage on a rank is modelled as fixed + rate · work, where work is what
// the stage layout gives the rank (RankStageWork):
//   prepare      the elements of its pieces bound for the wire (momentum and packing);
//   ns           the planner's cost model (plan::CostFn: the profiled table or the FLOP
//                model) of its NS batches;
//   return_pack  none (the engine packs its returns inside ns);
//   apply        the elements returned to it by other owners (unpacking and the update).
// fixed and rate are fitted per phase by least squares (both ≥ 0) over the stages of the
// measured ranks that have such work, so the measured ranks calibrate the cost model (its
// NS rate becomes the measured one) and the per-stage overheads; a phase without work
// takes the mean measured time of such phases (idle).
#pragma once

#include <array>
#include <utility>
#include <vector>

#include "plan/problem.h"
#include "sim/pipeline.h"
#include "sim/stage_layout.h"

namespace dmuon::sim {

/// A rank's work in each phase of each stage: [stage][phase].
using RankWork = std::vector<std::array<double, kNumPhases>>;

/// The work of `rank` in every stage of the engine's `layout` (see the file header).
RankWork rank_work(const StageLayout& layout, int rank, const plan::CostFn& cost);

/// time = fixed_s + rate · work (both ≥ 0) where there is work, idle_s where there is none.
struct PhaseFit {
  double fixed_s = 0.0;
  double rate = 0.0;
  double idle_s = 0.0;
  double at(double work) const { return work > 0 ? fixed_s + rate * work : idle_s; }
};

struct Calibration {
  std::array<PhaseFit, kNumPhases> phases;
};

/// Least-squares fit of each phase over the measured (rank, timeline) pairs.
/// Throws dmuon::Error naming the rank when a timeline's stage count differs from the layout's.
Calibration calibrate(const StageLayout& layout, const std::vector<std::pair<int, RankTimeline>>& measured,
                      const plan::CostFn& cost);

/// Every rank's timeline: the measured ones as given, the others predicted by `calibrate`.
std::vector<RankTimeline> complete_timelines(const StageLayout& layout,
                                             const std::vector<std::pair<int, RankTimeline>>& measured,
                                             const plan::CostFn& cost);

}  // namespace dmuon::sim

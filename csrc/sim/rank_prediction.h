// dmuon/sim/rank_prediction.h — the per-bucket timelines of ranks that were not measured,
// predicted from those that were.
//
// Each phase of a bucket on a rank is modelled as fixed + rate · work, where work is
//   prepare      the rank's local elements of the bucket's active parameters (momentum and
//                packing run over its rows);
//   ns           the planner's cost model (plan::CostFn: the profiled table or the FLOP
//                model) of the batches the rank orthogonalizes in the bucket, one batch per
//                distinct (rows, cols), as the runtime batches them;
//   return_pack  the elements of the results the rank packs for the return (every rank's
//                rows of the matrices it owns);
//   apply        the rank's local elements again (unpacking and the update).
// fixed and rate are fitted per phase by least squares (both ≥ 0) over the buckets of the
// measured ranks that have such work, so the measured ranks calibrate the cost model (its
// NS rate becomes the measured one) and the per-bucket overheads; a phase without work
// takes the mean measured time of such phases (idle).
#pragma once

#include <array>
#include <utility>
#include <vector>

#include "plan/problem.h"
#include "sim/pipeline.h"
#include "sim/stage_layout.h"
#include "sim/step_layout.h"

namespace dmuon::sim {

/// A rank's work in each phase of each bucket: [bucket][phase].
using RankWork = std::vector<std::array<double, kNumPhases>>;

/// The work of `rank` in every bucket of `layout`.
RankWork rank_work(const StepLayout& layout, int rank, const plan::CostFn& cost);

/// The work of `rank` in every stage of the engine's `layout`: prepare and apply its
/// elements (RankStageWork), ns the cost model of its NS batches, return_pack none (the
/// engine packs its returns inside the ns phase).
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
/// Throws dmuon::Error naming the rank when a timeline's bucket count differs from the layout's.
Calibration calibrate(const StepLayout& layout, const std::vector<std::pair<int, RankTimeline>>& measured,
                      const plan::CostFn& cost);

/// Every rank's timeline: the measured ones as given, the others predicted by `calibrate`.
std::vector<RankTimeline> complete_timelines(const StepLayout& layout,
                                             const std::vector<std::pair<int, RankTimeline>>& measured,
                                             const plan::CostFn& cost);

/// The same two over the engine's stages (a timeline has one entry per stage).
Calibration calibrate(const StageLayout& layout, const std::vector<std::pair<int, RankTimeline>>& measured,
                      const plan::CostFn& cost);
std::vector<RankTimeline> complete_timelines(const StageLayout& layout,
                                             const std::vector<std::pair<int, RankTimeline>>& measured,
                                             const plan::CostFn& cost);

}  // namespace dmuon::sim

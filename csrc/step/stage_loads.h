// dmuon/step/stage_loads.h — the NS seconds every rank spends in every stage of a plan, as
// the engine forms its stages: how evenly each stage of a step begun from backward spreads.
//
// The plan CLI (`python -m dmuon plan`) compares plans before and after the stage spreading
// (plan/stage_windows.h) with it: per stage, the most NS seconds on one rank against the
// stage's mean over all ranks (idle ranks count as zero), and where the stage's matrices
// lie in backward order. The stages come from make_stages() (stages.h) on an item table
// with one Shard(0) parameter per planned matrix; an NS batch costs what the planner
// prices it at (ShapeClass::batch_seconds of its units). NOTE: no NS-workspace bound (the
// device's workspace sizes are the ops'; the default 2 GiB bound splits no realistic batch).
#pragma once

#include <cstdint>
#include <vector>

#include "plan/plan.h"
#include "plan/problem.h"

namespace dmuon::step {

/// One stage of a plan.
struct StageLoad {
  int first_matrix = 0;  ///< lowest matrix index in the stage: it leaves once backward is past it
  int last_matrix = 0;   ///< highest matrix index in the stage
  int64_t num_matrices = 0;
  int64_t wire_bytes = 0;
  std::vector<double> rank_seconds;  ///< [rank] NS seconds of its batches in the stage
  double max_seconds = 0.0;          ///< max over ranks
  double mean_seconds = 0.0;         ///< mean over every rank of the world
};

/// The stages of `plan` (its problem `problem`) with stage_bytes of wire per stage and
/// `wire_element_bytes` per element, in backward order when `backward_order`
/// (StageLimits), stage w = backward window w when also `windowed` and the problem
/// uses_backward_windows() (the engine's stages of a step that may begin from backward,
/// windows of backward's hand-over groups `group_of`, plan/stage_windows.h; else stage s =
/// every owner's s-th NS batch, as before the windows). Errors name the argument: a plan
/// of another problem, wire_element_bytes < 1.
std::vector<StageLoad> plan_stage_loads(const plan::Problem& problem, const plan::Plan& plan, int64_t stage_bytes,
                                        int64_t wire_element_bytes, bool backward_order, bool windowed,
                                        const std::vector<int>& group_of = {});

}  // namespace dmuon::step

// dmuon/plan/stage_windows.h — the "layers" a step begun from backward spreads over owners:
// windows of consecutive matrices in backward order, each about one pipeline stage.
//
// When the sharded step begins inside backward (step::EngineOptions::backward_order), the
// engine's stage s holds every owner's s-th NS batch, each owner's batches taken from its
// highest matrix index down (matrices follow parameter registration, so backward finishes
// the highest first). A stage leaves when backward has finished all its matrices. The
// planner's class counts say nothing about WHICH matrices an owner holds, and its plans
// give each rank one contiguous run of every class (rank 0 the first layers, the last rank
// the last ones): every owner's first batch then comes from another depth of the model,
// stage 0 waits for the lowest of them, and the NS of the layers backward finishes first
// sits on one or two ranks.
//
// The fix keeps the plan's loads and changes only which same-class matrices each owner
// holds (spread_layers(), layer_spread.h): matrices in backward order are cut into windows,
// window w of about one stage, and each window is spread over the owners. Once every
// owner holds about one batch of window w, stage s is window s: it leaves when backward
// is through that window, and its NS runs on every rank at once.
//
// How stages map to windows: walking from the last matrix down, a window closes once it
// holds at least world_size matrices and at least stage_bytes wire bytes (every rank's
// share of a stage is stage_bytes / world_size, at least one matrix: a stage holds
// max(world_size matrices, stage_bytes) when owners are busy). Window ids count from the
// last matrix (window 0: the ones backward finishes first). The layer of a matrix is thus
// its position, not its name: nothing is parsed, and every rank computes the same.
//
// Typical use (the engine's plan, csrc/step/engine_plan.cpp):
//   Plan plan = solve(problem, solver);
//   spread_backward_stages(problem, stage_bytes, plan);  // same loads, stages spread
#pragma once

#include <cstdint>
#include <vector>

#include "plan/plan.h"
#include "plan/problem.h"

namespace dmuon::plan {

/// Window id of every matrix of `problem` (see the file header); stage_bytes ≤ 0: windows
/// of world_size matrices. Deterministic; the same on every rank.
std::vector<int> backward_stage_windows(const Problem& problem, int64_t stage_bytes);

/// spread_layers(problem, backward_stage_windows(problem, stage_bytes), plan): the plan's
/// per-rank class counts, batches, loads and makespan bit for bit, each window's matrices
/// on different owners. A plan of a problem with homes is returned unchanged (spread_layers'
/// contract), as is a plan of one rank.
void spread_backward_stages(const Problem& problem, int64_t stage_bytes, Plan& plan);

}  // namespace dmuon::plan

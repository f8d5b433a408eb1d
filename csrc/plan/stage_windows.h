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
// each window is spread over the owners, and the engine makes stage w of window w's
// matrices (StageLimits::window_of): stage w leaves once backward is through window w, and
// its NS runs on every rank at once.
//
// How stages map to windows: walking from the last matrix down, a window closes once its
// wire bytes reach both stage_bytes and world_size times its largest matrix. NOTE: the
// second bound is what lets a window split evenly: a Qwen2.5-1.5B window of only 8
// matrices (3 MLP, 5 attention) at D = 8 leaves 3 ranks with 27.5 MB and 5 with at most
// 4.7 MB whatever the owners; at ≥ D × 27.5 MB (about two layers) every rank can get
// about the mean. Window ids count from the last matrix (window 0: the ones backward
// finishes first). The layer of a matrix is thus its position, not its name: nothing is
// parsed, and every rank computes the same. A stage's wire bytes stay below
// max(stage_bytes, D × largest) + one matrix, as a stage of one batch per owner was.
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

/// Window id of every matrix of `problem` (see the file header); stage_bytes ≤ 0: bounded
/// by world_size × the largest matrix alone. Deterministic; the same on every rank.
std::vector<int> backward_stage_windows(const Problem& problem, int64_t stage_bytes);

/// Whether a step begun from backward spreads this problem's plan and makes its stages of
/// the windows: several ranks and no homes. NOTE: with homes (MoE experts whole on a rank)
/// the plan is kept, and a window of consecutive experts would sit on one or two homes;
/// the stages stay every owner's s-th batch, whose experts (every rank homes some of every
/// stack) come from the same layer.
bool uses_backward_windows(const Problem& problem);

/// spread_layers(problem, backward_stage_windows(problem, stage_bytes), plan): the plan's
/// per-rank class counts, batches, loads and makespan bit for bit, each window's matrices
/// on different owners. Unchanged where !uses_backward_windows(problem) (spread_layers keeps plans
/// with homes as they are).
void spread_backward_stages(const Problem& problem, int64_t stage_bytes, Plan& plan);

}  // namespace dmuon::plan

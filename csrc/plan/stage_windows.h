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
// How stages map to windows: backward hands the matrices over in groups (an FSDP2 unit's
// parameters, a DDP bucket; `group_of`, in the order backward hands them over), and a stage
// cannot leave before its last group is handed over, so a window is a run of whole groups.
// A window closes at the end of a group once its wire bytes reach half the mean group's
// and it holds at least one matrix per rank (half the matrices, where the model has fewer
// than two per rank: two stages, so that one leaves inside backward).
// NOTE: a stage costs a forward and a return all_to_all whatever it carries, so a group
// far lighter than the others (a root with one small matrix, a bias-sized layer) is merged
// with the next; the equal blocks of a transformer are a window each where they hold a
// matrix per rank.
// NOTE: why a matrix per rank: an all_to_all takes as long as its busiest rank, and a
// stage's owner receives (D−1)/D of each of its matrices. A window of fewer matrices than
// ranks loads a few owners with whole matrices while the other links idle, and the stages'
// exchanges add up: on the fake rank of D = 64 (Qwen2.5-1.5B, one H100), a window per
// block (7 matrices) made 28 stages whose returns, issued after the agreement, took 14.6 ms
// of projected link time, against 2.5 ms for the whole exchange with the step after
// backward (4 stages), and left 23.4 ms after backward against 6.2 ms.
// The earlier rule, windows of at least stage_bytes and of world × the largest matrix,
// made one window of everything on an 8-block model at 64 MiB (0 of 24 NS matrices inside
// backward) and two of Qwen2.5-1.5B at D = 64.
// Matrices of no known group (−1: no gradient in the backward observed) are handed over by no hook: they join the window left open, or a last
// one of their own. With no group known at all, every matrix is a group of its own, the
// last first (parameter registration order reversed, backward's order for a sequential
// model). Window ids count from the first handed over (window 0); the layer of a matrix is
// thus its window, not its name: nothing is parsed, and every rank computes the same from the same groups.
//
// Typical use (the engine's plan, csrc/step/engine_plan.cpp):
//   Plan plan = solve(problem, solver);
//   spread_backward_stages(problem, group_of, plan);  // same loads, stages spread
#pragma once

#include <cstdint>
#include <vector>

#include "plan/plan.h"
#include "plan/problem.h"

namespace dmuon::plan {

/// Window id of every matrix of `problem` (see the file header) from `group_of[k]`, the
/// position of matrix k's group in backward's hand-over order (0: first), −1 for none;
/// empty or all −1: one group per matrix, the last matrix first. Deterministic; the same on
/// every rank. Errors name the argument: group_of of another size or below −1.
std::vector<int> backward_stage_windows(const Problem& problem, const std::vector<int>& group_of);

/// The fewest matrices a window closes with: one per rank, or half of `num_matrices` where
/// there are fewer than two per rank (so that two windows remain); at least 1.
int64_t matrices_per_backward_window(int world_size, int64_t num_matrices);

/// Whether a step begun from backward spreads this problem's plan and makes its stages of
/// the windows: several ranks and no homes. NOTE: with homes (MoE experts whole on a rank)
/// the plan is kept, and a window of consecutive experts would sit on one or two homes;
/// the stages stay every owner's s-th batch, whose experts (every rank homes some of every
/// stack) come from the same layer.
bool uses_backward_windows(const Problem& problem);

/// spread_layers(problem, backward_stage_windows(problem, group_of), plan): the plan's
/// per-rank class counts, batches, loads and makespan bit for bit, each window's matrices
/// on different owners. Unchanged where !uses_backward_windows(problem) (spread_layers keeps plans
/// with homes as they are).
void spread_backward_stages(const Problem& problem, const std::vector<int>& group_of, Plan& plan);

}  // namespace dmuon::plan

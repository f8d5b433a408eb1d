// Backward windows and their spreading (plan/stage_windows.h) and the stages they make
// (step/stage_loads.h): the window rule by hand, loads kept bit for bit, determinism and
// idempotence, the round trip, homes left alone, and stages that are exactly the windows
// and leave earlier than the planner's contiguous runs.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "common/check.h"
#include "plan/layer_spread.h"
#include "plan/planner.h"
#include "plan/stage_windows.h"
#include "plan_fixtures.h"
#include "step/stage_loads.h"

namespace dmuon::plan {
namespace {

// A decoder's matrices in parameter order (layer by layer: q, k, v, o, gate, up, down).
Problem decoder(int num_layers, int64_t h, int64_t kv, int64_t i, int world_size) {
  return decoder_problem(num_layers, h, kv, i, world_size, false);
}

// Each layer a group of backward's hand-over, the last layer first (fully_shard per layer).
std::vector<int> layer_groups(int num_layers) {
  std::vector<int> group_of;
  for (int l = 0; l < num_layers; ++l) group_of.insert(group_of.end(), 7, num_layers - 1 - l);
  return group_of;
}

// Hand-checked, wire bytes 2·rows·cols: in hand-over order, a window of whole groups closes
// once it holds half the mean group's bytes and a matrix per rank.
TEST(PlanStageWindows, WindowsAreRunsOfGroupsOfAtLeastHalfTheMeanGroup) {
  // Bytes 2048 (a), 512 (b), 512 (c), 2048 (d), 512 (e).
  const std::vector<MatrixSpec> matrices = {{"a", 32, 32}, {"b", 16, 16}, {"c", 16, 16}, {"d", 32, 32}, {"e", 16, 16}};
  ProblemOptions options;
  options.world_size = 2;
  const Problem two = build_problem(matrices, options, AnalyticCostModel::gpu_default().as_cost_fn());
  // Groups {e}, {d}, {b, c}, {a}, half the mean 704: e (512) stays open, d closes window
  // 0; b + c (1024) window 1; a window 2.
  EXPECT_EQ(backward_stage_windows(two, {3, 2, 2, 1, 0}), (std::vector<int>{2, 1, 1, 0, 0}));
  // A group is never cut: {d, e} then {a, b, c} in one group each.
  EXPECT_EQ(backward_stage_windows(two, {1, 1, 1, 0, 0}), (std::vector<int>{1, 1, 1, 0, 0}));
  EXPECT_EQ(backward_stage_windows(two, {0, 0, 0, 0, 0}), (std::vector<int>{0, 0, 0, 0, 0}));
  // No group known: one per matrix, the last first (half the mean 563: e + d, c + b, a).
  EXPECT_EQ(backward_stage_windows(two, {}), (std::vector<int>{2, 1, 1, 0, 0}));
  EXPECT_EQ(backward_stage_windows(two, {-1, -1, -1, -1, -1}), (std::vector<int>{2, 1, 1, 0, 0}));
  // A matrix of no group joins the window left open, or one of its own after the last.
  EXPECT_EQ(backward_stage_windows(two, {-1, 1, 1, 0, 0}), (std::vector<int>{2, 1, 1, 0, 0}));
  EXPECT_EQ(backward_stage_windows(two, {-1, 0, 0, 0, 0}), (std::vector<int>{1, 0, 0, 0, 0}));
  // Same-size matrices: a window holds a matrix per rank (world 3: threes), or half of them
  // where there are fewer than two per rank (world 8: halves).
  const std::vector<MatrixSpec> same(6, MatrixSpec{"w", 16, 16});
  options.world_size = 3;
  const Problem six = build_problem(same, options, AnalyticCostModel::gpu_default().as_cost_fn());
  EXPECT_EQ(backward_stage_windows(six, {}), (std::vector<int>{1, 1, 1, 0, 0, 0}));
  // Groups of two at world 3: a window closes after the group that brings it to three.
  EXPECT_EQ(backward_stage_windows(six, {2, 2, 1, 1, 0, 0}), (std::vector<int>{1, 1, 0, 0, 0, 0}));
  EXPECT_EQ(backward_stage_windows(six, {2, 2, 2, 1, 0, 0}), (std::vector<int>{1, 1, 1, 0, 0, 0}));
  options.world_size = 8;
  const Problem six_of_eight = build_problem(same, options, AnalyticCostModel::gpu_default().as_cost_fn());
  EXPECT_EQ(backward_stage_windows(six_of_eight, {}), (std::vector<int>{1, 1, 1, 0, 0, 0}));
  // Errors name the argument.
  EXPECT_THROW(backward_stage_windows(two, {0, 0}), dmuon::Error);
  EXPECT_THROW(backward_stage_windows(two, {0, 0, -2, 0, 0}), dmuon::Error);
}

TEST(PlanStageWindows, SpreadKeepsLoadsDeterministicIdempotentAndRoundTrips) {
  for (int D : {2, 3, 8})
    for (SolverKind solver : {SolverKind::kRoundRobin, SolverKind::kLpt}) {
      SCOPED_TRACE("D " + std::to_string(D) + " " + solver_name(solver));
      const Problem problem = decoder(12, 512, 128, 1536, D);
      const Plan before = solve(problem, solver);
      Plan first = before, second = before;
      spread_backward_stages(problem, layer_groups(12), first);
      spread_backward_stages(problem, layer_groups(12), second);
      expect_same_loads(problem, before, first);
      EXPECT_EQ(first.serialize(), second.serialize());
      Plan again = first;
      spread_backward_stages(problem, layer_groups(12), again);
      EXPECT_EQ(again.serialize(), first.serialize());
      // Another rank rebuilds exactly this plan from the text (the engine's broadcast).
      const Plan received = deserialize_plan(decoder(12, 512, 128, 1536, D), first.serialize());
      EXPECT_EQ(received.owner, first.owner);
      const std::vector<int> windows = backward_stage_windows(problem, layer_groups(12));
      EXPECT_LT(layer_spread_stats(problem, windows, first).max_bytes_per_owner,
                layer_spread_stats(problem, windows, before).max_bytes_per_owner);
    }
}

TEST(PlanStageWindows, ProblemsWithHomesOrOneRankAreLeftAlone) {
  std::vector<MatrixSpec> matrices;
  for (int e = 0; e < 8; ++e) matrices.push_back({"experts." + std::to_string(e), 64, 32, 1, 0, 0, e / 4});
  ProblemOptions options;
  options.world_size = 2;
  const Problem homed = build_problem(matrices, options, AnalyticCostModel::gpu_default().as_cost_fn());
  Plan plan = solve(homed, SolverKind::kLpt);
  const std::string text = plan.serialize();
  spread_backward_stages(homed, {}, plan);
  EXPECT_EQ(plan.serialize(), text);
  EXPECT_FALSE(uses_backward_windows(homed));
  // Its stages stay every owner's s-th batch.
  const auto windowed = step::plan_stage_loads(homed, plan, 0, 2, true, true);
  const auto unwindowed = step::plan_stage_loads(homed, plan, 0, 2, true, false);
  ASSERT_EQ(windowed.size(), unwindowed.size());
  for (size_t s = 0; s < windowed.size(); ++s) EXPECT_EQ(windowed[s].rank_seconds, unwindowed[s].rank_seconds);
  const Problem one = decoder(3, 64, 16, 128, 1);
  Plan single = solve(one, SolverKind::kLpt);
  const std::string single_text = single.serialize();
  spread_backward_stages(one, {}, single);
  EXPECT_EQ(single.serialize(), single_text);
  EXPECT_FALSE(uses_backward_windows(one));
  EXPECT_TRUE(uses_backward_windows(decoder(3, 64, 16, 128, 2)));
}

// The engine's stages of a spread plan are the windows, in backward order, and the first
// leaves after fewer matrices of backward than the unspread plan's first stage.
TEST(PlanStageWindows, StagesAreTheWindowsAndLeaveEarlier) {
  const int64_t stage_bytes = int64_t{4} << 20;
  for (int D : {4, 8}) {
    SCOPED_TRACE("D " + std::to_string(D));
    const Problem problem = decoder(16, 512, 128, 1536, D);
    const int n = static_cast<int>(problem.matrices.size());
    const Plan before = solve(problem, SolverKind::kLpt);
    Plan after = before;
    spread_backward_stages(problem, layer_groups(16), after);
    const std::vector<int> windows = backward_stage_windows(problem, layer_groups(16));
    // A window per layer (7 matrices) at D = 4; per two layers at D = 8 (a matrix per rank).
    ASSERT_EQ(windows.front(), D == 4 ? 15 : 7);
    const auto stages = step::plan_stage_loads(problem, after, stage_bytes, 2, true, true, layer_groups(16));
    ASSERT_EQ(static_cast<int>(stages.size()), windows.front() + 1);
    int64_t matrices = 0;
    for (size_t w = 0; w < stages.size(); ++w) {
      const step::StageLoad& stage = stages[w];
      EXPECT_EQ(windows[static_cast<size_t>(stage.first_matrix)], static_cast<int>(w));
      EXPECT_EQ(windows[static_cast<size_t>(stage.last_matrix)], static_cast<int>(w));
      EXPECT_EQ(stage.num_matrices, std::count(windows.begin(), windows.end(), static_cast<int>(w)));
      EXPECT_GE(stage.max_seconds, stage.mean_seconds * (1 - 1e-12));
      matrices += stage.num_matrices;
    }
    EXPECT_EQ(matrices, n);
    // Without windows (stage s: every owner's s-th batch) the unspread plan's first stage
    // waits for a matrix further down.
    const auto old_stages = step::plan_stage_loads(problem, before, stage_bytes, 2, true, false);
    EXPECT_GT(stages.front().first_matrix, old_stages.front().first_matrix);
  }
}

}  // namespace
}  // namespace dmuon::plan

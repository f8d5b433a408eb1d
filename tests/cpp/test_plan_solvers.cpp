// Owner planner solvers: MILP vs brute force, never worse than LPT, time limit,
// determinism, memory caps, the lower bound, serialization and the plan cache.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <limits>
#include <random>
#include <string>

#include "common/check.h"
#include "plan/planner.h"
#include "plan_fixtures.h"

namespace dmuon::plan {
namespace {

// A random instance: a few shapes, 3-D stacks included, costs with launch overhead.
Problem random_problem(uint32_t seed, int num_matrices, int world_size, int64_t memory_cap = 0) {
  std::mt19937 rng(seed);
  const int64_t dims[] = {32, 64, 96, 128, 256};
  std::uniform_int_distribution<int> pick(0, 4);
  std::uniform_int_distribution<int> num_shapes_dist(1, 3);
  const int num_shapes = num_shapes_dist(rng);
  std::vector<MatrixSpec> shapes;
  for (int s = 0; s < num_shapes; ++s)
    shapes.push_back({"", dims[pick(rng)], dims[pick(rng)], s == 2 ? 2 : 1});
  std::uniform_int_distribution<int> which(0, num_shapes - 1);
  std::vector<MatrixSpec> matrices;
  for (int i = 0; i < num_matrices; ++i) {
    MatrixSpec m = shapes[static_cast<size_t>(which(rng))];
    m.name = "m" + std::to_string(i);
    matrices.push_back(m);
  }
  ProblemOptions options;
  options.world_size = world_size;
  options.bandwidth_bytes_per_s = 2e9;
  options.memory_cap_bytes = memory_cap;
  AnalyticCostModel model;
  model.flops_per_second = 1e12;
  model.launch_overhead_s = 2e-5;
  return build_problem(matrices, options, model.as_cost_fn());
}

// Qwen2.5-0.5B's Muon matrices (24 layers of q, k, v, o, gate, up, down), GPU cost model:
// LPT is 2.7% above the lower bound and CBC cannot close the gap quickly.
Problem qwen_like_problem(int world_size) { return decoder_problem(24, 896, 128, 4864, world_size, false); }

// Exhaustive optimum: every unit on every rank (D^N), each rank's units split optimally.
double brute_force_makespan(const Problem& p) {
  const int D = p.world_size();
  std::vector<int> shape_of;
  for (size_t s = 0; s < p.shapes.size(); ++s)
    for (size_t i = 0; i < p.shapes[s].matrix_idx.size(); ++i) shape_of.push_back(static_cast<int>(s));
  std::vector<BatchSplitter> splitters;
  for (size_t s = 0; s < p.shapes.size(); ++s) splitters.emplace_back(p, static_cast<int>(s));
  const int n = static_cast<int>(shape_of.size());
  std::vector<int> rank_of(static_cast<size_t>(n), 0);
  double best = std::numeric_limits<double>::infinity();
  while (true) {
    std::vector<std::vector<int64_t>> counts(static_cast<size_t>(D), std::vector<int64_t>(p.shapes.size(), 0));
    std::vector<int64_t> memory(static_cast<size_t>(D), 0);
    for (int u = 0; u < n; ++u) {
      ++counts[static_cast<size_t>(rank_of[static_cast<size_t>(u)])][static_cast<size_t>(shape_of[static_cast<size_t>(u)])];
      memory[static_cast<size_t>(rank_of[static_cast<size_t>(u)])] += p.shapes[static_cast<size_t>(shape_of[static_cast<size_t>(u)])].memory_bytes;
    }
    double makespan = 0.0;
    bool fits = true;
    for (int r = 0; r < D; ++r) {
      double load = 0.0;
      for (size_t s = 0; s < p.shapes.size(); ++s) load += splitters[s].cost(counts[static_cast<size_t>(r)][s]);
      makespan = std::max(makespan, load);
      fits = fits && (p.options.memory_cap_bytes == 0 || memory[static_cast<size_t>(r)] <= p.options.memory_cap_bytes);
    }
    if (fits) best = std::min(best, makespan);
    int u = 0;
    while (u < n && ++rank_of[static_cast<size_t>(u)] == D) rank_of[static_cast<size_t>(u++)] = 0;
    if (u == n) break;
  }
  return best;
}

TEST(PlanSolvers, MilpEqualsBruteForceOnSmallInstances) {
  if (!milp_available()) GTEST_SKIP() << "built without COIN-OR CBC";
  int num_lpt_suboptimal = 0;
  for (uint32_t seed = 1; seed <= 12; ++seed) {
    const Problem p = random_problem(seed, 7, 3);
    const double optimum = brute_force_makespan(p);
    MilpOptions exact;
    exact.relative_gap = 0.0;
    const Plan milp = solve(p, SolverKind::kMilp, exact);
    EXPECT_NEAR(milp.makespan, optimum, 1e-9 * optimum) << "seed " << seed << " status " << milp.status;
    EXPECT_TRUE(milp.deterministic);
    num_lpt_suboptimal += solve(p, SolverKind::kLpt).makespan > optimum * (1 + 1e-9) ? 1 : 0;
  }
  // NOTE: the instances must be hard enough that LPT misses the optimum on some.
  EXPECT_GT(num_lpt_suboptimal, 0);
}

TEST(PlanSolvers, NeverWorseThanLptAndLowerBoundHolds) {
  for (uint32_t seed = 100; seed < 112; ++seed) {
    const Problem p = random_problem(seed, 40, 1 + static_cast<int>(seed % 7));
    const Plan rr = solve(p, SolverKind::kRoundRobin);
    const Plan lpt = solve(p, SolverKind::kLpt);
    MilpOptions quick;
    quick.time_limit_s = 0.25;
    const Plan milp = solve(p, SolverKind::kMilp, quick);
    EXPECT_LE(milp.makespan, lpt.makespan * (1 + 1e-12)) << "seed " << seed;
    for (const Plan* plan : {&rr, &lpt, &milp}) {
      EXPECT_GE(plan->makespan, plan->lower_bound * (1 - 1e-12)) << plan->solver << " seed " << seed;
      EXPECT_LE(plan->solver_bound, plan->makespan * (1 + 1e-9));
    }
  }
  // On exhaustively solvable instances the bound is below the true optimum.
  for (uint32_t seed = 200; seed < 220; ++seed) {
    const Problem p = random_problem(seed, 7, 2 + static_cast<int>(seed % 2));
    EXPECT_LE(lower_bound(p), brute_force_makespan(p) * (1 + 1e-12)) << "seed " << seed;
  }
}

TEST(PlanSolvers, PigeonholeBoundIsTightForDPlusOneEqualJobs) {
  // Five equal matrices on four ranks: some rank runs two, as one batch of 2.
  std::vector<MatrixSpec> matrices(5, MatrixSpec{"", 128, 512});
  ProblemOptions options;
  options.world_size = 4;
  const Problem p = build_problem(matrices, options, [](int64_t, int64_t, int64_t n) { return 1.0 + n; });
  const double pair = p.batch_load(0, 2);
  EXPECT_DOUBLE_EQ(lower_bound(p), pair);
  EXPECT_DOUBLE_EQ(solve(p, SolverKind::kLpt).makespan, pair);
  EXPECT_EQ(solve(p, SolverKind::kMilp).status, milp_available() ? "lpt_optimal" : "cbc_unavailable");
}

TEST(PlanSolvers, EveryMatrixOwnedOnceAndBatchesOrdered) {
  const Problem p = random_problem(7, 30, 4);
  for (SolverKind kind : {SolverKind::kRoundRobin, SolverKind::kLpt, SolverKind::kMilp}) {
    const Plan plan = solve(p, kind);
    std::vector<int> seen(p.matrices.size(), 0);
    for (size_t r = 0; r < plan.ranks.size(); ++r) {
      const auto& batches = plan.ranks[r].batches;
      for (size_t b = 0; b < batches.size(); ++b) {
        for (int idx : batches[b].matrix_idx) {
          ++seen[static_cast<size_t>(idx)];
          EXPECT_EQ(plan.owner[static_cast<size_t>(idx)], static_cast<int>(r));
        }
        if (b > 0) {
          EXPECT_GE(batches[b - 1].compute_seconds, batches[b].compute_seconds);
        }
      }
    }
    EXPECT_EQ(seen, std::vector<int>(p.matrices.size(), 1)) << solver_name(kind);
  }
}

TEST(PlanSolvers, RoundRobinDealsInInputOrder) {
  // Rank r gets as many matrices of each shape as matrices i ≡ r (mod D) have that shape
  // (identical matrices are interchangeable, so the plan may swap which ones).
  const Problem p = random_problem(3, 10, 4);
  const Plan plan = solve(p, SolverKind::kRoundRobin);
  for (size_t s = 0; s < p.shapes.size(); ++s) {
    std::vector<int> dealt(4, 0), planned(4, 0);
    for (int idx : p.shapes[s].matrix_idx) {
      ++dealt[static_cast<size_t>(idx % 4)];
      ++planned[static_cast<size_t>(plan.owner[static_cast<size_t>(idx)])];
    }
    EXPECT_EQ(dealt, planned) << "shape " << s;
  }
}

TEST(PlanSolvers, RespectsTheTimeLimit) {
  if (!milp_available()) GTEST_SKIP() << "built without COIN-OR CBC";
  const Problem p = qwen_like_problem(8);
  MilpOptions options;
  options.time_limit_s = 0.2;
  options.max_nodes = 1000000000;
  const Plan milp = solve(p, SolverKind::kMilp, options);
  // NOTE: the status, not the wall clock (a loaded machine stretches any time bound): the
  // search stopped at its limit, not at its node cap or at an optimum, and returned a plan
  // no worse than its LPT start.
  EXPECT_EQ(milp.status, "time_limit");
  EXPECT_FALSE(milp.deterministic);
  EXPECT_LE(milp.makespan, solve(p, SolverKind::kLpt).makespan * (1 + 1e-12));
}

TEST(PlanSolvers, DeterministicAcrossRuns) {
  for (int world_size : {8, 12}) {
    const Problem p = qwen_like_problem(world_size);
    MilpOptions options;
    options.time_limit_s = 30;  // the node cap, not the clock, ends the search
    options.max_nodes = 30;
    const Plan a = solve(p, SolverKind::kMilp, options);
    const Plan b = solve(p, SolverKind::kMilp, options);
    ASSERT_TRUE(a.deterministic) << a.status;
    EXPECT_EQ(a.status, milp_available() ? "node_limit" : "cbc_unavailable");
    EXPECT_EQ(a.owner, b.owner);
    EXPECT_EQ(a.serialize().substr(0, a.serialize().find("solve_seconds")),
              b.serialize().substr(0, b.serialize().find("solve_seconds")));
    EXPECT_EQ(solve(p, SolverKind::kLpt).owner, solve(p, SolverKind::kLpt).owner);
  }
}

TEST(PlanSolvers, MemoryCapsHonoured) {
  // Cap = three of the largest units: every solver must spread them out.
  const Problem unconstrained = random_problem(31, 24, 6);
  int64_t largest = 0;
  for (const ShapeClass& s : unconstrained.shapes) largest = std::max(largest, s.memory_bytes);
  const Problem p = random_problem(31, 24, 6, 5 * largest);
  for (SolverKind kind : {SolverKind::kRoundRobin, SolverKind::kLpt, SolverKind::kMilp}) {
    const Plan plan = solve(p, kind);
    for (const RankPlan& rank : plan.ranks) EXPECT_LE(rank.memory_bytes, 5 * largest) << solver_name(kind);
  }
  // Brute force agrees with the MILP under a cap that binds.
  if (!milp_available()) return;
  const Problem small_free = random_problem(41, 6, 3);
  int64_t total = 0;
  for (const MatrixSpec& m : small_free.matrices) total += m.memory_bytes;
  const Problem small = random_problem(41, 6, 3, total / 2);
  MilpOptions exact;
  exact.relative_gap = 0.0;
  EXPECT_NEAR(solve(small, SolverKind::kMilp, exact).makespan, brute_force_makespan(small), 1e-9);
  // Caps too tight for all matrices together: a clear error.
  const Problem tight = random_problem(41, 6, 1, total / 2);
  EXPECT_THROW(solve(tight, SolverKind::kLpt), Error);
}

TEST(PlanSolvers, MoreRanksThanMatricesLeavesRanksEmpty) {
  const Problem p = random_problem(5, 3, 8);
  for (SolverKind kind : {SolverKind::kRoundRobin, SolverKind::kLpt, SolverKind::kMilp}) {
    const Plan plan = solve(p, kind);
    int empty = 0;
    for (const RankPlan& rank : plan.ranks) empty += rank.batches.empty() ? 1 : 0;
    EXPECT_GE(empty, 5) << solver_name(kind);
    EXPECT_NEAR(plan.makespan, plan.lower_bound, 1e-12) << solver_name(kind);
  }
}

TEST(PlanSolvers, SerializeRoundTripAndHashCheck) {
  const Problem p = random_problem(9, 20, 3);
  const Plan plan = solve(p, SolverKind::kLpt);
  const Plan back = deserialize_plan(p, plan.serialize());
  EXPECT_EQ(back.owner, plan.owner);
  EXPECT_DOUBLE_EQ(back.makespan, plan.makespan);
  const Problem other = random_problem(9, 20, 4);
  EXPECT_THROW(deserialize_plan(other, plan.serialize()), Error);
  EXPECT_THROW(deserialize_plan(p, "dmuon-plan v1\nsolver lpt\n"), Error);
}

TEST(PlanSolvers, CacheHitsOnSameInputsInMemoryAndOnDisk) {
  const std::string dir = ::testing::TempDir();
  const Problem p = random_problem(13, 20, 3);
  PlanCache cache(dir);
  const Plan first = cache.get_or_solve(p, SolverKind::kMilp, {});
  const Plan second = cache.get_or_solve(p, SolverKind::kMilp, {});
  EXPECT_EQ(cache.num_misses(), 1u);
  EXPECT_EQ(cache.num_hits(), 1u);
  EXPECT_EQ(first.owner, second.owner);
  PlanCache from_disk(dir);
  EXPECT_EQ(from_disk.get_or_solve(p, SolverKind::kMilp, {}).owner, first.owner);
  EXPECT_EQ(from_disk.num_hits(), 1u);
  std::remove((dir + "/plan-" + std::to_string(plan_key(p, SolverKind::kMilp, {})) + ".txt").c_str());
}

}  // namespace
}  // namespace dmuon::plan

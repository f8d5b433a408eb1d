// Owner planner with homes: a matrix already whole on one rank receives nothing
// when owned there. Kept at home when that balances, moved when it would overload; the
// problem hash covers homes; every solver's plan accounts receive bytes per owner.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>

#include "common/check.h"
#include "plan/planner.h"

namespace dmuon::plan {
namespace {

// Units' cost: 1 + n seconds per launch of n (launches dominate), or as given.
CostFn linear_cost() {
  return [](int64_t, int64_t, int64_t n) { return 1e-3 * (1.0 + static_cast<double>(n)); };
}

// `num` 64x128 experts, expert e at home on homes[e] (−1: none).
Problem experts(const std::vector<int>& homes, int world, double bandwidth) {
  std::vector<MatrixSpec> matrices;
  for (size_t e = 0; e < homes.size(); ++e) {
    MatrixSpec m{"experts." + std::to_string(e), 64, 128};
    m.home = homes[e];
    matrices.push_back(m);
  }
  ProblemOptions options;
  options.world_size = world;
  options.bandwidth_bytes_per_s = bandwidth;
  return build_problem(matrices, options, linear_cost());
}

// Receive bytes every rank should report: (D−1)/D of each owned matrix not at home.
void expect_recv_consistent(const Problem& p, const Plan& plan) {
  const int D = p.world_size();
  std::vector<int64_t> expected(static_cast<size_t>(D), 0);
  for (size_t i = 0; i < p.matrices.size(); ++i)
    if (plan.owner[i] != p.matrices[i].home)
      expected[static_cast<size_t>(plan.owner[i])] +=
          std::llround(static_cast<double>(p.matrices[i].wire_bytes) * (D - 1) / D);
  for (int r = 0; r < D; ++r) EXPECT_EQ(plan.ranks[static_cast<size_t>(r)].recv_bytes, expected[static_cast<size_t>(r)]);
}

TEST(PlanHomes, KeptAtHomeWhenBalanced) {
  // torch.chunk of 8 experts over 4 ranks: two per rank; nothing needs to move.
  const std::vector<int> homes = {0, 0, 1, 1, 2, 2, 3, 3};
  const Problem p = experts(homes, 4, 50e9);
  for (SolverKind kind : {SolverKind::kLpt, SolverKind::kMilp}) {
    const Plan plan = solve(p, kind);
    EXPECT_EQ(plan.owner, homes) << solver_name(kind);
    for (const RankPlan& rank : plan.ranks) {
      EXPECT_EQ(rank.recv_bytes, 0) << solver_name(kind);
      EXPECT_DOUBLE_EQ(rank.load_seconds, 3e-3) << solver_name(kind);  // one batch of 2
    }
    EXPECT_NEAR(plan.makespan, plan.lower_bound, 1e-12) << solver_name(kind);
  }
}

TEST(PlanHomes, MovedWhenHomeWouldOverload) {
  // Eight experts all at home on rank 0 (an EP group of one): keeping them costs 9 ms there;
  // at 50 GB/s moving one costs ~0.25 µs, so the solvers spread them, two per rank.
  const Problem p = experts(std::vector<int>(8, 0), 4, 50e9);
  for (SolverKind kind : {SolverKind::kLpt, SolverKind::kMilp}) {
    const Plan plan = solve(p, kind);
    std::vector<int> per_rank(4, 0);
    for (int o : plan.owner) ++per_rank[static_cast<size_t>(o)];
    EXPECT_EQ(per_rank, (std::vector<int>{2, 2, 2, 2})) << solver_name(kind);
    EXPECT_EQ(plan.ranks[0].recv_bytes, 0) << solver_name(kind);  // rank 0 keeps two of its own
    EXPECT_LT(plan.makespan, 3.1e-3) << solver_name(kind);
    expect_recv_consistent(p, plan);
  }
  // A link so slow that moving costs more than the whole stack at home: nothing moves.
  const Problem slow = experts(std::vector<int>(8, 0), 4, 1e3);
  for (SolverKind kind : {SolverKind::kLpt, SolverKind::kMilp})
    EXPECT_EQ(solve(slow, kind).owner, std::vector<int>(8, 0)) << solver_name(kind);
}

TEST(PlanHomes, HashCoversHomes) {
  const Problem none = experts(std::vector<int>(4, -1), 2, 50e9);
  const Problem home = experts({0, 0, 1, 1}, 2, 50e9);
  const Problem other = experts({0, 1, 0, 1}, 2, 50e9);
  EXPECT_NE(none.hash, home.hash);
  EXPECT_NE(home.hash, other.hash);
  // A plan made for one set of homes is rejected for another.
  const std::string text = solve(home, SolverKind::kLpt).serialize();
  EXPECT_NO_THROW(deserialize_plan(home, text));
  EXPECT_THROW(deserialize_plan(other, text), Error);
  // Homes must be ranks.
  EXPECT_THROW(experts({0, 2}, 2, 50e9), Error);
  EXPECT_THROW(experts({-2, 0}, 2, 50e9), Error);
}

TEST(PlanHomes, MilpNoWorseThanLptAndBoundHoldsOnRandomHomes) {
  // Two shapes, random homes (some none), a bandwidth that makes moving matter.
  for (uint32_t seed = 1; seed <= 12; ++seed) {
    std::mt19937 rng(seed);
    const int D = 2 + static_cast<int>(seed % 3);
    std::uniform_int_distribution<int> home(-1, D - 1), shape(0, 1), count(4, 14);
    std::vector<MatrixSpec> matrices;
    const int n = count(rng);
    for (int i = 0; i < n; ++i) {
      MatrixSpec m{"m" + std::to_string(i), shape(rng) == 0 ? 64 : 96, 128};
      m.home = home(rng);
      matrices.push_back(m);
    }
    ProblemOptions options;
    options.world_size = D;
    options.bandwidth_bytes_per_s = 2e7;  // moving a 64x128 unit costs ~0.4 ms, a launch 1 ms
    const Problem p = build_problem(matrices, options, linear_cost());
    const Plan lpt = solve(p, SolverKind::kLpt), milp = solve(p, SolverKind::kMilp), rr = solve(p, SolverKind::kRoundRobin);
    EXPECT_LE(milp.makespan, lpt.makespan * (1 + 1e-9)) << "seed " << seed;
    for (const Plan* plan : {&lpt, &milp, &rr}) {
      EXPECT_LE(plan->lower_bound, plan->makespan * (1 + 1e-9)) << "seed " << seed;
      expect_recv_consistent(p, *plan);
      // Loads are compute plus the receive time of units off their homes.
      for (int r = 0; r < D; ++r) {
        const RankPlan& rank = plan->ranks[static_cast<size_t>(r)];
        double recv = 0;
        for (size_t i = 0; i < p.matrices.size(); ++i)
          if (plan->owner[i] == r && p.matrices[i].home != r)
            recv += (D - 1.0) / D * static_cast<double>(p.matrices[i].wire_bytes) / options.bandwidth_bytes_per_s;
        EXPECT_NEAR(rank.recv_seconds, recv, 1e-12) << "seed " << seed << " rank " << r;
      }
    }
  }
}

}  // namespace
}  // namespace dmuon::plan

// dmuon/plan/planner.h — the planner's entry point: solve a problem with one solver, and
// a cache of plans keyed by the hash of their inputs.
//
// Typical use by the runtime (rank 0 plans, everyone else deserializes the broadcast):
//   Problem problem = build_problem(matrices, options, AnalyticCostModel::gpu_default().as_cost_fn());
//   Plan plan = solve(problem, SolverKind::kMilp, MilpOptions::from_env());
//   plan.owner[i] / plan.ranks[r].batches  →  who orthogonalizes what, in which order
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "plan/cost_model.h"
#include "plan/plan.h"
#include "plan/problem.h"
#include "plan/solvers.h"

namespace dmuon::plan {

/// Runs one solver and returns its plan with metrics, lower bound and solve time.
Plan solve(const Problem& problem, SolverKind solver, const MilpOptions& milp_options = {});

/// Hash of a problem together with the solver and its options: the plan cache key.
uint64_t plan_key(const Problem& problem, SolverKind solver, const MilpOptions& milp_options);

/// Plans keyed by plan_key(), in memory and optionally in a directory (one file per key,
/// written atomically). Thread-safe.
class PlanCache {
 public:
  /// `directory` empty: memory only.
  explicit PlanCache(std::string directory = "");
  /// The cached plan for these inputs, solving (and storing) it on a miss.
  Plan get_or_solve(const Problem& problem, SolverKind solver, const MilpOptions& milp_options);
  size_t num_hits() const { return num_hits_; }
  size_t num_misses() const { return num_misses_; }

 private:
  std::string directory_;
  std::mutex mutex_;
  std::map<uint64_t, std::string> plans_;  // key → serialized plan
  size_t num_hits_ = 0;
  size_t num_misses_ = 0;
};

}  // namespace dmuon::plan

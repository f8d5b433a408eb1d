// dmuon/plan/plan.h — an owner plan: who owns each matrix, each owner's batches in
// execution order, and the predicted load of every rank.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "plan/problem.h"

namespace dmuon::plan {

/// Same-shape units orthogonalized in one batched launch on their owner.
struct Batch {
  int shape_idx = 0;
  std::vector<int> matrix_idx;   ///< indices into Problem::matrices, ascending
  int64_t num_matrices = 0;      ///< units × stack size: the launch's batch dimension
  double compute_seconds = 0.0;  ///< t(shape, num_matrices)
  double recv_seconds = 0.0;     ///< receive time of these units' bytes (none for units at home)
};

/// One rank's share of the optimizer step.
struct RankPlan {
  std::vector<Batch> batches;  ///< execution order: most expensive first
  double compute_seconds = 0.0;
  double recv_seconds = 0.0;
  double load_seconds = 0.0;   ///< compute + receive: the planner's objective
  int64_t recv_bytes = 0;      ///< (D-1)/D of the wire bytes of owned matrices not at home
  int64_t memory_bytes = 0;    ///< owned matrices' memory (full + NS workspace)
};

/// The solution of one solver.
struct Plan {
  std::string solver;          ///< "round_robin" | "lpt" | "milp"
  std::string status;          ///< how the solver stopped (e.g. "optimal", "time_limit")
  uint64_t problem_hash = 0;
  std::vector<int> owner;      ///< owner rank of every matrix
  std::vector<RankPlan> ranks;
  double makespan = 0.0;       ///< max load
  double lower_bound = 0.0;    ///< lower_bound(problem): no plan can beat it
  double solver_bound = 0.0;   ///< MILP's proven bound on the makespan (0 when none)
  double solve_seconds = 0.0;
  bool deterministic = true;   ///< false only when a wall-clock limit stopped the search

  double gap() const { return lower_bound > 0 ? makespan / lower_bound - 1.0 : 0.0; }
  /// max load / mean load.
  double imbalance() const;
  /// Text form for broadcasting to other ranks and for the plan cache.
  std::string serialize() const;
};

/// [rank][shape_idx] → batch sizes in units; what solvers produce.
using Assignment = std::vector<std::vector<std::vector<int64_t>>>;

/// Least-cost split of n units of one shape class into batches (each ≤ max_batch),
/// precomputed for n = 0..count by dynamic programming.
class BatchSplitter {
 public:
  BatchSplitter(const Problem& problem, int shape_idx);
  /// Least total load (compute + receive) of n units.
  double cost(int64_t n) const { return cost_[static_cast<size_t>(n)]; }
  /// The batch sizes achieving cost(n), largest first.
  std::vector<int64_t> split(int64_t n) const;

 private:
  std::vector<double> cost_;
  std::vector<int64_t> first_;
};

/// A true lower bound on any plan's makespan: the max of
///  - least total work / D (Σ over shapes of the least-cost split of all its units), and
///  - the pigeonhole bound: among the k·D+1 heaviest units some rank holds k+1, costing at
///    least the cheapest batched (k+1)-subset of them (k = 0: the largest single job).
double lower_bound(const Problem& problem);

/// Turns batch sizes into concrete batches: per shape, every rank first takes units whose
/// home it is (ascending index), then the rest in input order fill ranks in ascending
/// order; each rank's batches largest first. Validates every count.
Plan assemble_plan(const Problem& problem, const Assignment& assignment,
                   const std::string& solver);

/// Load of one rank's batch sizes ([shape_idx] → sizes), its home units received free.
double assignment_rank_load(const Problem& problem, int rank, const std::vector<std::vector<int64_t>>& batches);

/// Makespan of an assignment without building a plan.
double assignment_makespan(const Problem& problem, const Assignment& assignment);

/// Rebuilds a plan from serialize()'s text for this problem; throws when the text is
/// malformed, belongs to another problem (hash), or does not own every matrix once.
Plan deserialize_plan(const Problem& problem, const std::string& text);

}  // namespace dmuon::plan

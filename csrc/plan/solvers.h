// dmuon/plan/solvers.h — the three owner solvers and their options.
#pragma once

#include <cstdint>
#include <string>

#include "plan/plan.h"
#include "plan/problem.h"

namespace dmuon::plan {

enum class SolverKind { kRoundRobin, kLpt, kMilp };

/// Parses "round_robin" | "lpt" | "milp"; errors name the parameter solver.
SolverKind parse_solver(const std::string& name);
const char* solver_name(SolverKind kind);

/// Budget and tolerances of the MILP.
struct MilpOptions {
  double time_limit_s = 2.0;         ///< wall clock for both stages together
  int64_t max_nodes = 20000;         ///< branch-and-bound nodes per stage (deterministic cap)
  double stage2_tolerance = 1e-6;    ///< stage 2 keeps L ≤ L*·(1 + tolerance)
  double relative_gap = 1e-4;        ///< stop once within this of the best bound

  /// Defaults overridden by DMUON_PLAN_TIME_LIMIT (seconds) and DMUON_PLAN_MAX_NODES.
  static MilpOptions from_env();
  void validate() const;
};

/// Naive baseline: matrix i goes to rank i mod D (skipping ranks whose memory cap is
/// full); each rank batches its same-shape matrices.
Assignment solve_round_robin(const Problem& problem);

/// Longest processing time first, batching-aware: units in decreasing order of their
/// single-unit load, each onto the rank whose load after adding it (with the marginal,
/// batched cost, less the receive time while the rank still has home units of the class)
/// is smallest; ties go to the lowest rank. Respects memory caps.
Assignment solve_lpt(const Problem& problem);

/// Outcome of the MILP (without CBC: the LPT assignment with status "cbc_unavailable").
struct MilpResult {
  Assignment assignment;
  /// "optimal" (within relative_gap), "node_limit", "time_limit" (best found so far);
  /// "lpt_optimal" / "lpt_within_gap" (LPT meets the lower bound, no solve); LPT kept:
  /// "time_limit_lpt", "no_solution_lpt", "worse_than_lpt_lpt"; "cbc_unavailable".
  std::string status;
  double bound = 0.0;  ///< CBC's proven lower bound on the makespan (0 when none)
  bool deterministic = true;
};

/// Two-stage MILP (min makespan, then min total load at that makespan) with CBC, LPT as
/// the MIP start and fallback; never returns anything worse than LPT.
MilpResult solve_milp(const Problem& problem, const MilpOptions& options);

/// Whether this build links COIN-OR CBC.
bool milp_available();

}  // namespace dmuon::plan

// dmuon/plan/planner.cpp — solver dispatch, timing and the plan cache.
#include "plan/planner.h"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "common/check.h"
#include "plan/hash.h"

namespace dmuon::plan {

SolverKind parse_solver(const std::string& name) {
  if (name == "round_robin") return SolverKind::kRoundRobin;
  if (name == "lpt") return SolverKind::kLpt;
  if (name == "milp") return SolverKind::kMilp;
  DMUON_FAIL("solver must be 'round_robin', 'lpt' or 'milp', got '", name, "'");
}

const char* solver_name(SolverKind kind) {
  switch (kind) {
    case SolverKind::kRoundRobin: return "round_robin";
    case SolverKind::kLpt: return "lpt";
    case SolverKind::kMilp: return "milp";
  }
  return "unknown";
}

Plan solve(const Problem& problem, SolverKind solver, const MilpOptions& milp_options) {
  const auto start = std::chrono::steady_clock::now();
  Plan plan;
  switch (solver) {
    case SolverKind::kRoundRobin:
      plan = assemble_plan(problem, solve_round_robin(problem), solver_name(solver));
      plan.status = "done";
      break;
    case SolverKind::kLpt:
      plan = assemble_plan(problem, solve_lpt(problem), solver_name(solver));
      plan.status = "done";
      break;
    case SolverKind::kMilp: {
      MilpResult result = solve_milp(problem, milp_options);
      plan = assemble_plan(problem, result.assignment, solver_name(solver));
      plan.status = result.status;
      plan.solver_bound = result.bound;
      plan.deterministic = result.deterministic;
      break;
    }
  }
  plan.solve_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return plan;
}

uint64_t plan_key(const Problem& problem, SolverKind solver, const MilpOptions& milp_options) {
  Hasher hasher;
  hasher.i64(static_cast<int64_t>(problem.hash));
  hasher.str(solver_name(solver));
  if (solver == SolverKind::kMilp) {
    hasher.f64(milp_options.time_limit_s);
    hasher.i64(milp_options.max_nodes);
    hasher.f64(milp_options.stage2_tolerance);
    hasher.f64(milp_options.relative_gap);
    hasher.i64(milp_available() ? 1 : 0);
  }
  return hasher.digest();
}

PlanCache::PlanCache(std::string directory) : directory_(std::move(directory)) {}

Plan PlanCache::get_or_solve(const Problem& problem, SolverKind solver,
                             const MilpOptions& milp_options) {
  const uint64_t key = plan_key(problem, solver, milp_options);
  std::lock_guard<std::mutex> lock(mutex_);
  // Memory, then disk.
  auto it = plans_.find(key);
  const std::string path =
      directory_.empty() ? std::string() : directory_ + "/plan-" + std::to_string(key) + ".txt";
  if (it == plans_.end() && !path.empty()) {
    std::ifstream in(path);
    if (in.good()) {
      std::stringstream text;
      text << in.rdbuf();
      try {
        deserialize_plan(problem, text.str());
        it = plans_.emplace(key, text.str()).first;
      } catch (const Error& error) {
        // NOTE: a corrupt or stale cache file is ignored with a warning, never trusted.
        std::fprintf(stderr, "dmuon: warning: ignoring plan cache file %s: %s\n", path.c_str(),
                     error.what());
      }
    }
  }
  if (it != plans_.end()) {
    ++num_hits_;
    return deserialize_plan(problem, it->second);
  }
  // Miss: solve, remember, and write the file atomically.
  ++num_misses_;
  Plan plan = solve(problem, solver, milp_options);
  const std::string text = plan.serialize();
  plans_.emplace(key, text);
  if (!path.empty()) {
    const std::string tmp = path + ".tmp." + std::to_string(::getpid());
    std::ofstream out(tmp);
    DMUON_CHECK(out.good(), "cannot write plan cache file ", tmp);
    out << text;
    out.close();
    DMUON_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, "cannot rename ", tmp, " to ", path);
  }
  return plan;
}

}  // namespace dmuon::plan

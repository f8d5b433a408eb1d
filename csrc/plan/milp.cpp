// dmuon/plan/milp.cpp — the owner MILP with COIN-OR CBC (CbcModel on Clp).
//
// Variables x[r,s,b] ∈ ℤ≥0: number of size-b batches of shape s on rank r; L ≥ 0.
//   Σ_{r,b} b·x[r,s,b] = count_s                        (every unit owned once)
//   load_r = Σ_{s,b} load(s,b)·x[r,s,b] ≤ L               (makespan)
//   load_r ≥ load_{r+1}                                    (symmetry breaking)
//   Σ_{s,b} b·memory_s·x[r,s,b] ≤ cap                      (optional memory cap)
// Stage 1 minimizes L; stage 2 minimizes Σ_r load_r with L ≤ L*·(1 + tolerance).
// With homes (units a rank already holds whole): on a rank home to h[r,s] units
// of shape s, batches cost compute only and a continuous m[r,s] ≥ Σ_b b·x[r,s,b] − h[r,s]
// counts the units it receives, each adding recv_s to load_r; ranks then differ, so the
// symmetry rows are left out.
//
// NOTE (determinism): CBC runs single-threaded with a node cap per stage, so a plan that
// stops on optimality or on the node cap depends only on its inputs. The wall-clock
// limit is a safety net; when it fires the plan is marked deterministic = false (it is
// still shared by broadcast and cached by its inputs' hash, so every rank agrees).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <mutex>
#include <numeric>
#include <set>
#include <string>

#include "common/check.h"
#include "common/env.h"
#include "plan/solvers.h"

#ifdef DMUON_WITH_CBC
#include <CbcEventHandler.hpp>
#include <CbcModel.hpp>
#include <OsiClpSolverInterface.hpp>
#endif

namespace dmuon::plan {

MilpOptions MilpOptions::from_env() {
  MilpOptions options;
  options.time_limit_s = env::kPlanTimeLimit.get_if_set().value_or(options.time_limit_s);
  options.max_nodes = env::kPlanMaxNodes.get_if_set().value_or(options.max_nodes);
  return options;
}

void MilpOptions::validate() const {
  DMUON_CHECK(std::isfinite(time_limit_s) && time_limit_s > 0,
              "time_limit_s must be positive, got ", time_limit_s);
  DMUON_CHECK(max_nodes >= 0, "max_nodes must be >= 0, got ", max_nodes);
  DMUON_CHECK(relative_gap >= 0 && relative_gap < 1, "relative_gap must be in [0, 1), got ",
              relative_gap);
  DMUON_CHECK(stage2_tolerance >= 0 && stage2_tolerance < 1,
              "stage2_tolerance must be in [0, 1), got ", stage2_tolerance);
}

bool milp_available() {
#ifdef DMUON_WITH_CBC
  return true;
#else
  return false;
#endif
}

#ifndef DMUON_WITH_CBC

MilpResult solve_milp(const Problem& problem, const MilpOptions& options) {
  options.validate();
  static std::once_flag warned;
  std::call_once(warned, [] {
    std::fprintf(stderr,
                 "dmuon: warning: this build has no COIN-OR CBC; the MILP owner planner falls "
                 "back to LPT\n");
  });
  return MilpResult{solve_lpt(problem), "cbc_unavailable", 0.0, true};
}

#else

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// NOTE: up to this many batch sizes per shape the MILP has every size (exact model);
// beyond, it gets 1..kSmallSizes plus a geometric ladder (×1.25), the LPT sizes and the
// even split, which keeps D = 256 models within a few thousand integers.
constexpr int64_t kFullRange = 64;
constexpr int64_t kSmallSizes = 16;
constexpr double kLadder = 1.25;

// Candidate batch sizes of one shape; `complete` turns false when some size is left out.
std::vector<int64_t> candidate_sizes(const Problem& problem, int s, double upper_bound,
                                     const Assignment& start, bool& complete) {
  const ShapeClass& shape = problem.shapes[static_cast<size_t>(s)];
  // NOTE: a batch heavier than the LPT makespan can never be in a better plan.
  int64_t usable = 1;
  // NOTE: a batch at home receives nothing, so with homes only its compute counts here.
  auto batch_cost = [&](int64_t b) {
    return shape.has_homes() ? shape.batch_seconds[static_cast<size_t>(b - 1)] : problem.batch_load(s, b);
  };
  while (usable < shape.max_batch() && batch_cost(usable + 1) <= upper_bound * (1 + 1e-9)) ++usable;
  std::set<int64_t> sizes;
  if (usable <= kFullRange) {
    for (int64_t b = 1; b <= usable; ++b) sizes.insert(b);
    return {sizes.begin(), sizes.end()};
  }
  complete = false;
  for (int64_t b = 1; b <= kSmallSizes; ++b) sizes.insert(b);
  for (double b = kSmallSizes; b < static_cast<double>(usable); b *= kLadder)
    sizes.insert(static_cast<int64_t>(std::llround(b)));
  sizes.insert(usable);
  const int64_t even = (shape.count() + problem.world_size() - 1) / problem.world_size();
  for (int64_t b : {even - 1, even, even + 1})
    if (b >= 1 && b <= usable) sizes.insert(b);
  for (const auto& rank : start)
    for (int64_t b : rank[static_cast<size_t>(s)]) sizes.insert(b);
  return {sizes.begin(), sizes.end()};
}

// The MILP in column form, shared by both stages.
struct Model {
  struct Column {
    int rank;
    int shape;
    int64_t size;  // 0: the continuous m[r,s] (units received off their homes)
    double load;   // batch load (or receive seconds per unit of m) / scale
  };
  std::vector<Column> columns;  // x and m columns; L is the last column
  int num_rows = 0;
  std::vector<int> starts;
  std::vector<int> rows;
  std::vector<double> values;
  std::vector<double> row_lower, row_upper;
  double scale = 1.0;  // seconds per model unit of load
  int l_col() const { return static_cast<int>(columns.size()); }
};

Model build_model(const Problem& problem, const std::vector<std::vector<int64_t>>& sizes,
                  double scale) {
  const int D = problem.world_size();
  const int S = static_cast<int>(problem.shapes.size());
  const bool capped = problem.options.memory_cap_bytes > 0;
  const bool homes = problem.has_homes();
  constexpr double kInf = 1e30;
  Model model;
  model.scale = scale;
  // Rows: counts [0,S), loads [S,S+D), symmetry [S+D, S+2D-1) (none with homes), memory
  // (D rows when capped), then one home row per (r, s) with h[r,s] > 0.
  const int load_row = S, sym_row = S + D, mem_row = homes ? S + D : S + 2 * D - 1;
  const int home_row0 = mem_row + (capped ? D : 0);
  std::vector<std::vector<int>> home_row(static_cast<size_t>(D), std::vector<int>(static_cast<size_t>(S), -1));
  model.num_rows = home_row0;
  for (int r = 0; r < D; ++r)
    for (int s = 0; s < S; ++s)
      if (problem.shapes[static_cast<size_t>(s)].homes_on(r) > 0) home_row[static_cast<size_t>(r)][static_cast<size_t>(s)] = model.num_rows++;
  for (int s = 0; s < S; ++s) {
    const double count = static_cast<double>(problem.shapes[static_cast<size_t>(s)].count());
    model.row_lower.push_back(count);
    model.row_upper.push_back(count);
  }
  for (int r = 0; r < D; ++r) model.row_lower.push_back(-kInf), model.row_upper.push_back(0.0);
  if (!homes)
    for (int r = 0; r + 1 < D; ++r) model.row_lower.push_back(0.0), model.row_upper.push_back(kInf);
  if (capped)
    for (int r = 0; r < D; ++r)
      model.row_lower.push_back(-kInf),
          model.row_upper.push_back(static_cast<double>(problem.options.memory_cap_bytes));
  for (int r = 0; r < D; ++r)
    for (int s = 0; s < S; ++s)
      if (home_row[static_cast<size_t>(r)][static_cast<size_t>(s)] >= 0)
        model.row_lower.push_back(-kInf),
            model.row_upper.push_back(static_cast<double>(problem.shapes[static_cast<size_t>(s)].homes_on(r)));
  // Columns x[r,s,b], row indices ascending.
  for (int r = 0; r < D; ++r) {
    for (int s = 0; s < S; ++s) {
      const ShapeClass& shape = problem.shapes[static_cast<size_t>(s)];
      const int hrow = home_row[static_cast<size_t>(r)][static_cast<size_t>(s)];
      auto add = [&](int row, double value) {
        model.rows.push_back(row);
        model.values.push_back(value);
      };
      for (int64_t b : sizes[static_cast<size_t>(s)]) {
        // NOTE: on a home rank the receive term moves to m[r,s].
        const double load = (hrow >= 0 ? shape.batch_seconds[static_cast<size_t>(b - 1)] : problem.batch_load(s, b)) / scale;
        model.columns.push_back({r, s, b, load});
        model.starts.push_back(static_cast<int>(model.rows.size()));
        add(s, static_cast<double>(b));
        add(load_row + r, load);
        if (!homes && r > 0) add(sym_row + r - 1, -load);
        if (!homes && r + 1 < D) add(sym_row + r, load);
        if (capped) add(mem_row + r, static_cast<double>(b * shape.memory_bytes));
        if (hrow >= 0) add(hrow, static_cast<double>(b));
      }
      // m[r,s]: receive seconds per unit in load_r, −1 in the home row.
      if (hrow >= 0) {
        const double load = shape.recv_seconds / scale;
        model.columns.push_back({r, s, 0, load});
        model.starts.push_back(static_cast<int>(model.rows.size()));
        add(load_row + r, load);
        add(hrow, -1.0);
      }
    }
  }
  // Column L: −1 in every load row.
  model.starts.push_back(static_cast<int>(model.rows.size()));
  for (int r = 0; r < D; ++r) {
    model.rows.push_back(load_row + r);
    model.values.push_back(-1.0);
  }
  model.starts.push_back(static_cast<int>(model.rows.size()));
  return model;
}

// Column values of an assignment, its ranks sorted by decreasing load (symmetry rows).
std::vector<double> start_values(const Problem& problem, const Model& model, const Assignment& a) {
  const int D = problem.world_size();
  std::vector<double> load(static_cast<size_t>(D), 0.0);
  for (int r = 0; r < D; ++r) load[static_cast<size_t>(r)] = assignment_rank_load(problem, r, a[static_cast<size_t>(r)]);
  std::vector<int> by_load(static_cast<size_t>(D));
  std::iota(by_load.begin(), by_load.end(), 0);
  // NOTE: with homes ranks are not interchangeable (and there are no symmetry rows).
  if (!problem.has_homes())
    std::stable_sort(by_load.begin(), by_load.end(),
                     [&](int x, int y) { return load[static_cast<size_t>(x)] > load[static_cast<size_t>(y)]; });
  std::vector<double> values(model.columns.size() + 1, 0.0);
  for (size_t c = 0; c < model.columns.size(); ++c) {
    const Model::Column& col = model.columns[c];
    const auto& batch_sizes = a[static_cast<size_t>(by_load[static_cast<size_t>(col.rank)])][static_cast<size_t>(col.shape)];
    if (col.size == 0) {
      int64_t units = 0;
      for (int64_t b : batch_sizes) units += b;
      values[c] = static_cast<double>(std::max<int64_t>(0, units - problem.shapes[static_cast<size_t>(col.shape)].homes_on(col.rank)));
    } else {
      values[c] = static_cast<double>(std::count(batch_sizes.begin(), batch_sizes.end(), col.size));
    }
  }
  values.back() = *std::max_element(load.begin(), load.end()) / model.scale;
  return values;
}

// Reads an integer solution back; empty when it does not place every unit exactly once.
Assignment read_solution(const Problem& problem, const Model& model, const double* x) {
  const int D = problem.world_size();
  const size_t S = problem.shapes.size();
  Assignment a(static_cast<size_t>(D), std::vector<std::vector<int64_t>>(S));
  std::vector<int64_t> placed(S, 0);
  for (size_t c = 0; c < model.columns.size(); ++c) {
    const Model::Column& col = model.columns[c];
    if (col.size == 0) continue;  // m[r,s] follows from the counts
    const int64_t num = std::llround(x[c]);
    if (num < 0 || std::fabs(x[c] - static_cast<double>(num)) > 1e-4) return {};
    for (int64_t i = 0; i < num; ++i) a[static_cast<size_t>(col.rank)][static_cast<size_t>(col.shape)].push_back(col.size);
    placed[static_cast<size_t>(col.shape)] += num * col.size;
  }
  for (size_t s = 0; s < S; ++s)
    if (placed[s] != problem.shapes[s].count()) return {};
  return a;
}

struct StageResult {
  Assignment assignment;  // empty when CBC found nothing usable
  bool optimal = false;
  bool timed_out = false;
  bool node_limit = false;
  double bound = 0.0;
};

// Stops the search at the next node once the wall-clock deadline has passed.
// NOTE: CBC's own limit (setMaximumSeconds) is checked at coarser points; this handler
// keeps the overrun to one node even on a loaded machine.
class DeadlineHandler : public CbcEventHandler {
 public:
  explicit DeadlineHandler(Clock::time_point deadline) : deadline_(deadline) {}
  CbcAction event(CbcEvent) override { return Clock::now() >= deadline_ ? stop : noAction; }
  CbcEventHandler* clone() const override { return new DeadlineHandler(*this); }

 private:
  Clock::time_point deadline_;
};

// One CBC solve: stage 1 (objective L) or stage 2 (objective Σ load, L ≤ l_upper).
StageResult run_stage(const Problem& problem, const Model& model, bool stage2, double l_lower,
                      double l_upper, const std::vector<double>& start, double seconds,
                      int64_t max_nodes, double relative_gap) {
  const int num_cols = static_cast<int>(model.columns.size()) + 1;
  std::vector<double> col_lower(static_cast<size_t>(num_cols), 0.0), col_upper(static_cast<size_t>(num_cols));
  std::vector<double> objective(static_cast<size_t>(num_cols), 0.0);
  for (size_t c = 0; c < model.columns.size(); ++c) {
    const Model::Column& col = model.columns[c];
    const double count = static_cast<double>(problem.shapes[static_cast<size_t>(col.shape)].count());
    col_upper[c] = col.size == 0 ? count : std::floor(count / static_cast<double>(col.size));
    if (stage2) objective[c] = col.load;
  }
  col_lower.back() = l_lower / model.scale;
  col_upper.back() = l_upper / model.scale;
  if (!stage2) objective.back() = 1.0;

  // The LP, integer columns, silent.
  OsiClpSolverInterface lp;
  lp.loadProblem(num_cols, model.num_rows, model.starts.data(), model.rows.data(), model.values.data(),
                 col_lower.data(), col_upper.data(), objective.data(), model.row_lower.data(),
                 model.row_upper.data());
  for (int c = 0; c + 1 < num_cols; ++c)
    if (model.columns[static_cast<size_t>(c)].size > 0) lp.setInteger(c);
  lp.messageHandler()->setLogLevel(0);
  CbcModel cbc(lp);
  cbc.setLogLevel(0);
  cbc.messageHandler()->setLogLevel(0);
  cbc.solver()->messageHandler()->setLogLevel(0);

  // Budget: wall clock, nodes, gaps. Single-threaded (the default) for determinism.
  // NOTE: CBC's cutoff increment and gaps are absolute; loads are scaled to O(1) and the
  // gaps tightened so "optimal" means optimal to ~1e-9 (or within relative_gap).
  const Clock::time_point deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  cbc.setUseElapsedTime(true);
  cbc.setMaximumSeconds(std::max(seconds, 0.0));
  cbc.setMaximumNodes(static_cast<int>(std::min<int64_t>(max_nodes, 1 << 30)));
  cbc.setAllowableGap(1e-10);
  cbc.setAllowableFractionGap(relative_gap);
  cbc.setCutoffIncrement(1e-9);
  DeadlineHandler handler(deadline);
  cbc.passInEventHandler(&handler);

  // Solve from the start solution.
  cbc.initialSolve();
  double start_objective = 0.0;
  for (int c = 0; c < num_cols; ++c) start_objective += objective[static_cast<size_t>(c)] * start[static_cast<size_t>(c)];
  cbc.setBestSolution(start.data(), num_cols, start_objective, true);
  cbc.branchAndBound();

  StageResult result;
  result.optimal = cbc.isProvenOptimal();
  result.timed_out = cbc.isSecondsLimitReached() || (!result.optimal && Clock::now() >= deadline);
  result.node_limit = cbc.isNodeLimitReached();
  if (!stage2) result.bound = cbc.getBestPossibleObjValue() * model.scale;
  if (cbc.bestSolution() != nullptr) result.assignment = read_solution(problem, model, cbc.bestSolution());
  return result;
}

}  // namespace

MilpResult solve_milp(const Problem& problem, const MilpOptions& options) {
  options.validate();
  const auto start_time = Clock::now();
  MilpResult result{solve_lpt(problem), "lpt_optimal", 0.0, true};
  const double lpt_makespan = assignment_makespan(problem, result.assignment);
  const double bound = lower_bound(problem);
  // NOTE: LPT already within relative_gap of the lower bound is optimal enough.
  if (lpt_makespan <= bound * (1 + options.relative_gap)) {
    if (lpt_makespan > bound * (1 + 1e-9)) result.status = "lpt_within_gap";
    return result;
  }

  // Candidate batch sizes and the model.
  bool complete = true;
  std::vector<std::vector<int64_t>> sizes;
  for (int s = 0; s < static_cast<int>(problem.shapes.size()); ++s)
    sizes.push_back(candidate_sizes(problem, s, lpt_makespan, result.assignment, complete));
  // NOTE: loads in units of the lower bound keep CBC's absolute tolerances meaningful.
  const Model model = build_model(problem, sizes, bound);

  // Stage 1: least makespan, LPT as the start; most of the time budget.
  // NOTE: 70% for stage 1 because it decides the makespan; stage 2 only tidies totals.
  // 5% stays in reserve for the last node, the LP re-solve and plan assembly.
  const double budget1 = 0.7 * options.time_limit_s - seconds_since(start_time);
  const StageResult stage1 =
      run_stage(problem, model, false, bound * (1 - 1e-9), lpt_makespan * (1 + 1e-9),
                start_values(problem, model, result.assignment), budget1, options.max_nodes, options.relative_gap);
  result.deterministic = !stage1.timed_out;
  if (stage1.assignment.empty()) {
    result.status = stage1.timed_out ? "time_limit_lpt" : "no_solution_lpt";
    return result;
  }
  const double makespan1 = assignment_makespan(problem, stage1.assignment);
  if (makespan1 > lpt_makespan) {
    result.status = "worse_than_lpt_lpt";
    return result;
  }
  result.assignment = stage1.assignment;
  result.status = stage1.optimal ? "optimal" : stage1.timed_out ? "time_limit" : "node_limit";
  // NOTE: CBC's bound holds for the whole problem only when every batch size was modelled.
  // NOTE: "optimal" may mean within relative_gap, so the bound is CBC's, not makespan1.
  if (complete) result.bound = std::min(makespan1, std::max(0.0, stage1.bound * (1 - 1e-7)));

  // Stage 2: least total load with the makespan kept; the remaining time.
  const double budget2 = 0.95 * options.time_limit_s - seconds_since(start_time);
  if (budget2 <= 0.01) return result;
  const double l_upper = makespan1 * (1 + options.stage2_tolerance);
  const StageResult stage2 = run_stage(problem, model, true, 0.0, l_upper,
                                       start_values(problem, model, stage1.assignment), budget2,
                                       options.max_nodes, 0.0);
  result.deterministic = result.deterministic && !stage2.timed_out;
  if (!stage2.assignment.empty() &&
      assignment_makespan(problem, stage2.assignment) <= std::min(l_upper, lpt_makespan))
    result.assignment = stage2.assignment;
  return result;
}

#endif  // DMUON_WITH_CBC

}  // namespace dmuon::plan

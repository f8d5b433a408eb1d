// dmuon/plan/plan.cpp — plan assembly, metrics, lower bound and (de)serialization.
#include "plan/plan.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "common/check.h"

namespace dmuon::plan {
namespace {

constexpr const char* kPlanMagic = "dmuon-plan v1";

// Fills owner and every rank's metrics; orders batches; checks every matrix is owned once.
Plan finalize(const Problem& problem, std::vector<std::vector<Batch>> rank_batches,
              const std::string& solver) {
  const int D = problem.world_size();
  DMUON_CHECK(static_cast<int>(rank_batches.size()) == D, "plan has ", rank_batches.size(),
              " ranks, the problem has world_size ", D);
  Plan plan;
  plan.solver = solver;
  plan.problem_hash = problem.hash;
  plan.owner.assign(problem.matrices.size(), -1);
  plan.ranks.resize(static_cast<size_t>(D));
  for (int r = 0; r < D; ++r) {
    RankPlan& rank = plan.ranks[static_cast<size_t>(r)];
    for (Batch& batch : rank_batches[static_cast<size_t>(r)]) {
      DMUON_CHECK(batch.shape_idx >= 0 && batch.shape_idx < static_cast<int>(problem.shapes.size()),
                  "plan batch on rank ", r, " has shape index ", batch.shape_idx, " out of range");
      const ShapeClass& s = problem.shapes[static_cast<size_t>(batch.shape_idx)];
      const int64_t units = static_cast<int64_t>(batch.matrix_idx.size());
      DMUON_CHECK(units >= 1 && units <= s.max_batch(), "plan batch on rank ", r, " has ", units,
                  " units of shape ", s.rows, "x", s.cols, " (allowed 1..", s.max_batch(), ")");
      std::sort(batch.matrix_idx.begin(), batch.matrix_idx.end());
      int64_t received = 0;
      for (int idx : batch.matrix_idx) {
        DMUON_CHECK(idx >= 0 && idx < static_cast<int>(problem.matrices.size()),
                    "plan names matrix index ", idx, " out of range");
        const MatrixSpec& m = problem.matrices[static_cast<size_t>(idx)];
        DMUON_CHECK(m.rows == s.rows && m.cols == s.cols && m.batch == s.stack,
                    "plan puts matrix '", m.name, "' into a batch of another shape");
        DMUON_CHECK(plan.owner[static_cast<size_t>(idx)] == -1, "plan owns matrix '", m.name,
                    "' twice");
        plan.owner[static_cast<size_t>(idx)] = r;
        // NOTE: a matrix owned at its home receives nothing.
        if (m.home != r) {
          rank.recv_bytes += static_cast<int64_t>(std::llround(static_cast<double>(m.wire_bytes) * (D - 1) / D));
          ++received;
        }
        rank.memory_bytes += m.memory_bytes;
      }
      batch.num_matrices = units * s.stack;
      batch.compute_seconds = s.batch_seconds[static_cast<size_t>(units - 1)];
      batch.recv_seconds = static_cast<double>(received) * s.recv_seconds;
      rank.compute_seconds += batch.compute_seconds;
      rank.recv_seconds += batch.recv_seconds;
    }
    rank.load_seconds = rank.compute_seconds + rank.recv_seconds;
    DMUON_CHECK(problem.options.memory_cap_bytes == 0 ||
                    rank.memory_bytes <= problem.options.memory_cap_bytes,
                "plan puts ", rank.memory_bytes, " bytes on rank ", r,
                ", more than memory_cap_bytes = ", problem.options.memory_cap_bytes);
    // Execution order: most expensive batch first, so its result is sent back earliest.
    rank.batches = std::move(rank_batches[static_cast<size_t>(r)]);
    std::stable_sort(rank.batches.begin(), rank.batches.end(), [](const Batch& a, const Batch& b) {
      if (a.compute_seconds != b.compute_seconds) return a.compute_seconds > b.compute_seconds;
      if (a.shape_idx != b.shape_idx) return a.shape_idx < b.shape_idx;
      return a.matrix_idx.front() < b.matrix_idx.front();
    });
    plan.makespan = std::max(plan.makespan, rank.load_seconds);
  }
  for (size_t i = 0; i < plan.owner.size(); ++i)
    DMUON_CHECK(plan.owner[i] >= 0, "plan leaves matrix '", problem.matrices[i].name,
                "' without an owner");
  plan.lower_bound = lower_bound(problem);
  return plan;
}

}  // namespace

double Plan::imbalance() const {
  if (ranks.empty()) return 0.0;
  double total = 0.0;
  for (const RankPlan& rank : ranks) total += rank.load_seconds;
  const double mean = total / static_cast<double>(ranks.size());
  return mean > 0 ? makespan / mean : 0.0;
}

// ---- Batch splitting ----------------------------------------------------------------------

BatchSplitter::BatchSplitter(const Problem& problem, int shape_idx) {
  const ShapeClass& s = problem.shapes[static_cast<size_t>(shape_idx)];
  const int64_t count = s.count();
  cost_.assign(static_cast<size_t>(count + 1), 0.0);
  first_.assign(static_cast<size_t>(count + 1), 0);
  for (int64_t n = 1; n <= count; ++n) {
    double best = std::numeric_limits<double>::infinity();
    // NOTE: larger batches are tried first and kept on ties, so splits are deterministic
    // and prefer fewer launches.
    for (int64_t b = std::min(n, s.max_batch()); b >= 1; --b) {
      const double c = problem.batch_load(shape_idx, b) + cost_[static_cast<size_t>(n - b)];
      if (c < best) {
        best = c;
        first_[static_cast<size_t>(n)] = b;
      }
    }
    cost_[static_cast<size_t>(n)] = best;
  }
}

std::vector<int64_t> BatchSplitter::split(int64_t n) const {
  std::vector<int64_t> sizes;
  for (; n > 0; n -= first_[static_cast<size_t>(n)]) sizes.push_back(first_[static_cast<size_t>(n)]);
  std::sort(sizes.rbegin(), sizes.rend());
  return sizes;
}

double lower_bound(const Problem& problem) {
  const int D = problem.world_size();
  const int S = static_cast<int>(problem.shapes.size());
  std::vector<BatchSplitter> splitters;
  double least_total = 0.0;
  int64_t num_units = 0;
  for (int s = 0; s < S; ++s) {
    const ShapeClass& shape = problem.shapes[static_cast<size_t>(s)];
    splitters.emplace_back(problem, s);
    // NOTE: units with a home may be owned there and receive nothing.
    least_total += splitters.back().cost(shape.count()) -
                   static_cast<double>(shape.num_homed()) * shape.recv_seconds;
    num_units += shape.count();
  }
  double bound = least_total / D;

  // Pigeonhole: among the k·D+1 heaviest units some rank holds k+1, and those alone cost
  // at least the cheapest (batched) (k+1)-subset of them. k = 0 is the largest single job.
  std::vector<int> by_load(static_cast<size_t>(S));
  for (int s = 0; s < S; ++s) by_load[static_cast<size_t>(s)] = s;
  // NOTE: with homes, a subset of n units of a class costs at least its split less the
  // receive time of min(n, homed units) (they might all sit at home).
  auto least_load = [&](int s, int64_t n) {
    const ShapeClass& shape = problem.shapes[static_cast<size_t>(s)];
    return splitters[static_cast<size_t>(s)].cost(n) -
           static_cast<double>(std::min(n, shape.num_homed())) * shape.recv_seconds;
  };
  std::stable_sort(by_load.begin(), by_load.end(), [&](int a, int b) {
    return least_load(a, 1) > least_load(b, 1);
  });
  // NOTE: k is capped because for many units per rank the total-work term dominates and
  // the subset DP costs O(S·k²) per k.
  constexpr int64_t kMaxPigeonhole = 32;
  const double kInf = std::numeric_limits<double>::infinity();
  for (int64_t k = 0; k <= kMaxPigeonhole && k * D + 1 <= num_units; ++k) {
    int64_t remaining = k * D + 1;
    std::vector<double> best(static_cast<size_t>(k + 2), kInf);  // best[j]: j units chosen
    best[0] = 0.0;
    for (int s : by_load) {
      if (remaining == 0) break;
      const int64_t avail = std::min(remaining, problem.shapes[static_cast<size_t>(s)].count());
      remaining -= avail;
      std::vector<double> next = best;
      for (int64_t j = 1; j <= k + 1; ++j)
        for (int64_t n = 1; n <= std::min(avail, j); ++n)
          next[static_cast<size_t>(j)] = std::min(next[static_cast<size_t>(j)],
                                                  best[static_cast<size_t>(j - n)] + least_load(s, n));
      best = std::move(next);
    }
    bound = std::max(bound, best[static_cast<size_t>(k + 1)]);
  }
  return bound;
}

// ---- Assembly -----------------------------------------------------------------------------

Plan assemble_plan(const Problem& problem, const Assignment& assignment, const std::string& solver) {
  const int D = problem.world_size();
  const size_t num_shapes = problem.shapes.size();
  DMUON_CHECK(static_cast<int>(assignment.size()) == D, "assignment has ", assignment.size(),
              " ranks, expected ", D);
  std::vector<std::vector<Batch>> rank_batches(static_cast<size_t>(D));
  for (int r = 0; r < D; ++r)
    DMUON_CHECK(assignment[static_cast<size_t>(r)].size() == num_shapes, "assignment of rank ", r,
                " has ", assignment[static_cast<size_t>(r)].size(), " shapes, expected ", num_shapes);
  for (size_t s = 0; s < num_shapes; ++s) {
    const ShapeClass& shape = problem.shapes[s];
    // Units per rank; more than the class has is an error.
    std::vector<int64_t> wanted(static_cast<size_t>(D), 0);
    int64_t total = 0;
    for (int r = 0; r < D; ++r)
      for (int64_t size : assignment[static_cast<size_t>(r)][s]) {
        total += size;
        DMUON_CHECK(size >= 1 && total <= shape.count(), "assignment places more units of shape ",
                    shape.rows, "x", shape.cols, " than exist (", shape.count(), ")");
        wanted[static_cast<size_t>(r)] += size;
      }
    // Which units: each rank first takes its home units (ascending index), then the units
    // left over fill the ranks in ascending order. Without homes: input order, rank by rank.
    std::vector<std::vector<int>> units(static_cast<size_t>(D));
    std::vector<int> rest;
    for (int idx : shape.matrix_idx) {
      const int home = problem.matrices[static_cast<size_t>(idx)].home;
      if (home >= 0 && static_cast<int64_t>(units[static_cast<size_t>(home)].size()) < wanted[static_cast<size_t>(home)])
        units[static_cast<size_t>(home)].push_back(idx);
      else
        rest.push_back(idx);
    }
    size_t next = 0;
    for (int r = 0; r < D; ++r) {
      std::vector<int>& mine = units[static_cast<size_t>(r)];
      while (static_cast<int64_t>(mine.size()) < wanted[static_cast<size_t>(r)]) mine.push_back(rest[next++]);
      std::sort(mine.begin(), mine.end());
      // Batches largest first, each of consecutive units.
      std::vector<int64_t> sizes = assignment[static_cast<size_t>(r)][s];
      std::sort(sizes.rbegin(), sizes.rend());
      size_t begin = 0;
      for (int64_t size : sizes) {
        Batch batch;
        batch.shape_idx = static_cast<int>(s);
        batch.matrix_idx.assign(mine.begin() + static_cast<long>(begin), mine.begin() + static_cast<long>(begin + size));
        begin += static_cast<size_t>(size);
        rank_batches[static_cast<size_t>(r)].push_back(std::move(batch));
      }
    }
  }
  return finalize(problem, std::move(rank_batches), solver);
}

double assignment_rank_load(const Problem& problem, int rank, const std::vector<std::vector<int64_t>>& batches) {
  double load = 0.0;
  for (size_t s = 0; s < batches.size(); ++s) {
    int64_t units = 0;
    for (int64_t size : batches[s]) {
      load += problem.batch_load(static_cast<int>(s), size);
      units += size;
    }
    load -= problem.home_saving(static_cast<int>(s), rank, units);
  }
  return load;
}

double assignment_makespan(const Problem& problem, const Assignment& assignment) {
  double makespan = 0.0;
  for (size_t r = 0; r < assignment.size(); ++r)
    makespan = std::max(makespan, assignment_rank_load(problem, static_cast<int>(r), assignment[r]));
  return makespan;
}

// ---- Serialization ------------------------------------------------------------------------

std::string Plan::serialize() const {
  std::ostringstream out;
  out.precision(17);
  out << kPlanMagic << "\n";
  out << "solver " << solver << "\nstatus " << status << "\nhash " << problem_hash << "\n";
  out << "ranks " << ranks.size() << "\n";
  out << "solver_bound " << solver_bound << "\nsolve_seconds " << solve_seconds << "\n";
  out << "deterministic " << (deterministic ? 1 : 0) << "\n";
  for (size_t r = 0; r < ranks.size(); ++r) {
    for (const Batch& batch : ranks[r].batches) {
      out << "batch " << r << " " << batch.shape_idx;
      for (int idx : batch.matrix_idx) out << " " << idx;
      out << "\n";
    }
  }
  return out.str();
}

Plan deserialize_plan(const Problem& problem, const std::string& text) {
  std::istringstream in(text);
  std::string line;
  int line_no = 0;
  auto next_line = [&](const char* expected) {
    ++line_no;
    DMUON_CHECK(static_cast<bool>(std::getline(in, line)), "plan text line ", line_no,
                ": expected '", expected, "', got end of text");
  };
  next_line(kPlanMagic);
  DMUON_CHECK(line == kPlanMagic, "plan text line 1: expected '", kPlanMagic, "'");
  // Header fields, in serialize()'s order.
  std::string solver, status;
  uint64_t hash = 0;
  size_t num_ranks = 0;
  double solver_bound = 0, solve_seconds = 0;
  int deterministic = 1;
  auto field = [&](const char* name, auto& value) {
    next_line(name);
    std::istringstream fields(line);
    std::string key;
    DMUON_CHECK((fields >> key >> value) && key == name, "plan text line ", line_no,
                ": expected '", name, " <value>', got '", line, "'");
  };
  field("solver", solver);
  field("status", status);
  field("hash", hash);
  field("ranks", num_ranks);
  field("solver_bound", solver_bound);
  field("solve_seconds", solve_seconds);
  field("deterministic", deterministic);
  DMUON_CHECK(hash == problem.hash, "plan was made for problem hash ", hash,
              ", this problem has hash ", problem.hash, " (inputs differ)");
  DMUON_CHECK(num_ranks == static_cast<size_t>(problem.world_size()), "plan has ", num_ranks,
              " ranks, the problem has world_size ", problem.world_size());
  // One line per batch: "batch <rank> <shape> <matrix indices...>".
  std::vector<std::vector<Batch>> rank_batches(num_ranks);
  while (std::getline(in, line)) {
    ++line_no;
    if (line.empty()) continue;
    std::istringstream fields(line);
    std::string key;
    size_t rank = 0;
    Batch batch;
    DMUON_CHECK((fields >> key >> rank >> batch.shape_idx) && key == "batch" && rank < num_ranks,
                "plan text line ", line_no, ": expected 'batch <rank> <shape> <matrices>', got '",
                line, "'");
    for (int idx; fields >> idx;) batch.matrix_idx.push_back(idx);
    DMUON_CHECK(fields.eof(), "plan text line ", line_no, ": malformed matrix index in '", line, "'");
    rank_batches[rank].push_back(std::move(batch));
  }
  Plan plan = finalize(problem, std::move(rank_batches), solver);
  plan.status = status;
  plan.solver_bound = solver_bound;
  plan.solve_seconds = solve_seconds;
  plan.deterministic = deterministic != 0;
  return plan;
}

}  // namespace dmuon::plan

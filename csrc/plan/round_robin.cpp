// dmuon/plan/round_robin.cpp — the naive owner assignment, kept as the baseline.
#include "common/check.h"
#include "plan/solvers.h"

namespace dmuon::plan {

Assignment solve_round_robin(const Problem& problem) {
  const int D = problem.world_size();
  const size_t num_shapes = problem.shapes.size();
  const int64_t cap = problem.options.memory_cap_bytes;
  // Shape class of every matrix.
  std::vector<int> shape_of(problem.matrices.size());
  for (size_t s = 0; s < num_shapes; ++s)
    for (int idx : problem.shapes[s].matrix_idx) shape_of[static_cast<size_t>(idx)] = static_cast<int>(s);

  // Deal matrices in input order, skipping ranks whose memory cap is full.
  std::vector<std::vector<int64_t>> counts(static_cast<size_t>(D), std::vector<int64_t>(num_shapes, 0));
  std::vector<int64_t> memory(static_cast<size_t>(D), 0);
  int rank = 0;
  for (size_t i = 0; i < problem.matrices.size(); ++i) {
    const MatrixSpec& m = problem.matrices[i];
    int tries = 0;
    while (cap > 0 && memory[static_cast<size_t>(rank)] + m.memory_bytes > cap) {
      DMUON_CHECK(++tries < D, "round_robin: matrix '", m.name, "' fits no rank under memory_cap_bytes = ",
                  cap, " (the ranks are full)");
      rank = (rank + 1) % D;
    }
    ++counts[static_cast<size_t>(rank)][static_cast<size_t>(shape_of[i])];
    memory[static_cast<size_t>(rank)] += m.memory_bytes;
    rank = (rank + 1) % D;
  }

  // Each rank batches what it got, at least cost.
  Assignment assignment(static_cast<size_t>(D), std::vector<std::vector<int64_t>>(num_shapes));
  for (size_t s = 0; s < num_shapes; ++s) {
    const BatchSplitter splitter(problem, static_cast<int>(s));
    for (int r = 0; r < D; ++r)
      assignment[static_cast<size_t>(r)][s] = splitter.split(counts[static_cast<size_t>(r)][s]);
  }
  return assignment;
}

}  // namespace dmuon::plan

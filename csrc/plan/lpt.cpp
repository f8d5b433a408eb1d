// dmuon/plan/lpt.cpp — batching-aware longest-processing-time-first.
#include <algorithm>
#include <limits>
#include <numeric>

#include "common/check.h"
#include "plan/solvers.h"

namespace dmuon::plan {

Assignment solve_lpt(const Problem& problem) {
  const int D = problem.world_size();
  const int num_shapes = static_cast<int>(problem.shapes.size());
  const int64_t cap = problem.options.memory_cap_bytes;
  std::vector<BatchSplitter> splitters;
  for (int s = 0; s < num_shapes; ++s) splitters.emplace_back(problem, s);

  // Shape classes by decreasing single-unit load (ties: input order).
  std::vector<int> order(static_cast<size_t>(num_shapes));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return problem.batch_load(a, 1) > problem.batch_load(b, 1);
  });

  // Place every unit where the rank's load after adding it is smallest.
  // NOTE: the marginal cost C(n+1) − C(n) of the least-cost split is what makes this
  // batching-aware: a rank that already holds the shape can take one more cheaply.
  std::vector<std::vector<int64_t>> counts(static_cast<size_t>(D), std::vector<int64_t>(static_cast<size_t>(num_shapes), 0));
  std::vector<double> load(static_cast<size_t>(D), 0.0);
  std::vector<int64_t> memory(static_cast<size_t>(D), 0);
  for (int s : order) {
    const ShapeClass& shape = problem.shapes[static_cast<size_t>(s)];
    const BatchSplitter& splitter = splitters[static_cast<size_t>(s)];
    for (int64_t unit = 0; unit < shape.count(); ++unit) {
      int best_rank = -1;
      double best_load = std::numeric_limits<double>::infinity();
      for (int r = 0; r < D; ++r) {
        if (cap > 0 && memory[static_cast<size_t>(r)] + shape.memory_bytes > cap) continue;
        const int64_t n = counts[static_cast<size_t>(r)][static_cast<size_t>(s)];
        // NOTE: while a rank holds fewer units than it is home to, one more receives nothing.
        const double saved = n < shape.homes_on(r) ? shape.recv_seconds : 0.0;
        const double after = load[static_cast<size_t>(r)] + splitter.cost(n + 1) - splitter.cost(n) - saved;
        if (after < best_load) {
          best_load = after;
          best_rank = r;
        }
      }
      DMUON_CHECK(best_rank >= 0, "lpt: matrix '",
                  problem.matrices[static_cast<size_t>(shape.matrix_idx[static_cast<size_t>(unit)])].name,
                  "' fits no rank under memory_cap_bytes = ", cap, " (the ranks are full)");
      ++counts[static_cast<size_t>(best_rank)][static_cast<size_t>(s)];
      load[static_cast<size_t>(best_rank)] = best_load;
      memory[static_cast<size_t>(best_rank)] += shape.memory_bytes;
    }
  }

  // Batches: the least-cost split of each rank's units.
  Assignment assignment(static_cast<size_t>(D), std::vector<std::vector<int64_t>>(static_cast<size_t>(num_shapes)));
  for (int r = 0; r < D; ++r)
    for (int s = 0; s < num_shapes; ++s)
      assignment[static_cast<size_t>(r)][static_cast<size_t>(s)] =
          splitters[static_cast<size_t>(s)].split(counts[static_cast<size_t>(r)][static_cast<size_t>(s)]);
  return assignment;
}

}  // namespace dmuon::plan

// dmuon/plan/stage_windows.cpp — backward-order windows and their spreading (see stage_windows.h).
#include "plan/stage_windows.h"

#include <algorithm>

#include "plan/layer_spread.h"

namespace dmuon::plan {

std::vector<int> backward_stage_windows(const Problem& problem, int64_t stage_bytes) {
  const int D = problem.world_size();
  std::vector<int> window(problem.matrices.size(), 0);
  // From the last matrix down: a window closes at ≥ stage_bytes and ≥ D times its largest matrix.
  int id = 0;
  int64_t bytes = 0, largest = 0;
  for (size_t k = problem.matrices.size(); k-- > 0;) {
    window[k] = id;
    bytes += problem.matrices[k].wire_bytes;
    largest = std::max(largest, problem.matrices[k].wire_bytes);
    if (bytes >= stage_bytes && bytes >= D * largest) {
      ++id;
      bytes = 0;
      largest = 0;
    }
  }
  return window;
}

bool uses_backward_windows(const Problem& problem) { return problem.world_size() > 1 && !problem.has_homes(); }

void spread_backward_stages(const Problem& problem, int64_t stage_bytes, Plan& plan) {
  if (!uses_backward_windows(problem)) return;
  spread_layers(problem, backward_stage_windows(problem, stage_bytes), plan);
}

}  // namespace dmuon::plan

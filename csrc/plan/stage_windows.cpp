// dmuon/plan/stage_windows.cpp — backward-order windows and their spreading (see stage_windows.h).
#include "plan/stage_windows.h"

#include "plan/layer_spread.h"

namespace dmuon::plan {

std::vector<int> backward_stage_windows(const Problem& problem, int64_t stage_bytes) {
  const int D = problem.world_size();
  std::vector<int> window(problem.matrices.size(), 0);
  // From the last matrix down: a window closes at ≥ D matrices and ≥ stage_bytes.
  int id = 0;
  int64_t count = 0, bytes = 0;
  for (size_t k = problem.matrices.size(); k-- > 0;) {
    window[k] = id;
    ++count;
    bytes += problem.matrices[k].wire_bytes;
    if (count >= D && (stage_bytes <= 0 || bytes >= stage_bytes)) {
      ++id;
      count = 0;
      bytes = 0;
    }
  }
  return window;
}

void spread_backward_stages(const Problem& problem, int64_t stage_bytes, Plan& plan) {
  if (problem.world_size() <= 1) return;
  spread_layers(problem, backward_stage_windows(problem, stage_bytes), plan);
}

}  // namespace dmuon::plan

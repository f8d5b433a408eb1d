// dmuon/plan/stage_windows.cpp — backward-order windows and their spreading (see stage_windows.h).
#include "plan/stage_windows.h"

#include <algorithm>
#include <map>

#include "common/check.h"
#include "plan/layer_spread.h"

namespace dmuon::plan {

std::vector<int> backward_stage_windows(const Problem& problem, const std::vector<int>& group_of) {
  const size_t n = problem.matrices.size();
  DMUON_CHECK(group_of.empty() || group_of.size() == n, "backward_stage_windows: group_of has ", group_of.size(),
              " entries for ", n, " matrices");
  // Each matrix's group in hand-over order; none known: one group per matrix, the last first.
  std::vector<int> group(n);
  const bool known = std::any_of(group_of.begin(), group_of.end(), [](int g) { return g >= 0; });
  for (size_t k = 0; k < n; ++k) {
    DMUON_CHECK(group_of.empty() || group_of[k] >= -1, "backward_stage_windows: group_of[", k, "] is ", group_of[k],
                " (ids are >= 0, or -1 for none)");
    group[k] = known ? group_of[k] : static_cast<int>(n - 1 - k);
  }
  // Wire bytes and matrices per group, in hand-over order; matrices of no group after every group.
  std::map<int, int64_t> bytes_of, count_of;
  int64_t total = 0, grouped = 0;
  for (size_t k = 0; k < n; ++k) {
    if (group[k] < 0) continue;
    bytes_of[group[k]] += problem.matrices[k].wire_bytes;
    ++count_of[group[k]];
    total += problem.matrices[k].wire_bytes;
    ++grouped;
  }
  // Runs of whole groups: a window closes at a group's end once it holds half a mean group
  // and matrices_per_backward_window of them.
  const int64_t enough = bytes_of.empty() ? 1 : std::max<int64_t>(1, total / (2 * static_cast<int64_t>(bytes_of.size())));
  const int64_t per_window = matrices_per_backward_window(problem.world_size(), grouped);
  std::map<int, int> window_of_group;
  int id = 0;
  int64_t bytes = 0, matrices = 0;
  for (const auto& [g, b] : bytes_of) {
    window_of_group[g] = id;
    bytes += b;
    matrices += count_of[g];
    if (bytes >= enough && matrices >= per_window) {
      ++id;
      bytes = matrices = 0;
    }
  }
  // NOTE: matrices of no group take the window still open, or one after the last.
  std::vector<int> window(n);
  for (size_t k = 0; k < n; ++k) window[k] = group[k] >= 0 ? window_of_group[group[k]] : id;
  return window;
}

int64_t matrices_per_backward_window(int world_size, int64_t num_matrices) {
  return std::max<int64_t>(1, std::min<int64_t>(world_size, (num_matrices + 1) / 2));
}

bool uses_backward_windows(const Problem& problem) { return problem.world_size() > 1 && !problem.has_homes(); }

void spread_backward_stages(const Problem& problem, const std::vector<int>& group_of, Plan& plan) {
  if (!uses_backward_windows(problem)) return;
  spread_layers(problem, backward_stage_windows(problem, group_of), plan);
}

}  // namespace dmuon::plan

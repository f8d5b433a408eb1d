// dmuon/ns/batch_streams.cpp — longest-processing-time placement of shapes on streams.
#include "ns/batch_streams.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>

#include "common/check.h"

namespace dmuon::ns {

std::vector<int> assign_streams(const std::vector<StreamJob>& jobs, int num_streams) {
  DMUON_CHECK(num_streams >= 1, "assign_streams: num_streams must be at least 1, got ", num_streams);
  // Total cost per key, one slot a key in order of first appearance.
  std::map<int64_t, size_t> slot_of;
  std::vector<double> totals;
  for (size_t j = 0; j < jobs.size(); ++j) {
    const StreamJob& job = jobs[j];
    DMUON_CHECK(std::isfinite(job.cost) && job.cost >= 0.0, "assign_streams: job ", j, " has cost ", job.cost,
                "; costs must be finite and non-negative");
    auto [it, inserted] = slot_of.emplace(job.key, totals.size());
    if (inserted) totals.push_back(0.0);
    totals[it->second] += job.cost;
  }

  // Largest key first onto the least loaded stream.
  // NOTE: stable_sort keeps the first-seen order among equal totals (deterministic).
  std::vector<size_t> order(totals.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return totals[a] > totals[b]; });
  std::vector<double> load(static_cast<size_t>(num_streams), 0.0);
  std::vector<int> stream_of_slot(totals.size(), 0);
  for (size_t slot : order) {
    const auto least = std::min_element(load.begin(), load.end());  // NOTE: first of equal minima
    stream_of_slot[slot] = static_cast<int>(least - load.begin());
    *least += totals[slot];
  }

  std::vector<int> out;
  out.reserve(jobs.size());
  for (const StreamJob& job : jobs) out.push_back(stream_of_slot[slot_of.at(job.key)]);
  return out;
}

}  // namespace dmuon::ns

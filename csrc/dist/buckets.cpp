// dmuon/dist/buckets.cpp — round-robin interleaving of owners' lists into buckets.
#include "dist/buckets.h"

#include <algorithm>

#include "common/check.h"

namespace dmuon::dist {

std::vector<Bucket> make_buckets(const std::vector<std::vector<int>>& order_by_rank,
                                 const std::vector<int64_t>& wire_bytes, int64_t bucket_bytes) {
  std::vector<bool> seen(wire_bytes.size(), false);
  size_t longest = 0;
  for (const auto& order : order_by_rank) longest = std::max(longest, order.size());

  std::vector<Bucket> buckets;
  Bucket current;
  for (size_t round = 0; round < longest; ++round) {
    for (const auto& order : order_by_rank) {
      if (round >= order.size()) continue;
      const int idx = order[round];
      DMUON_CHECK(idx >= 0 && static_cast<size_t>(idx) < wire_bytes.size(),
                  "make_buckets: parameter index ", idx, " out of range");
      DMUON_CHECK(!seen[static_cast<size_t>(idx)], "make_buckets: parameter ", idx,
                  " is listed twice");
      seen[static_cast<size_t>(idx)] = true;
      current.param_idx.push_back(idx);
      current.wire_bytes += wire_bytes[static_cast<size_t>(idx)];
      if (bucket_bytes > 0 && current.wire_bytes >= bucket_bytes) {
        buckets.push_back(std::move(current));
        current = Bucket{};
      }
    }
  }
  if (!current.param_idx.empty()) buckets.push_back(std::move(current));
  for (size_t i = 0; i < seen.size(); ++i)
    DMUON_CHECK(seen[i], "make_buckets: parameter ", i, " has no owner");
  return buckets;
}

std::vector<std::vector<int>> split_near_equal(const std::vector<int64_t>& counts, int64_t capacity) {
  DMUON_CHECK(capacity >= 1, "split_near_equal: capacity must be at least 1, got ", capacity);
  int64_t total = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    DMUON_CHECK(counts[i] >= 1, "split_near_equal: item ", i, " holds ", counts[i], " matrices");
    total += counts[i];
  }
  std::vector<std::vector<int>> runs;
  if (counts.empty()) return runs;
  const int64_t num_runs = (total + capacity - 1) / capacity;
  const int64_t per_run = (total + num_runs - 1) / num_runs;
  int64_t in_run = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (runs.empty() || (in_run > 0 && in_run + counts[i] > per_run)) {
      runs.emplace_back();
      in_run = 0;
    }
    runs.back().push_back(static_cast<int>(i));
    in_run += counts[i];
  }
  return runs;
}

}  // namespace dmuon::dist

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

}  // namespace dmuon::dist

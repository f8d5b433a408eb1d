// dmuon/dist/buckets.h — the step's pipeline units: consecutive groups of parameters,
// interleaved across owners so that every owner has work in every bucket.
#pragma once

#include <cstdint>
#include <vector>

namespace dmuon::dist {

/// Parameters (indices) whose communication and Newton–Schulz form one pipeline stage.
struct Bucket {
  std::vector<int> param_idx;
  int64_t wire_bytes = 0;
};

/// Splits the owners' execution lists into buckets of about `bucket_bytes` wire bytes.
/// order_by_rank[r] lists rank r's parameters in execution order. Round i takes each
/// rank's i-th parameter (ranks in ascending order); a bucket closes once it holds at
/// least `bucket_bytes` (≤ 0: a single bucket). Every rank computes the same buckets.
std::vector<Bucket> make_buckets(const std::vector<std::vector<int>>& order_by_rank,
                                 const std::vector<int64_t>& wire_bytes, int64_t bucket_bytes);

}  // namespace dmuon::dist

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

/// One device's batches of same-shape matrices: consecutive runs of items (item i holds
/// counts[i] ≥ 1 matrices) as few as `capacity` matrices per run allows, of near-equal
/// size: a run closes before it would pass ⌈total / ⌈total / capacity⌉⌉ matrices, so
/// same-count items give runs of at most two sizes (one NS problem, one CUDA graph, one
/// workspace each). An item larger than the capacity is a run of its own. Returns the
/// runs as item indices, in order.
std::vector<std::vector<int>> split_near_equal(const std::vector<int64_t>& counts, int64_t capacity);

}  // namespace dmuon::dist

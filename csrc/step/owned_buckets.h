// dmuon/step/owned_buckets.h — the gradient buckets of the weight-ownership mode, planned
// once as data.
//
// Every owned matrix lives whole on one owner rank. In backward each rank adds its whole
// local gradients into compact per-bucket buffers; a complete bucket is reduced to the
// owners with all_to_all (bandwidth-optimal when the bucket's owners are balanced, as the
// planner's layer spreading makes them) and each owner sums the pieces it received.
//
// The ranks form a (replicate × shard) mesh (a flat group is one row). The reduction has
// two levels: inside each row to the rank whose shard coordinate is the owner's, then
// down its column to the owner, so each byte crosses the replica (inter-node) links once.
// A bucket's buffer is therefore ordered by (owner's shard coordinate, owner's replica
// coordinate, gradient order): every level's send pieces are contiguous, nothing is packed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace dmuon::step {

/// The ranks of the weight-ownership mode as a (replicate × shard) mesh: world rank r sits
/// at position shard_of[r] of row replica_of[r]. A flat group is one row (replicas = 1).
struct OwnershipMesh {
  int shards = 1;    ///< S: ranks in a row (a shard group, e.g. the GPUs of a node)
  int replicas = 1;  ///< R: rows (replica groups, e.g. nodes)
  std::vector<int> shard_of, replica_of;  ///< [world rank] its coordinates

  /// One row of `world_size` ranks.
  static OwnershipMesh flat(int world_size);
  int world_size() const { return shards * replicas; }
  /// Throws dmuon::Error unless every (replica, shard) holds exactly one rank.
  void validate() const;
};

/// One gradient bucket: which parameters, where each sits in the buffer, the element counts
/// of both reduction levels and where each parameter lands on its owner.
struct OwnedBucket {
  std::vector<int> params;      ///< buffer order
  std::vector<int64_t> offset;  ///< element offset of params[k] in the buffer
  int64_t numel = 0;            ///< buffer elements
  std::vector<int64_t> shard_counts;                 ///< [S] elements whose owner has shard coordinate s
  std::vector<std::vector<int64_t>> replica_counts;  ///< [S][R] of those, whose owner has replica coordinate r
  std::vector<int64_t> final_offset;                 ///< [k] offset of params[k] in its owner's reduced piece

  /// Start of shard chunk s in the buffer.
  int64_t shard_begin(int s) const;
};

/// Buckets over `order` (parameter indices in the expected gradient order, each once):
/// consecutive runs of about `bucket_bytes` (≤ 0: one bucket; at least one parameter each).
/// numel[i] elements of parameter i, owners[i] its world rank in `mesh`. Throws dmuon::Error
/// naming the argument on inconsistent input.
std::vector<OwnedBucket> plan_owned_buckets(const std::vector<int>& order, const std::vector<int64_t>& numel,
                                            const std::vector<int>& owners, const OwnershipMesh& mesh,
                                            int64_t bucket_bytes, int64_t element_size);

}  // namespace dmuon::step

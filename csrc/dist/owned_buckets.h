// dmuon/dist/owned_buckets.h — gradient buckets of the weight-ownership mode.
//
// Every owned matrix lives whole on one owner rank. In backward, each rank's full local
// gradients are copied into compact per-bucket buffers; a complete bucket is reduced to the
// owners with all_to_all (bandwidth-optimal when the bucket's owners are balanced, as the
// planner's layer spreading makes them) and the owner sums the pieces it received.
//
// Ranks form a grid rank = replica · S + shard (a 2-D mesh: replicate × shard; a flat group
// is R = 1, S = D). The reduction is two-level: first inside the shard group (to the rank
// whose shard coordinate is the owner's), then across replicas (to the owner), so each byte
// crosses the replica (inter-node) links once. A bucket's buffer is therefore ordered by
// (owner's shard coordinate, owner's replica coordinate, gradient order): every level's
// send pieces are contiguous and nothing is packed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace dmuon::dist {

/// The rank grid of a (replicate × shard) mesh; a flat group has replicas = 1.
struct RankGrid {
  int shards = 1;    ///< S: ranks in a shard group (GPUs of a node)
  int replicas = 1;  ///< R: shard groups (nodes)
  int world() const { return shards * replicas; }
  int shard_of(int rank) const { return rank % shards; }
  int replica_of(int rank) const { return rank / shards; }
};

/// One gradient bucket: which matrices, where each sits in the buffer, and the split
/// sizes (elements) of both reduction levels.
struct OwnedBucket {
  std::vector<int> param_idx;        ///< buffer order
  std::vector<int64_t> offset;       ///< element offset of each param_idx entry
  int64_t numel = 0;                 ///< buffer elements
  std::vector<int64_t> shard_split;  ///< [S] elements whose owner has shard coordinate s
  /// [S][R] elements, inside shard chunk s, whose owner has replica coordinate r.
  std::vector<std::vector<int64_t>> replica_split;

  /// Start of shard chunk s in the buffer.
  int64_t shard_begin(int s) const;
  /// Offset of param_idx[k] inside its owner's final (fully reduced) piece.
  int64_t final_offset(size_t k, const RankGrid& grid, const std::vector<int>& owner) const;
};

/// Buckets over `order` (matrix indices in the expected gradient order, each once):
/// consecutive runs of about `bucket_bytes` (≤ 0: one bucket; always ≥ 1 matrix each).
/// numel[i] elements of matrix i, owner[i] its rank in `grid`. Throws dmuon::Error naming
/// the argument on inconsistent input.
std::vector<OwnedBucket> make_owned_buckets(const std::vector<int>& order,
                                            const std::vector<int64_t>& numel,
                                            const std::vector<int>& owner, const RankGrid& grid,
                                            int64_t bucket_bytes, int64_t element_size);

}  // namespace dmuon::dist

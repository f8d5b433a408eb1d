// dmuon/step/owned_buckets.cpp — the ownership mode's mesh and its bucket layout.
#include "step/owned_buckets.h"

#include <algorithm>
#include <numeric>

#include "common/check.h"

namespace dmuon::step {

OwnershipMesh OwnershipMesh::flat(int world_size) {
  DMUON_CHECK(world_size >= 1, "OwnershipMesh: world size must be >= 1, got ", world_size);
  OwnershipMesh mesh;
  mesh.shards = world_size;
  for (int r = 0; r < world_size; ++r) {
    mesh.shard_of.push_back(r);
    mesh.replica_of.push_back(0);
  }
  return mesh;
}

void OwnershipMesh::validate() const {
  DMUON_CHECK(shards >= 1 && replicas >= 1, "OwnershipMesh: the mesh must be at least 1×1, got ", replicas, "×", shards);
  const size_t world = static_cast<size_t>(world_size());
  DMUON_CHECK(shard_of.size() == world && replica_of.size() == world, "OwnershipMesh: ", shard_of.size(),
              " shard and ", replica_of.size(), " replica coordinates for a ", replicas, "×", shards, " mesh");
  std::vector<bool> taken(world, false);
  for (size_t r = 0; r < world; ++r) {
    const int s = shard_of[r], q = replica_of[r];
    DMUON_CHECK(s >= 0 && s < shards && q >= 0 && q < replicas, "OwnershipMesh: rank ", r, " at (", q, ", ", s,
                "), outside a ", replicas, "×", shards, " mesh");
    const size_t at = static_cast<size_t>(q * shards + s);
    DMUON_CHECK(!taken[at], "OwnershipMesh: two ranks at (", q, ", ", s, ")");
    taken[at] = true;
  }
}

int64_t OwnedBucket::shard_begin(int s) const {
  return std::accumulate(shard_counts.begin(), shard_counts.begin() + s, int64_t{0});
}

std::vector<OwnedBucket> plan_owned_buckets(const std::vector<int>& order, const std::vector<int64_t>& numel,
                                            const std::vector<int>& owners, const OwnershipMesh& mesh,
                                            int64_t bucket_bytes, int64_t element_size) {
  mesh.validate();
  DMUON_CHECK(numel.size() == owners.size(), "plan_owned_buckets: numel has ", numel.size(),
              " entries but owners has ", owners.size());
  DMUON_CHECK(element_size > 0, "plan_owned_buckets: element_size must be > 0, got ", element_size);
  std::vector<bool> seen(owners.size(), false);
  for (int idx : order) {
    DMUON_CHECK(idx >= 0 && static_cast<size_t>(idx) < owners.size(), "plan_owned_buckets: order holds ", idx,
                ", outside [0, ", owners.size(), ")");
    const size_t i = static_cast<size_t>(idx);
    DMUON_CHECK(!seen[i], "plan_owned_buckets: order lists parameter ", idx, " twice");
    seen[i] = true;
    DMUON_CHECK(owners[i] >= 0 && owners[i] < mesh.world_size(), "plan_owned_buckets: the owner of parameter ", idx,
                " is ", owners[i], ", outside the ", mesh.world_size(), " ranks");
    DMUON_CHECK(numel[i] >= 0, "plan_owned_buckets: numel of parameter ", idx, " is negative");
  }

  // Consecutive runs of the gradient order.
  std::vector<std::vector<int>> runs;
  int64_t run_bytes = 0;
  for (int idx : order) {
    if (runs.empty() || (bucket_bytes > 0 && run_bytes >= bucket_bytes)) {
      runs.emplace_back();
      run_bytes = 0;
    }
    runs.back().push_back(idx);
    run_bytes += numel[static_cast<size_t>(idx)] * element_size;
  }

  // Inside a run: ordered by (owner's shard, owner's replica, gradient order).
  const auto shard = [&](int idx) { return mesh.shard_of[static_cast<size_t>(owners[static_cast<size_t>(idx)])]; };
  const auto replica = [&](int idx) { return mesh.replica_of[static_cast<size_t>(owners[static_cast<size_t>(idx)])]; };
  std::vector<OwnedBucket> buckets;
  for (const auto& run : runs) {
    OwnedBucket bucket;
    bucket.params = run;
    std::stable_sort(bucket.params.begin(), bucket.params.end(), [&](int a, int b) {
      return shard(a) != shard(b) ? shard(a) < shard(b) : replica(a) < replica(b);
    });
    bucket.shard_counts.assign(static_cast<size_t>(mesh.shards), 0);
    bucket.replica_counts.assign(static_cast<size_t>(mesh.shards),
                                 std::vector<int64_t>(static_cast<size_t>(mesh.replicas), 0));
    for (int idx : bucket.params) {
      const int64_t n = numel[static_cast<size_t>(idx)];
      bucket.offset.push_back(bucket.numel);
      bucket.numel += n;
      bucket.shard_counts[static_cast<size_t>(shard(idx))] += n;
      bucket.replica_counts[static_cast<size_t>(shard(idx))][static_cast<size_t>(replica(idx))] += n;
    }
    // Where each lands: its offset less the start of its owner's piece (shard chunk, then replica part).
    for (size_t k = 0; k < bucket.params.size(); ++k) {
      const int s = shard(bucket.params[k]), r = replica(bucket.params[k]);
      const auto& counts = bucket.replica_counts[static_cast<size_t>(s)];
      const int64_t piece_begin = bucket.shard_begin(s) + std::accumulate(counts.begin(), counts.begin() + r, int64_t{0});
      bucket.final_offset.push_back(bucket.offset[k] - piece_begin);
    }
    buckets.push_back(std::move(bucket));
  }
  return buckets;
}

}  // namespace dmuon::step

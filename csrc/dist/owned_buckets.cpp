// dmuon/dist/owned_buckets.cpp — bucket layout of the weight-ownership mode.
#include "dist/owned_buckets.h"

#include <algorithm>
#include <numeric>

#include "common/check.h"

namespace dmuon::dist {

int64_t OwnedBucket::shard_begin(int s) const {
  return std::accumulate(shard_split.begin(), shard_split.begin() + s, int64_t{0});
}

int64_t OwnedBucket::final_offset(size_t k, const RankGrid& grid, const std::vector<int>& owner) const {
  const int o = owner[static_cast<size_t>(param_idx[k])];
  const int s = grid.shard_of(o), r = grid.replica_of(o);
  const auto& splits = replica_split[static_cast<size_t>(s)];
  const int64_t piece_begin = shard_begin(s) + std::accumulate(splits.begin(), splits.begin() + r, int64_t{0});
  return offset[k] - piece_begin;
}

std::vector<OwnedBucket> make_owned_buckets(const std::vector<int>& order,
                                            const std::vector<int64_t>& numel,
                                            const std::vector<int>& owner, const RankGrid& grid,
                                            int64_t bucket_bytes, int64_t element_size) {
  DMUON_CHECK(grid.shards >= 1 && grid.replicas >= 1, "make_owned_buckets: grid must be at least 1×1, got ",
              grid.replicas, "×", grid.shards);
  DMUON_CHECK(numel.size() == owner.size(), "make_owned_buckets: numel has ", numel.size(),
              " entries but owner has ", owner.size());
  DMUON_CHECK(element_size > 0, "make_owned_buckets: element_size must be > 0, got ", element_size);
  std::vector<bool> seen(owner.size(), false);
  for (int idx : order) {
    DMUON_CHECK(idx >= 0 && static_cast<size_t>(idx) < owner.size(), "make_owned_buckets: order holds ",
                idx, ", outside [0, ", owner.size(), ")");
    DMUON_CHECK(!seen[static_cast<size_t>(idx)], "make_owned_buckets: order lists matrix ", idx, " twice");
    seen[static_cast<size_t>(idx)] = true;
    DMUON_CHECK(owner[static_cast<size_t>(idx)] >= 0 && owner[static_cast<size_t>(idx)] < grid.world(),
                "make_owned_buckets: owner of matrix ", idx, " is ", owner[static_cast<size_t>(idx)],
                ", outside the ", grid.world(), " ranks");
    DMUON_CHECK(numel[static_cast<size_t>(idx)] >= 0, "make_owned_buckets: numel of matrix ", idx, " is negative");
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

  // Inside a run: order by (owner's shard, owner's replica, gradient order).
  std::vector<OwnedBucket> buckets;
  for (const auto& run : runs) {
    OwnedBucket bucket;
    bucket.param_idx = run;
    std::stable_sort(bucket.param_idx.begin(), bucket.param_idx.end(), [&](int a, int b) {
      const int oa = owner[static_cast<size_t>(a)], ob = owner[static_cast<size_t>(b)];
      if (grid.shard_of(oa) != grid.shard_of(ob)) return grid.shard_of(oa) < grid.shard_of(ob);
      return grid.replica_of(oa) < grid.replica_of(ob);
    });
    bucket.shard_split.assign(static_cast<size_t>(grid.shards), 0);
    bucket.replica_split.assign(static_cast<size_t>(grid.shards),
                                std::vector<int64_t>(static_cast<size_t>(grid.replicas), 0));
    for (int idx : bucket.param_idx) {
      const int o = owner[static_cast<size_t>(idx)];
      bucket.offset.push_back(bucket.numel);
      bucket.numel += numel[static_cast<size_t>(idx)];
      bucket.shard_split[static_cast<size_t>(grid.shard_of(o))] += numel[static_cast<size_t>(idx)];
      bucket.replica_split[static_cast<size_t>(grid.shard_of(o))][static_cast<size_t>(grid.replica_of(o))] +=
          numel[static_cast<size_t>(idx)];
    }
    buckets.push_back(std::move(bucket));
  }
  return buckets;
}

}  // namespace dmuon::dist

// dmuon/ns/cuda/sm90_sym_scheduler.cuh — the sm_90a symmetric kernel's tile scheduler:
// which unit of work each CTA (mc2: each cluster) takes next. The work list is (lower-
// triangle tile, batch index) — a 128×256 unit, or a pair of units in 2-CTA clusters
// (sm90_sym_units.h, sm90_sym_pairs.h) — strided over the persistent CTAs; with the tail
// split-K, the units of the partial last wave are cut into k-slices (choose_tail_split on
// the host, decode_work on the device; docs/design/sm90_sym_kernel.md, "Tail split-K").
#pragma once

#include <algorithm>
#include <cstdint>

#include "ns/cuda/sm90_sym_traits.cuh"
#include "ns/cuda/sm90_sym_units.h"

namespace dmuon::ns::cuda::sm90 {

using namespace cute;

// Lower-triangle tile t → (row tile i, col tile j), i ≥ j, t = i(i+1)/2 + j.
__device__ __forceinline__ void decode_triangle(int64_t t, int& i, int& j) {
  int r = static_cast<int>((sqrt(8.0 * static_cast<double>(t) + 1.0) - 1.0) * 0.5);
  while (static_cast<int64_t>(r) * (r + 1) / 2 > t) --r;
  while (static_cast<int64_t>(r + 1) * (r + 2) / 2 <= t) ++r;
  i = r;
  j = static_cast<int>(t - static_cast<int64_t>(r) * (r + 1) / 2);
}

// One unit of a CTA's work: a tile (matrix l, row tile ti, col tile tj) over k-tiles
// [k_begin, k_end). mc2: `kind` is the pair kind and `writes` false where this CTA only
// shadows its peer's tile. Split-K: `slot` (tail tile) and `part` (its slice), −1 for a whole tile.
struct WorkUnit {
  int l, ti, tj;
  int k_begin, k_end;
  int slot, part;
  PairKind kind;
  bool writes;
};

// Work item w of this CTA → its unit (mc2: w is a pair-list unit).
template <class T>
__device__ __forceinline__ WorkUnit decode_work(const typename T::Params& p, int64_t w, int num_k_tiles) {
  WorkUnit u{0, 0, 0, 0, num_k_tiles, -1, -1, PairKind::kSeparate, true};
  // NOTE: slices of balanced length (the split never exceeds num_k_tiles / 4).
  auto slice = [&](int64_t v) {
    u.part = static_cast<int>(v % p.split);
    u.k_begin = static_cast<int>(static_cast<int64_t>(u.part) * num_k_tiles / p.split);
    u.k_end = static_cast<int>(static_cast<int64_t>(u.part + 1) * num_k_tiles / p.split);
    return v / p.split;
  };
  if constexpr (T::kCluster > 1) {
    const int rank = static_cast<int>(cute::block_rank_in_cluster());
    int64_t pair = w;
    if (w >= p.num_full) {
      // Split-K tail: slice `part` of both tiles of a tail pair, the same slice in both CTAs
      // (same k-tiles: I1), the shared panel still multicast; tile r of tail pair q has slot
      // 2q + r (a shadow pair's rank 1 writes nothing and never counts).
      const int64_t q = slice(w - p.num_full);
      pair = p.num_full + q;
      u.slot = static_cast<int>(2 * q + rank);
    }
    // NOTE: with 128×256 units, u.tj is the column block (as in the 1-CTA decode below).
    const PairTile t = T::kColTiles == 2 ? decode_wide_pair(p.pairs, pair, rank) : decode_pair(p.pairs, pair, rank);
    u.l = t.l;
    u.ti = t.ti;
    u.tj = t.tj;
    u.kind = t.kind;
    u.writes = t.writes;
  } else {
    int64_t tile = w;
    if (w >= p.num_full) {
      u.slot = static_cast<int>(slice(w - p.num_full));
      tile = p.num_full + u.slot;
    }
    u.l = static_cast<int>(tile / p.num_tri);
    if constexpr (T::kColTiles == 2) {
      decode_wide(tile % p.num_tri, u.ti, u.tj);  // NOTE: u.tj is the column block
    } else {
      decode_triangle(tile % p.num_tri, u.ti, u.tj);
    }
  }
  return u;
}

// Split-K shape of a launch: slices of at least kMinSliceKTiles k-tiles, at most kMaxSplit
// slices a tile.
// NOTE: the last slice reads the other split − 1 partial tiles (64 KiB each) from L2 on one
// SM while every slice's mainloop shrinks as 1/split; for 3584×18944 (296 k-tiles, 10 tail
// tiles on 132 SMs) an estimate (not a measurement) puts the smallest sum of both near 12
// slices, hence the cap of 16.
constexpr int kMinSliceKTiles = 4;
constexpr int kMaxSplit = 16;

// The split of `tail` units of which `wave` run at once: as many slices as fit in one round
// (tail·split ≤ wave), at most kMaxSplit, slices of at least kMinSliceKTiles k-tiles.
// NOTE: one round only. Several rounds of slices, where they would cut the tail's time on
// paper (39 pairs of 128×256 units on 66 clusters, 3584 × 18944 b1: 3 slices in 2 rounds,
// 0.67 of a unit against 1.0 whole), ran slower than no split (0.5222 against 0.4697 ms; H200):
// under the power limit a partly idle last wave runs
// faster clocks, so its idle part costs less than its share of the time.
inline int64_t choose_tail_split(int64_t tail, int64_t wave, int num_k_tiles) {
  return std::max<int64_t>(std::min<int64_t>({wave / tail, num_k_tiles / kMinSliceKTiles, kMaxSplit}), 1);
}

}  // namespace dmuon::ns::cuda::sm90

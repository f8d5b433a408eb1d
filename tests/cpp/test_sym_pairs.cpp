// The pair list of the sm_90a kernel's 2-CTA cluster variant (csrc/ns/cuda/sm90_sym_pairs.h):
// every lower-triangle tile of every matrix is written by exactly one CTA, the two tiles of
// a unit share the panel its kind names, and both CTAs of a unit agree on that panel.
#include <gtest/gtest.h>

#include <map>
#include <tuple>

#include "ns/cuda/sm90_sym_pairs.h"

namespace {

using dmuon::ns::cuda::decode_pair;
using dmuon::ns::cuda::make_pair_list;
using dmuon::ns::cuda::PairKind;

TEST(SymPairs, EveryTileWrittenOnceAndPanelsShared) {
  for (int r = 1; r <= 41; ++r) {
    for (int batch = 1; batch <= 5; ++batch) {
      const auto list = make_pair_list(r, batch);
      std::map<std::tuple<int, int, int>, int> writes;  // (l, i, j) → writes
      int shadows = 0;
      for (int64_t u = 0; u < list.num_units; ++u) {
        const auto t0 = decode_pair(list, u, 0), t1 = decode_pair(list, u, 1);
        ASSERT_EQ(t0.kind, t1.kind) << "r=" << r << " u=" << u;
        for (const auto& t : {t0, t1}) {
          ASSERT_TRUE(t.l >= 0 && t.l < batch && t.tj >= 0 && t.tj <= t.ti && t.ti < r)
              << "r=" << r << " batch=" << batch << " u=" << u << " tile (" << t.ti << ", " << t.tj << ", " << t.l << ")";
          if (t.writes) ++writes[{t.l, t.ti, t.tj}];
        }
        switch (t0.kind) {
          case PairKind::kShareB:  // same matrix, same column panel, two different tiles
            EXPECT_TRUE(t0.l == t1.l && t0.tj == t1.tj && t0.ti != t1.ti) << "r=" << r << " u=" << u;
            break;
          case PairKind::kShareA:  // same matrix, same row panel
            EXPECT_TRUE(t0.l == t1.l && t0.ti == t1.ti && t0.tj != t1.tj) << "r=" << r << " u=" << u;
            break;
          case PairKind::kSeparate:
            EXPECT_NE(t0.l, t1.l);
            break;
          case PairKind::kShadow:  // the same tile; rank 1 computes it and writes nothing
            EXPECT_TRUE(t0.l == t1.l && t0.ti == t1.ti && t0.tj == t1.tj && t0.writes && !t1.writes);
            ++shadows;
            break;
        }
      }
      EXPECT_EQ(writes.size(), static_cast<size_t>(batch) * r * (r + 1) / 2) << "r=" << r << " batch=" << batch;
      for (const auto& [tile, n] : writes) EXPECT_EQ(n, 1) << "r=" << r << " batch=" << batch;
      EXPECT_LE(shadows, 1);
      // NOTE: units that share nothing are the lone tiles only: at most ceil(batch/2).
      EXPECT_EQ(2 * list.num_units, static_cast<int64_t>(batch) * r * (r + 1) / 2 + (batch * r * (r + 1) / 2) % 2)
          << "r=" << r << " batch=" << batch;
    }
  }
}

}  // namespace

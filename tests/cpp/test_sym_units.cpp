// The 128×256 work units of the sm_90a kernel's "n256" variant (csrc/ns/cuda/sm90_sym_units.h):
// every lower-triangle tile of a matrix is in exactly one unit, units come row by row, and
// the only tiles a unit holds but does not write lie above the diagonal or outside the matrix.
#include <gtest/gtest.h>

#include <map>
#include <tuple>
#include <utility>

#include "ns/cuda/sm90_sym_units.h"

namespace {

using dmuon::ns::cuda::decode_wide;
using dmuon::ns::cuda::wide_units;

TEST(SymUnits, EveryLowerTileInExactlyOneUnit) {
  for (int r = 1; r <= 300; ++r) {
    std::map<std::pair<int, int>, int> writes;  // (i, j) → units holding it on or below the diagonal
    int prev_i = 0, prev_b = -1;
    for (int64_t u = 0; u < wide_units(r); ++u) {
      int i = -1, b = -1;
      decode_wide(u, i, b);
      ASSERT_TRUE(i >= 0 && i < r && b >= 0 && 2 * b <= i) << "r=" << r << " u=" << u << " (" << i << ", " << b << ")";
      // Row by row, column blocks in order.
      ASSERT_TRUE((i == prev_i && b == prev_b + 1) || (i == prev_i + 1 && b == 0)) << "r=" << r << " u=" << u;
      prev_i = i, prev_b = b;
      for (int j : {2 * b, 2 * b + 1})
        if (j <= i) ++writes[{i, j}];
    }
    EXPECT_EQ(prev_i, r - 1) << "r=" << r << ": the last unit is not in the last row";
    EXPECT_EQ(static_cast<int64_t>(writes.size()), static_cast<int64_t>(r) * (r + 1) / 2) << "r=" << r;
    for (const auto& [tile, count] : writes) EXPECT_EQ(count, 1) << "r=" << r << " tile " << tile.first << "," << tile.second;
  }
}

TEST(SymUnits, LargeIndicesDecodeExactly) {
  // NOTE: near perfect squares the double square root may round either way; the decode
  // corrects it. Unit u must be unit b of row i, and rows 0..i−1 hold wide_units(i) units.
  for (int64_t s : {int64_t{46340}, int64_t{1} << 20, int64_t{3037000}}) {
    for (int64_t u : {s * s - 1, s * s, s * s + s - 1, s * s + s, (s + 1) * (s + 1) - 1}) {
      int i = -1, b = -1;
      decode_wide(u, i, b);
      EXPECT_TRUE(b >= 0 && 2 * b <= i) << "u=" << u << " → (" << i << ", " << b << ")";
      EXPECT_EQ(wide_units(i) + b, u) << "u=" << u << " → (" << i << ", " << b << ")";
    }
  }
}

// The wide pair list (mc2-n256): every unit of every matrix in exactly one pair slot, written
// by exactly one CTA; the two units of a pair share the panel their kind names.
TEST(SymUnits, WidePairsCoverEveryUnitOnceAndShareWhatTheySay) {
  using dmuon::ns::cuda::decode_wide_pair;
  using dmuon::ns::cuda::make_wide_pair_list;
  using dmuon::ns::cuda::PairKind;
  for (int r = 1; r <= 40; ++r) {
    for (int batch : {1, 2, 3, 7}) {
      const auto list = make_wide_pair_list(r, batch);
      std::map<std::tuple<int, int, int>, int> writes;  // (l, i, b) → writing CTAs
      int64_t shadows = 0;
      for (int64_t u = 0; u < list.num_units; ++u) {
        const auto t0 = decode_wide_pair(list, u, 0), t1 = decode_wide_pair(list, u, 1);
        for (const auto& t : {t0, t1}) {
          ASSERT_TRUE(t.l >= 0 && t.l < batch && t.ti >= 0 && t.ti < r && t.tj >= 0 && 2 * t.tj <= t.ti)
              << "r=" << r << " batch=" << batch << " u=" << u << " (" << t.l << ", " << t.ti << ", " << t.tj << ")";
          if (t.writes) ++writes[{t.l, t.ti, t.tj}];
        }
        ASSERT_EQ(t0.kind, t1.kind) << "r=" << r << " u=" << u;
        switch (t0.kind) {
          case PairKind::kShareB:  // one B panel: the same matrix and column block
            EXPECT_TRUE(t0.l == t1.l && t0.tj == t1.tj && t0.ti != t1.ti) << "r=" << r << " u=" << u;
            break;
          case PairKind::kShareA:  // one A panel: the same matrix and row
            EXPECT_TRUE(t0.l == t1.l && t0.ti == t1.ti && t0.tj != t1.tj) << "r=" << r << " u=" << u;
            break;
          case PairKind::kSeparate:
            EXPECT_NE(t0.l, t1.l) << "r=" << r << " u=" << u;
            break;
          case PairKind::kShadow:  // both CTAs on one unit, rank 1 writes nothing
            EXPECT_TRUE(t0.l == t1.l && t0.ti == t1.ti && t0.tj == t1.tj && t0.writes && !t1.writes)
                << "r=" << r << " u=" << u;
            ++shadows;
            break;
        }
      }
      EXPECT_LE(shadows, 1) << "r=" << r << " batch=" << batch;
      EXPECT_EQ(static_cast<int64_t>(writes.size()), wide_units(r) * batch) << "r=" << r << " batch=" << batch;
      for (const auto& [unit, count] : writes) EXPECT_EQ(count, 1) << "r=" << r << " batch=" << batch;
      // Pairs: the units two at a time, plus at most one shadowed unit.
      EXPECT_EQ(2 * list.num_units - shadows, wide_units(r) * batch) << "r=" << r << " batch=" << batch;
    }
  }
}

}  // namespace

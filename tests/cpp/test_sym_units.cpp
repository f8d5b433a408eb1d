// The 128×256 work units of the sm_90a kernel's "n256" variant (csrc/ns/cuda/sm90_sym_units.h):
// every lower-triangle tile of a matrix is in exactly one unit, units come row by row, and
// the only tiles a unit holds but does not write lie above the diagonal or outside the matrix.
#include <gtest/gtest.h>

#include <map>
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

}  // namespace

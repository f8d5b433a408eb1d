// The portable symmetric product's plan (csrc/ns/cuda/tri_plan.h): its row panels and the
// mirror's upper-tile grid, run on the CPU in fp64 against the whole product.
#include "ns/cuda/tri_plan.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <set>
#include <utility>
#include <vector>

namespace dmuon::ns::cuda {
namespace {

// The mirror's tile edge (elementwise.cu's kTile).
constexpr int64_t kMirrorTile = 32;

// D = α·A·Bᵀ + β·C as tri_sym_product runs it: each panel's GEMM (fp64, k in order), then the
// mirror over the upper tiles enumerated by upper_tile. D starts as NaN: nothing unwritten hides.
std::vector<double> tri_product(const std::vector<double>& a, const std::vector<double>& b,
                                const std::vector<double>& c, int64_t m, int64_t k, double alpha, double beta,
                                int64_t block) {
  std::vector<double> d(static_cast<size_t>(m * m), std::numeric_limits<double>::quiet_NaN());
  for (const TriPanel& p : tri_panels(m, block))
    for (int64_t r = p.row0; r < p.row0 + p.rows; ++r)
      for (int64_t col = 0; col < p.cols; ++col) {
        double acc = 0.0;
        for (int64_t e = 0; e < k; ++e) acc += a[static_cast<size_t>(r * k + e)] * b[static_cast<size_t>(col * k + e)];
        d[static_cast<size_t>(r * m + col)] = alpha * acc + beta * c[static_cast<size_t>(r * m + col)];
      }
  const int64_t tiles = (m + kMirrorTile - 1) / kMirrorTile;
  for (int64_t index = 0; index < num_upper_tiles(tiles); ++index) {
    int64_t tr = 0, tc = 0;
    upper_tile(index, &tr, &tc);
    for (int64_t i = 0; i < kMirrorTile; ++i)
      for (int64_t j = 0; j < kMirrorTile; ++j) {
        const int64_t r = tr * kMirrorTile + i, col = tc * kMirrorTile + j;
        if (r < m && col < m && r < col) d[static_cast<size_t>(r * m + col)] = d[static_cast<size_t>(col * m + r)];
      }
  }
  return d;
}

TEST(TriPlan, PanelsCoverTheLowerTriangleOnceAndStayInside) {
  for (int64_t m : {1, 127, 128, 129, 255, 256, 1001, 4095, 4097}) {
    for (int64_t block : {128, 256, 384, 1024, 4096}) {
      std::vector<int> writes(static_cast<size_t>(m * m), 0);
      int64_t next_row = 0;
      for (const TriPanel& p : tri_panels(m, block)) {
        ASSERT_EQ(p.row0, next_row) << "m=" << m << " block=" << block;
        ASSERT_EQ(p.row0 % kTriBlockQuantum, 0);
        ASSERT_TRUE(p.rows >= 1 && p.rows <= block && p.cols == p.row0 + p.rows && p.cols <= m);
        next_row += p.rows;
        for (int64_t r = p.row0; r < p.row0 + p.rows; ++r)
          for (int64_t c = 0; c < p.cols; ++c) ++writes[static_cast<size_t>(r * m + c)];
      }
      ASSERT_EQ(next_row, m);
      for (int64_t r = 0; r < m; ++r)
        for (int64_t c = 0; c <= r; ++c) ASSERT_EQ(writes[static_cast<size_t>(r * m + c)], 1) << r << "," << c;
      // Above the diagonal only the diagonal blocks' upper parts are computed.
      int64_t extra = 0;
      for (int64_t r = 0; r < m; ++r)
        for (int64_t c = r + 1; c < m; ++c) extra += writes[static_cast<size_t>(r * m + c)];
      int64_t diagonal_upper = 0;
      for (const TriPanel& p : tri_panels(m, block)) diagonal_upper += p.rows * (p.rows - 1) / 2;
      EXPECT_EQ(extra, diagonal_upper);
      EXPECT_NEAR(tri_work_fraction(m, block),
                  static_cast<double>(m * (m + 1) / 2 + diagonal_upper) / static_cast<double>(m * m), 1e-12);
    }
  }
  // k equal panels perform (k + 1) / (2k) of the dense FLOPs.
  EXPECT_DOUBLE_EQ(tri_work_fraction(4096, 1024), 5.0 / 8.0);
  EXPECT_DOUBLE_EQ(tri_work_fraction(4096, 512), 9.0 / 16.0);
  EXPECT_DOUBLE_EQ(tri_work_fraction(1000, 1024), 1.0);
}

TEST(TriPlan, TheMirrorGridVisitsEveryUpperTileOnce) {
  for (int64_t tiles : {1, 2, 3, 31, 32, 129, 593}) {
    std::set<std::pair<int64_t, int64_t>> seen;
    for (int64_t index = 0; index < num_upper_tiles(tiles); ++index) {
      int64_t tr = -1, tc = -1;
      upper_tile(index, &tr, &tc);
      ASSERT_TRUE(tr >= 0 && tr <= tc && tc < tiles) << "tiles=" << tiles << " index=" << index;
      ASSERT_EQ(tc * (tc + 1) / 2 + tr, index);
      seen.insert({tr, tc});
    }
    EXPECT_EQ(static_cast<int64_t>(seen.size()), tiles * (tiles + 1) / 2);
  }
  // The square root's estimate is corrected at the ends of columns far beyond any grid.
  for (int64_t tc : {int64_t{1} << 20, int64_t{1} << 30}) {
    for (int64_t tr : {int64_t{0}, tc}) {
      int64_t r = -1, c = -1;
      upper_tile(tc * (tc + 1) / 2 + tr, &r, &c);
      EXPECT_EQ(r, tr);
      EXPECT_EQ(c, tc);
    }
  }
}

TEST(TriPlan, PanelsThenMirrorEqualTheWholeProductInFp64) {
  std::mt19937 rng(7);
  std::normal_distribution<double> normal(0.0, 1.0);
  for (auto [m, k] : {std::pair<int64_t, int64_t>{127, 31}, {300, 17}, {513, 9}}) {
    std::vector<double> a(static_cast<size_t>(m * k)), b(a.size()), c(static_cast<size_t>(m * m));
    for (double& v : a) v = normal(rng);
    for (double& v : b) v = normal(rng);
    for (int64_t r = 0; r < m; ++r)
      for (int64_t col = 0; col <= r; ++col)
        c[static_cast<size_t>(r * m + col)] = c[static_cast<size_t>(col * m + r)] = normal(rng);
    // B = A: the exact product is symmetric; D must equal it bitwise (same sums in the same order).
    const double alpha = 0.75, beta = -0.5;
    for (int64_t block : {128, 256, 512}) {
      const std::vector<double> d = tri_product(a, a, c, m, k, alpha, beta, block);
      for (int64_t r = 0; r < m; ++r)
        for (int64_t col = 0; col < m; ++col) {
          double acc = 0.0;
          for (int64_t e = 0; e < k; ++e)
            acc += a[static_cast<size_t>(r * k + e)] * a[static_cast<size_t>(col * k + e)];
          ASSERT_EQ(d[static_cast<size_t>(r * m + col)], alpha * acc + beta * c[static_cast<size_t>(r * m + col)])
              << "m=" << m << " block=" << block << " at " << r << "," << col;
        }
    }
    // B ≠ A: the result is the lower triangle's product, mirrored: exactly symmetric.
    const std::vector<double> d = tri_product(a, b, c, m, k, alpha, beta, 128);
    for (int64_t r = 0; r < m; ++r)
      for (int64_t col = 0; col < r; ++col)
        ASSERT_EQ(d[static_cast<size_t>(col * m + r)], d[static_cast<size_t>(r * m + col)]);
  }
}

TEST(TriPlan, NamesCandidatesAndDefaults) {
  EXPECT_EQ(tri_name(384), "tri:384");
  EXPECT_EQ(parse_tri("tri:384"), 384);
  for (const char* bad : {"tri:", "tri:100", "tri:0", "tri:-128", "tri:12x", "lt:0", "tri:1280000000000"})
    EXPECT_EQ(parse_tri(bad), -1) << bad;
  EXPECT_TRUE(tri_block_candidates(255).empty());
  EXPECT_EQ(tri_block_candidates(256), (std::vector<int64_t>{128}));
  EXPECT_EQ(tri_block_candidates(4096), (std::vector<int64_t>{2048, 1408, 1024, 768, 512, 384, 256}));
  for (int64_t m : {256, 896, 1536, 3584, 4097, 18944}) {
    const std::vector<int64_t> blocks = tri_block_candidates(m);
    ASSERT_FALSE(blocks.empty()) << m;
    for (size_t i = 0; i < blocks.size(); ++i) {
      EXPECT_EQ(parse_tri(tri_name(blocks[i])), blocks[i]);
      EXPECT_LT(blocks[i], m);
      if (i > 0) {
        EXPECT_LT(blocks[i], blocks[i - 1]) << m;
      }
    }
  }
  EXPECT_EQ(tri_default_block(100), 128);
  EXPECT_EQ(tri_default_block(4096), 1024);
  EXPECT_THROW(tri_panels(100, 100), std::exception);
  EXPECT_THROW(tri_panels(0, 128), std::exception);
}

}  // namespace
}  // namespace dmuon::ns::cuda

// The portable symmetric products' plans (csrc/ns/cuda/tri_plan.h): the row panels, the lower
// blocks' pointer offsets and the mirror's upper-tile grid, run on the CPU in fp64 against the
// whole product.
#include "ns/cuda/tri_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
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

// Fraction of the dense product's multiply-adds the row panels perform.
double tri_work_fraction(int64_t m, int64_t block) {
  double work = 0.0;
  for (const TriPanel& p : tri_panels(m, block)) work += static_cast<double>(p.rows) * static_cast<double>(p.cols);
  return work / (static_cast<double>(m) * static_cast<double>(m));
}

// Fraction of the dense product's multiply-adds the lower-block product performs.
double block_work_fraction(int64_t m, int64_t block) {
  const BlockPlan plan = block_plan(m, block);
  const double blocks = static_cast<double>(plan.num_blocks) * static_cast<double>(block * block);
  const double rest = static_cast<double>(plan.remainder.rows) * static_cast<double>(plan.remainder.cols);
  return (blocks + rest) / (static_cast<double>(m) * static_cast<double>(m));
}

// One GEMM of a plan in fp64 (k in order): D[d0 + r·ldd + col] = α·Σ A[a0 + r·k + e]·B[b0 + col·k + e]
// + β·C[c0 + r·m + col] for rows × cols (A, B: leading dimension k; C, D: m).
void gemm_at(const std::vector<double>& a, const std::vector<double>& b, const std::vector<double>& c,
             std::vector<double>* d, int64_t m, int64_t k, double alpha, double beta, int64_t rows, int64_t cols,
             BlockOffsets o) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t col = 0; col < cols; ++col) {
      double acc = 0.0;
      for (int64_t e = 0; e < k; ++e)
        acc += a[static_cast<size_t>(o.a + r * k + e)] * b[static_cast<size_t>(o.b + col * k + e)];
      (*d)[static_cast<size_t>(o.d + r * m + col)] = alpha * acc + beta * c[static_cast<size_t>(o.c + r * m + col)];
    }
}

// The mirror (elementwise.cu) over the upper tiles enumerated by upper_tile, one m×m matrix at `d0`.
void mirror(std::vector<double>* d, int64_t m, int64_t d0) {
  const int64_t tiles = (m + kMirrorTile - 1) / kMirrorTile;
  for (int64_t index = 0; index < num_upper_tiles(tiles); ++index) {
    int64_t tr = 0, tc = 0;
    upper_tile(index, &tr, &tc);
    for (int64_t i = 0; i < kMirrorTile; ++i)
      for (int64_t j = 0; j < kMirrorTile; ++j) {
        const int64_t r = tr * kMirrorTile + i, col = tc * kMirrorTile + j;
        if (r < m && col < m && r < col)
          (*d)[static_cast<size_t>(d0 + r * m + col)] = (*d)[static_cast<size_t>(d0 + col * m + r)];
      }
  }
}

// D = α·A·Bᵀ + β·C as tri_sym_product runs it: each panel's GEMM, then the mirror. D starts as
// NaN: nothing unwritten hides.
std::vector<double> tri_product(const std::vector<double>& a, const std::vector<double>& b,
                                const std::vector<double>& c, int64_t m, int64_t k, double alpha, double beta,
                                int64_t block) {
  std::vector<double> d(static_cast<size_t>(m * m), std::numeric_limits<double>::quiet_NaN());
  for (const TriPanel& p : tri_panels(m, block))
    gemm_at(a, b, c, &d, m, k, alpha, beta, p.rows, p.cols, {p.row0 * k, 0, p.row0 * m, p.row0 * m});
  mirror(&d, m, 0);
  return d;
}

// The same product of a batch of `batch` matrices (packed, A and B m×k, C and D m×m) as
// block_sym_product runs it: every pointer of the lower-block GEMM at block_offsets, the
// remainder panel of each matrix, then the mirror.
std::vector<double> block_product(const std::vector<double>& a, const std::vector<double>& b,
                                  const std::vector<double>& c, int64_t batch, int64_t m, int64_t k, double alpha,
                                  double beta, int64_t block) {
  std::vector<double> d(static_cast<size_t>(batch * m * m), std::numeric_limits<double>::quiet_NaN());
  const BlockPlan plan = block_plan(m, block);
  const BlockStrides s{block, std::max<int64_t>(plan.num_blocks, 1), k, m * k, k, m * k, m, m * m, m, m * m};
  for (int64_t index = 0; index < batch * plan.num_blocks; ++index)
    gemm_at(a, b, c, &d, m, k, alpha, beta, block, block, block_offsets(s, index));
  const TriPanel& p = plan.remainder;
  for (int64_t matrix = 0; matrix < batch && p.rows > 0; ++matrix) {
    const int64_t ab0 = matrix * m * k, cd0 = matrix * m * m;
    gemm_at(a, b, c, &d, m, k, alpha, beta, p.rows, p.cols, {ab0 + p.row0 * k, ab0, cd0 + p.row0 * m, cd0 + p.row0 * m});
  }
  for (int64_t matrix = 0; matrix < batch; ++matrix) mirror(&d, m, matrix * m * m);
  return d;
}

// Normal random values, and a C that is symmetric (matrix by matrix) as the NS step's are.
std::vector<double> random_values(size_t n, std::mt19937* rng) {
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<double> v(n);
  for (double& x : v) x = normal(*rng);
  return v;
}
std::vector<double> symmetric_c(int64_t batch, int64_t m, std::mt19937* rng) {
  std::vector<double> c = random_values(static_cast<size_t>(batch * m * m), rng);
  for (int64_t matrix = 0; matrix < batch; ++matrix)
    for (int64_t r = 0; r < m; ++r)
      for (int64_t col = 0; col < r; ++col)
        c[static_cast<size_t>(matrix * m * m + col * m + r)] = c[static_cast<size_t>(matrix * m * m + r * m + col)];
  return c;
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
  for (auto [m, k] : {std::pair<int64_t, int64_t>{127, 31}, {300, 17}, {513, 9}}) {
    const std::vector<double> a = random_values(static_cast<size_t>(m * k), &rng);
    const std::vector<double> b = random_values(a.size(), &rng);
    const std::vector<double> c = symmetric_c(1, m, &rng);
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

TEST(TriPlan, BlocksAndTheRemainderCoverTheLowerTriangleOnce) {
  for (int64_t m : {1, 127, 128, 129, 255, 256, 1001, 4095, 4097}) {
    for (int64_t block : {128, 256, 384, 1024, 4096}) {
      const BlockPlan plan = block_plan(m, block);
      ASSERT_EQ(plan.num_block_rows, m / block);
      ASSERT_EQ(plan.num_blocks, plan.num_block_rows * (plan.num_block_rows + 1) / 2);
      ASSERT_EQ(plan.remainder.row0, plan.num_block_rows * block);
      ASSERT_EQ(plan.remainder.rows, m - plan.remainder.row0);
      ASSERT_EQ(plan.remainder.cols, plan.remainder.rows > 0 ? m : 0);
      // Two matrices with padded rows (ld = m + 8), so that offsets into the second one count.
      const int64_t ld = m + 8, stride = m * ld;
      const BlockStrides s{block, std::max<int64_t>(plan.num_blocks, 1), ld, stride, ld, stride, ld, stride, ld, stride};
      std::vector<int> writes(static_cast<size_t>(2 * stride), 0);
      for (int64_t index = 0; index < 2 * plan.num_blocks; ++index) {
        const BlockOffsets o = block_offsets(s, index);
        // A's rows and C's and D's block start on the same row; B's rows are the block's columns.
        ASSERT_EQ(o.a, o.d - o.d % ld);
        ASSERT_EQ(o.c, o.d);
        ASSERT_EQ(o.b / stride, o.d / stride);
        ASSERT_EQ((o.b % stride) / ld, (o.d % stride) % ld);
        for (int64_t r = 0; r < block; ++r)
          for (int64_t col = 0; col < block; ++col) ++writes[static_cast<size_t>(o.d + r * ld + col)];
      }
      for (int64_t matrix = 0; matrix < 2; ++matrix)
        for (int64_t r = plan.remainder.row0; r < m; ++r)
          for (int64_t col = 0; col < plan.remainder.cols; ++col) ++writes[static_cast<size_t>(matrix * stride + r * ld + col)];
      int64_t extra = 0;
      for (int64_t matrix = 0; matrix < 2; ++matrix)
        for (int64_t r = 0; r < ld && r < m; ++r)
          for (int64_t col = 0; col < ld; ++col) {
            const int w = writes[static_cast<size_t>(matrix * stride + r * ld + col)];
            if (col >= m) {
              ASSERT_EQ(w, 0) << "padding written: m=" << m << " block=" << block;
            } else if (col <= r) {
              ASSERT_EQ(w, 1) << "m=" << m << " block=" << block << " at " << r << "," << col;
            } else {
              ASSERT_LE(w, 1);
              // Above the diagonal only inside the diagonal blocks (the remainder's included).
              if (w == 1) ASSERT_EQ(std::min(r / block, plan.num_block_rows), std::min(col / block, plan.num_block_rows));
              extra += w;
            }
          }
      const int64_t rest = plan.remainder.rows;
      EXPECT_EQ(extra, 2 * (plan.num_block_rows * block * (block - 1) / 2 + rest * (rest - 1) / 2));
      EXPECT_NEAR(block_work_fraction(m, block),
                  static_cast<double>(m * (m + 1) / 2 + extra / 2) / static_cast<double>(m * m), 1e-12);
    }
  }
  // F full block rows perform (F + 1) / (2F) of the dense FLOPs.
  EXPECT_DOUBLE_EQ(block_work_fraction(4096, 128), 33.0 / 64.0);
  EXPECT_DOUBLE_EQ(block_work_fraction(1000, 1024), 1.0);
  EXPECT_THROW(block_plan(100, 100), std::exception);
  EXPECT_THROW(block_plan(0, 128), std::exception);
}

TEST(TriPlan, LowerBlocksThenMirrorEqualTheWholeProductInFp64) {
  std::mt19937 rng(11);
  for (auto [m, k] : {std::pair<int64_t, int64_t>{127, 7}, {300, 5}, {513, 3}}) {
    const int64_t batch = 3;
    const std::vector<double> a = random_values(static_cast<size_t>(batch * m * k), &rng);
    const std::vector<double> b = random_values(a.size(), &rng);
    const std::vector<double> c = symmetric_c(batch, m, &rng);
    const double alpha = 0.75, beta = -0.5;
    for (int64_t block : {128, 256, 384}) {
      // B = A: D equals the whole product bitwise (same sums in the same order).
      const std::vector<double> d = block_product(a, a, c, batch, m, k, alpha, beta, block);
      for (int64_t matrix = 0; matrix < batch; ++matrix)
        for (int64_t r = 0; r < m; ++r)
          for (int64_t col = 0; col < m; ++col) {
            double acc = 0.0;
            for (int64_t e = 0; e < k; ++e)
              acc += a[static_cast<size_t>((matrix * m + r) * k + e)] * a[static_cast<size_t>((matrix * m + col) * k + e)];
            const size_t at = static_cast<size_t>((matrix * m + r) * m + col);
            ASSERT_EQ(d[at], alpha * acc + beta * c[at]) << "m=" << m << " block=" << block << " matrix " << matrix
                                                         << " at " << r << "," << col;
          }
      // B ≠ A: the lower triangle's product, mirrored: exactly symmetric.
      const std::vector<double> e = block_product(a, b, c, batch, m, k, alpha, beta, block);
      for (int64_t matrix = 0; matrix < batch; ++matrix)
        for (int64_t r = 0; r < m; ++r)
          for (int64_t col = 0; col < r; ++col)
            ASSERT_EQ(e[static_cast<size_t>((matrix * m + col) * m + r)], e[static_cast<size_t>((matrix * m + r) * m + col)]);
    }
  }
}

TEST(TriPlan, BlockNamesCandidatesAndPointerAlignment) {
  EXPECT_EQ(blk_name(256), "blk:256");
  EXPECT_EQ(parse_blk("blk:256"), 256);
  EXPECT_EQ(parse_tri("blk:256"), -1);
  EXPECT_EQ(parse_blk("tri:256"), -1);
  for (const char* bad : {"blk:", "blk:100", "blk:0", "blk:-128", "blk:12x", "blk:1280000000000"})
    EXPECT_EQ(parse_blk(bad), -1) << bad;
  EXPECT_TRUE(blk_block_candidates(255).empty());
  EXPECT_EQ(blk_block_candidates(256), (std::vector<int64_t>{128}));
  EXPECT_EQ(blk_block_candidates(1001), (std::vector<int64_t>{128, 256, 384}));
  EXPECT_EQ(blk_block_candidates(4096), (std::vector<int64_t>{128, 256, 384, 512}));
  EXPECT_EQ(blk_default_block(511), 128);
  EXPECT_EQ(blk_default_block(512), 256);
  // The alignment every pointer of the arrays has: the lowest of the bases' and the batch
  // strides' (in bytes), at most 256 (block offsets are multiples of 256 bytes).
  EXPECT_EQ(common_alignment({}), 256);
  EXPECT_EQ(common_alignment({0, 4096, 1 << 20}), 256);
  EXPECT_EQ(common_alignment({4096, 2 * 127 * 1008}), 32);
  EXPECT_EQ(common_alignment({4096, 2 * 3 * 5001}), 2);
  EXPECT_EQ(common_alignment({0x7f0000000010}), 16);
}

}  // namespace
}  // namespace dmuon::ns::cuda

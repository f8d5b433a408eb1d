// NorMuon's row normalization (optim/normuon.h): a hand-computed case, the invariants
// (‖Ô‖_F = ‖O‖_F, rows divided by √v + ε), both orientations, refused non-finite input.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "common/check.h"
#include "optim/normuon.h"

namespace {

using dmuon::optim::MatrixRef;
using dmuon::optim::normuon_matrix;
using dmuon::optim::NormuonRule;

// O = [[3, 4], [0, 1]], v = 0, β₂ = 0.5: v = (6.25, 0.25), Ô = [[1.2, 1.6], [0, 2]],
// ‖O‖² = 26, ‖Ô‖² = 8, so the result is Ô·√(26/8).
TEST(Normuon, HandComputedCase) {
  std::vector<double> o = {3, 4, 0, 1};
  std::vector<float> v = {0, 0};
  NormuonRule rule{true, 0.5, 1e-12};
  ASSERT_TRUE(normuon_matrix(o.data(), MatrixRef{2, 2, 2, false}, v.data(), rule));
  EXPECT_FLOAT_EQ(v[0], 6.25f);
  EXPECT_FLOAT_EQ(v[1], 0.25f);
  const double keep = std::sqrt(26.0 / 8.0);
  const std::vector<double> expect = {1.2 * keep, 1.6 * keep, 0.0, 2.0 * keep};
  for (size_t k = 0; k < o.size(); ++k) EXPECT_NEAR(o[k], expect[k], 1e-9) << k;
}

// A random tall matrix, stored both ways: the same result, its norm kept, each row's
// ratio to the input the same up to the common factor.
TEST(Normuon, InvariantsAndOrientation) {
  const int64_t rows = 7, cols = 5;
  std::mt19937 gen(3);
  std::normal_distribution<double> normal;
  std::vector<double> o(rows * cols), t(rows * cols);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) t[j * rows + i] = o[i * cols + j] = normal(gen);
  const std::vector<double> before = o;
  std::vector<float> v(rows), vt(rows);
  for (int64_t i = 0; i < rows; ++i) vt[i] = v[i] = static_cast<float>(0.1 * (i + 1));
  const NormuonRule rule{true, 0.9, 1e-8};
  ASSERT_TRUE(normuon_matrix(o.data(), MatrixRef{rows, cols, cols, false}, v.data(), rule));
  ASSERT_TRUE(normuon_matrix(t.data(), MatrixRef{rows, cols, rows, true}, vt.data(), rule));
  double n0 = 0, n1 = 0;
  for (int64_t i = 0; i < rows; ++i) {
    double row_sq = 0;
    for (int64_t j = 0; j < cols; ++j) row_sq += before[i * cols + j] * before[i * cols + j];
    const float expect_v = static_cast<float>(0.9 * static_cast<double>(0.1f * (i + 1)) + 0.1 * row_sq / cols);
    EXPECT_FLOAT_EQ(v[i], expect_v) << i;
    EXPECT_EQ(v[i], vt[i]);
    for (int64_t j = 0; j < cols; ++j) {
      EXPECT_DOUBLE_EQ(o[i * cols + j], t[j * rows + i]);
      n0 += before[i * cols + j] * before[i * cols + j];
      n1 += o[i * cols + j] * o[i * cols + j];
    }
  }
  EXPECT_NEAR(std::sqrt(n1), std::sqrt(n0), 1e-12 * std::sqrt(n0));
  // Row i was scaled by keep / (√v_i + ε): the ratio of two rows' scales is fixed by v.
  const double s0 = o[0] / before[0], s3 = o[3 * cols] / before[3 * cols];
  EXPECT_NEAR(s0 / s3, (std::sqrt(double{v[3]}) + 1e-8) / (std::sqrt(double{v[0]}) + 1e-8), 1e-12);
}

// A non-finite O changes neither O nor v; a zero O stays zero (v decays).
TEST(Normuon, NonFiniteAndZero) {
  std::vector<float> o = {1, NAN, 2, 3};
  std::vector<float> v = {0.5f, 0.5f};
  EXPECT_FALSE(normuon_matrix(o.data(), MatrixRef{2, 2, 2, false}, v.data(), NormuonRule{true, 0.5, 1e-8}));
  EXPECT_EQ(v[0], 0.5f);
  EXPECT_EQ(o[0], 1.0f);
  std::vector<float> z(4, 0.0f);
  EXPECT_TRUE(normuon_matrix(z.data(), MatrixRef{2, 2, 2, false}, v.data(), NormuonRule{true, 0.5, 1e-8}));
  for (float x : z) EXPECT_EQ(x, 0.0f);
  EXPECT_EQ(v[0], 0.25f);
}

TEST(Normuon, BadOptionsNamed) {
  auto message = [](NormuonRule r) {
    try {
      r.validate();
    } catch (const dmuon::Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message(NormuonRule{true, 1.0, 1e-8}).find("normuon_beta2"), std::string::npos);
  EXPECT_NE(message(NormuonRule{true, -0.1, 1e-8}).find("normuon_beta2"), std::string::npos);
  EXPECT_NE(message(NormuonRule{true, 0.95, 0.0}).find("normuon_eps"), std::string::npos);
  EXPECT_EQ(message(NormuonRule{true, 0.95, 1e-8}), "");
}

}  // namespace

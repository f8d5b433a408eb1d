// The packed CPU GEMM against a naive triple loop, including edge tiles, K blocking,
// transposed B, β·C, and the lower-only symmetric mode.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "ns/cpu/cpu_gemm.h"

namespace {

struct GemmCase {
  int64_t m, n, k;
  bool transpose_b;
  bool lower_only;
};

class CpuGemm : public ::testing::TestWithParam<GemmCase> {};

TEST_P(CpuGemm, MatchesNaive) {
  const auto p = GetParam();
  std::mt19937_64 rng(1234 + p.m * 7 + p.n * 13 + p.k);
  std::uniform_real_distribution<double> uniform(-1.0, 1.0);
  std::vector<double> a(static_cast<size_t>(p.m * p.k));
  std::vector<double> b(static_cast<size_t>(p.k * p.n));
  std::vector<double> c(static_cast<size_t>(p.m * p.n));
  for (auto* vec : {&a, &b, &c})
    for (auto& x : *vec) x = uniform(rng);
  if (p.lower_only) {
    // Symmetric product A·Aᵀ + β·C with symmetric C.
    b = a;
    for (int64_t i = 0; i < p.m; ++i)
      for (int64_t j = 0; j < i; ++j) c[static_cast<size_t>(j * p.m + i)] = c[static_cast<size_t>(i * p.m + j)];
  }
  const double alpha = 0.75, beta = -1.5;
  std::vector<double> d(static_cast<size_t>(p.m * p.n), 12345.0);  // poisoned
  const int64_t ldb = p.transpose_b ? p.k : p.n;
  dmuon::ns::cpu::gemm<double>(p.transpose_b, p.m, p.n, p.k, alpha, a.data(), p.k, b.data(), ldb,
                               beta, c.data(), p.n, d.data(), p.n, p.lower_only);
  for (int64_t i = 0; i < p.m; ++i) {
    for (int64_t j = 0; j < p.n; ++j) {
      double acc = 0.0;
      for (int64_t q = 0; q < p.k; ++q) {
        const double bv = p.transpose_b ? b[static_cast<size_t>(j * p.k + q)]
                                        : b[static_cast<size_t>(q * p.n + j)];
        acc += a[static_cast<size_t>(i * p.k + q)] * bv;
      }
      const double expected = alpha * acc + beta * c[static_cast<size_t>(i * p.n + j)];
      ASSERT_NEAR(d[static_cast<size_t>(i * p.n + j)], expected, 1e-10) << i << "," << j;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CpuGemm,
    ::testing::Values(GemmCase{1, 1, 1, false, false}, GemmCase{5, 7, 3, false, false},
                      GemmCase{33, 17, 300, false, false}, GemmCase{130, 1030, 9, false, false},
                      GemmCase{21, 40, 513, true, false}, GemmCase{1, 64, 5, true, false},
                      GemmCase{37, 37, 300, true, true}, GemmCase{129, 129, 64, true, true},
                      GemmCase{3, 3, 1000, true, true}));

TEST(CpuGemmFloat, SymmetricResultIsExactlySymmetric) {
  const int64_t m = 45, k = 70;
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> a(static_cast<size_t>(m * k));
  for (auto& x : a) x = uniform(rng);
  std::vector<float> d(static_cast<size_t>(m * m), -1.0f);
  dmuon::ns::cpu::gemm<float>(true, m, m, k, 1.0f, a.data(), k, a.data(), k, 0.0f, nullptr, 0,
                              d.data(), m, true);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < m; ++j)
      ASSERT_EQ(d[static_cast<size_t>(i * m + j)], d[static_cast<size_t>(j * m + i)]);
}

}  // namespace

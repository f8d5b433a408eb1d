// Newton–Schulz on the CPU core against exact fp64 oracles built from a known SVD:
//  - the schedule's own output U·f(Σ/‖Σ‖_F)·Vᵀ (what NS computes in exact arithmetic),
//  - the polar factor U·Vᵀ (what NS approximates),
// over random, ill-conditioned, low-rank and decaying spectra, wide and tall shapes.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

#include "common/check.h"
#include "ns/cpu/cpu_backend.h"
#include "ns/schedule.h"
#include "spectral_fixtures.h"

namespace {

using dmuon::ns::Algorithm;
using dmuon::testing::Dense;
using dmuon::testing::KnownSvd;

enum class Spectrum { kRandom, kIllConditioned, kLowRank, kDecaying };

const char* spectrum_name(Spectrum s) {
  switch (s) {
    case Spectrum::kRandom: return "random";
    case Spectrum::kIllConditioned: return "ill_conditioned";
    case Spectrum::kLowRank: return "low_rank";
    case Spectrum::kDecaying: return "decaying";
  }
  return "?";
}

// Singular values of each kind, largest first.
std::vector<double> make_spectrum(Spectrum kind, int64_t k, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> uniform(0.2, 1.0);
  std::vector<double> s(static_cast<size_t>(k));
  for (int64_t i = 0; i < k; ++i) {
    const double t = k == 1 ? 0.0 : static_cast<double>(i) / static_cast<double>(k - 1);
    switch (kind) {
      case Spectrum::kRandom: s[static_cast<size_t>(i)] = uniform(rng); break;
      case Spectrum::kIllConditioned: s[static_cast<size_t>(i)] = std::pow(1e-4, t); break;
      case Spectrum::kLowRank: s[static_cast<size_t>(i)] = i < std::max<int64_t>(1, k / 4) ? uniform(rng) : 0.0; break;
      case Spectrum::kDecaying: s[static_cast<size_t>(i)] = 1.0 / ((i + 1.0) * (i + 1.0)); break;
    }
  }
  return s;
}

struct NsCase {
  Algorithm algorithm;
  int64_t rows, cols;
  Spectrum spectrum;
};

std::string case_name(const ::testing::TestParamInfo<NsCase>& info) {
  const auto& p = info.param;
  return std::string(dmuon::ns::algorithm_name(p.algorithm)) + "_" + std::to_string(p.rows) +
         "x" + std::to_string(p.cols) + "_" + spectrum_name(p.spectrum);
}

template <typename T>
std::vector<T> to_vector(const Dense& d) {
  return std::vector<T>(d.v.begin(), d.v.end());
}

void PrintTo(const NsCase& c, std::ostream* os) {
  *os << dmuon::ns::algorithm_name(c.algorithm) << " " << c.rows << "x" << c.cols << " "
      << spectrum_name(c.spectrum);
}

const std::vector<std::pair<int64_t, int64_t>> kShapes = {
    {32, 48}, {48, 32}, {40, 40}, {5, 7}, {1, 64}, {64, 1}, {3, 100}, {127, 301}};

std::vector<NsCase> all_cases(std::vector<Spectrum> spectra) {
  std::vector<NsCase> cases;
  for (Algorithm a : {Algorithm::kStandard, Algorithm::kGram})
    for (auto [r, c] : kShapes)
      for (Spectrum s : spectra) cases.push_back({a, r, c, s});
  return cases;
}

class NsCpu : public ::testing::TestWithParam<NsCase> {};
class NsCpuPolar : public ::testing::TestWithParam<NsCase> {};

// fp64 core equals the exact polynomial map; fp32 core stays close to it.
TEST_P(NsCpu, MatchesExactScheduleOutput) {
  const auto p = GetParam();
  std::mt19937_64 rng(99 + p.rows * 31 + p.cols);
  const KnownSvd svd = dmuon::testing::make_known_svd(
      p.rows, p.cols, make_spectrum(p.spectrum, std::min(p.rows, p.cols), rng), rng);
  const auto schedule = dmuon::ns::default_schedule(p.algorithm, 5, 1e-7);
  const double fro = svd.frobenius();
  const Dense expected = svd.reconstruct(
      [&](double s) { return dmuon::ns::apply_to_singular_value(schedule, s / fro); });

  auto x64 = to_vector<double>(svd.matrix());
  dmuon::ns::orthogonalize_cpu<double>(schedule, x64.data(), 1, p.rows, p.cols);
  EXPECT_LT(dmuon::testing::relative_error(x64, expected), 1e-9);

  auto x32 = to_vector<float>(svd.matrix());
  dmuon::ns::orthogonalize_cpu<float>(schedule, x32.data(), 1, p.rows, p.cols);
  for (float v : x32) ASSERT_TRUE(std::isfinite(v));
  // NOTE: fp32 rounding (~6e-8) is amplified by the steep early polynomials (slope
  // ≈ 8 at 0 for Polar Express, five times over); the largest error seen over these
  // cases was 1.2e-4 (gram, 127x301, decaying), so 5e-4 leaves a 4x margin.
  EXPECT_LT(dmuon::testing::relative_error(x32, expected), 5e-4);
}

// The output approximates the polar factor wherever the spectrum is resolvable.
TEST_P(NsCpuPolar, ApproximatesPolarFactor) {
  const auto p = GetParam();
  std::mt19937_64 rng(7 + p.rows + p.cols);
  const KnownSvd svd = dmuon::testing::make_known_svd(
      p.rows, p.cols, make_spectrum(p.spectrum, std::min(p.rows, p.cols), rng), rng);
  const Dense polar = svd.reconstruct([](double s) { return s > 0 ? 1.0 : 0.0; });
  auto x32 = to_vector<float>(svd.matrix());
  const auto schedule = dmuon::ns::default_schedule(p.algorithm, 5, 1e-7);
  dmuon::ns::orthogonalize_cpu<float>(schedule, x32.data(), 1, p.rows, p.cols);
  // Normalized singular values here are ≥ 0.2/√k; both schedules map them into
  // [0.68, 1.21] (Keller Jordan) or [0.74, 1.13] (Polar Express), so the distance to
  // U·Vᵀ is at most about 0.32 relative.
  EXPECT_LT(dmuon::testing::relative_error(x32, polar), 0.32);
}

INSTANTIATE_TEST_SUITE_P(Shapes, NsCpu,
                         ::testing::ValuesIn(all_cases({Spectrum::kRandom, Spectrum::kIllConditioned,
                                                        Spectrum::kLowRank, Spectrum::kDecaying})),
                         case_name);
INSTANTIATE_TEST_SUITE_P(Shapes, NsCpuPolar, ::testing::ValuesIn(all_cases({Spectrum::kRandom})),
                         case_name);

// A batch gives exactly what the matrices give one at a time.
TEST(NsCpuBatch, BatchedEqualsLooped) {
  for (Algorithm algorithm : {Algorithm::kStandard, Algorithm::kGram}) {
    const int64_t batch = 4, rows = 24, cols = 17;
    std::mt19937_64 rng(5);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> data(static_cast<size_t>(batch * rows * cols));
    for (auto& x : data) x = normal(rng);
    auto looped = data;
    const auto schedule = dmuon::ns::default_schedule(algorithm, 5, 1e-7);
    dmuon::ns::orthogonalize_cpu<float>(schedule, data.data(), batch, rows, cols);
    for (int64_t b = 0; b < batch; ++b)
      dmuon::ns::orthogonalize_cpu<float>(schedule, looped.data() + b * rows * cols, 1, rows, cols);
    EXPECT_EQ(data, looped);
  }
}

// Gram NS with restarts stays finite on exactly rank-1 and all-zero inputs.
TEST(NsCpuGram, LowRankAndZeroStayFinite) {
  const auto schedule = dmuon::ns::default_schedule(Algorithm::kGram, 5, 1e-7);
  const int64_t rows = 64, cols = 96;
  std::vector<float> rank_one(static_cast<size_t>(rows * cols));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j)
      rank_one[static_cast<size_t>(i * cols + j)] = std::sin(0.3f * i + 1.0f) * std::cos(0.7f * j);
  dmuon::ns::orthogonalize_cpu<float>(schedule, rank_one.data(), 1, rows, cols);
  for (float v : rank_one) ASSERT_TRUE(std::isfinite(v));
  std::vector<float> zeros(static_cast<size_t>(rows * cols), 0.0f);
  dmuon::ns::orthogonalize_cpu<float>(schedule, zeros.data(), 1, rows, cols);
  for (float v : zeros) ASSERT_EQ(v, 0.0f);
}

// Non-finite input is reported with its batch index and nothing is overwritten.
TEST(NsCpuErrors, NonFiniteInputIsReportedBeforeWriting) {
  const auto schedule = dmuon::ns::default_schedule(Algorithm::kGram, 5, 1e-7);
  std::vector<float> data(2 * 4 * 4, 0.5f);
  data[20] = std::numeric_limits<float>::quiet_NaN();
  const auto before = data;
  try {
    dmuon::ns::orthogonalize_cpu<float>(schedule, data.data(), 2, 4, 4);
    FAIL();
  } catch (const dmuon::Error& e) {
    EXPECT_NE(std::string(e.what()).find("input 1"), std::string::npos) << e.what();
  }
  for (size_t i = 0; i < data.size(); ++i) {
    if (i == 20) continue;
    EXPECT_EQ(data[i], before[i]);
  }
  EXPECT_THROW(dmuon::ns::orthogonalize_cpu<float>(schedule, data.data(), 1, 0, 4), dmuon::Error);
}

}  // namespace

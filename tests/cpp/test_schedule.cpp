// Coefficient schedules: published values, safety scaling, validation messages.
#include <gtest/gtest.h>

#include <cmath>

#include "common/check.h"
#include "ns/schedule.h"

namespace {

using dmuon::ns::Algorithm;

TEST(Schedule, PolarExpressSafetyScaling) {
  const auto steps = dmuon::ns::polar_express_coefficients(5, 1.05);
  ASSERT_EQ(steps.size(), 5u);
  EXPECT_NEAR(steps[0].a, 8.28721 / 1.05, 1e-12);
  EXPECT_NEAR(steps[0].b, -23.59589 / std::pow(1.05, 3), 1e-12);
  EXPECT_NEAR(steps[0].c, 17.30039 / std::pow(1.05, 5), 1e-12);
  EXPECT_NEAR(steps[4].a, 2.30065 / 1.05, 1e-12);
  // Longer schedules repeat the last published step.
  const auto seven = dmuon::ns::polar_express_coefficients(7);
  EXPECT_DOUBLE_EQ(seven[6].a, seven[4].a);
}

TEST(Schedule, DefaultsPerAlgorithm) {
  const auto gram = dmuon::ns::default_schedule(Algorithm::kGram, 5, 1e-7);
  EXPECT_EQ(gram.restart_after, std::vector<int>{2});
  const auto standard = dmuon::ns::default_schedule(Algorithm::kStandard, 5, 1e-7);
  EXPECT_TRUE(standard.restart_after.empty());
  EXPECT_DOUBLE_EQ(standard.steps[0].a, 3.4445);
  EXPECT_DOUBLE_EQ(standard.steps[0].b, -4.7750);
  EXPECT_DOUBLE_EQ(standard.steps[0].c, 2.0315);
}

TEST(Schedule, PolarExpressMapsSpectrumNearOne) {
  // The composed polynomial sends every normalized singular value in [1e-3, 1] into [0.7, 1.15].
  const auto gram = dmuon::ns::default_schedule(Algorithm::kGram, 5, 1e-7);
  for (double sigma = 1e-3; sigma <= 1.0; sigma *= 1.1) {
    const double out = dmuon::ns::apply_to_singular_value(gram, sigma);
    EXPECT_GT(out, 0.7) << sigma;
    EXPECT_LT(out, 1.15) << sigma;
  }
}

TEST(Schedule, ValidationNamesTheProblem) {
  auto schedule = dmuon::ns::default_schedule(Algorithm::kGram, 5, 1e-7);
  schedule.steps[3].b = std::nan("");
  try {
    schedule.validate();
    FAIL();
  } catch (const dmuon::Error& e) {
    EXPECT_NE(std::string(e.what()).find("ns_coefficients[3]"), std::string::npos);
  }
  auto bad_eps = dmuon::ns::default_schedule(Algorithm::kStandard, 5, -1.0);
  EXPECT_THROW(bad_eps.validate(), dmuon::Error);
  auto bad_restart = dmuon::ns::default_schedule(Algorithm::kStandard, 5, 1e-7);
  bad_restart.restart_after = {2};
  EXPECT_THROW(bad_restart.validate(), dmuon::Error);
  EXPECT_THROW(dmuon::ns::parse_algorithm("polar"), dmuon::Error);
  EXPECT_THROW(dmuon::ns::keller_jordan_coefficients(0), dmuon::Error);
}

}  // namespace

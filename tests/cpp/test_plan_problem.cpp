// Owner planner inputs: validation errors, cost models, cost tables, hashing.
#include <gtest/gtest.h>

#include <string>

#include "common/check.h"
#include "error_of.h"
#include "plan/cost_model.h"
#include "plan/hash.h"
#include "plan/plan.h"
#include "plan/problem.h"

namespace dmuon::plan {
namespace {

using dmuon::testing::error_of;

std::vector<MatrixSpec> small_matrices() {
  return {{"q", 64, 64}, {"k", 16, 64}, {"up", 256, 64}, {"down", 64, 256}, {"q2", 64, 64}};
}

ProblemOptions options_for(int world_size) {
  ProblemOptions options;
  options.world_size = world_size;
  options.bandwidth_bytes_per_s = 1e9;
  return options;
}

CostFn analytic() { return AnalyticCostModel::gpu_default().as_cost_fn(); }

TEST(PlanProblem, GroupsIdenticalMatricesIntoShapeClasses) {
  const Problem p = build_problem(small_matrices(), options_for(2), analytic());
  ASSERT_EQ(p.shapes.size(), 4u);
  EXPECT_EQ(p.shapes[0].matrix_idx, (std::vector<int>{0, 4}));
  EXPECT_EQ(p.shapes[0].max_batch(), 2);
  // Wire bytes default to 16-bit elements; the owner receives (D-1)/D of them.
  EXPECT_EQ(p.matrices[2].wire_bytes, 256 * 64 * 2);
  EXPECT_DOUBLE_EQ(p.shapes[2].recv_seconds, 0.5 * 256 * 64 * 2 / 1e9);
}

TEST(PlanProblem, BadInputsNameTheArgument) {
  EXPECT_NE(error_of([] { build_problem({}, options_for(2), analytic()); }).find("matrices must not be empty"),
            std::string::npos);
  EXPECT_NE(error_of([] { build_problem(small_matrices(), options_for(0), analytic()); }).find("world_size"),
            std::string::npos);
  ProblemOptions bad_bandwidth = options_for(2);
  bad_bandwidth.bandwidth_bytes_per_s = 0;
  EXPECT_NE(error_of([&] { build_problem(small_matrices(), bad_bandwidth, analytic()); }).find("bandwidth"),
            std::string::npos);
  // A non-positive cost names the shape.
  const std::string zero_cost = error_of([] {
    build_problem(small_matrices(), options_for(2), [](int64_t r, int64_t, int64_t) { return r == 16 ? 0.0 : 1.0; });
  });
  EXPECT_NE(zero_cost.find("16x64"), std::string::npos) << zero_cost;
  EXPECT_NE(zero_cost.find("positive"), std::string::npos) << zero_cost;
}

TEST(PlanProblem, MatrixAboveMemoryCapNamesMatrixAndCap) {
  ProblemOptions options = options_for(2);
  options.memory_cap_bytes = default_memory_bytes(64, 256) - 1;
  const std::string message = error_of([&] { build_problem(small_matrices(), options, analytic()); });
  EXPECT_NE(message.find("'up'"), std::string::npos) << message;
  EXPECT_NE(message.find("memory_cap_bytes = " + std::to_string(options.memory_cap_bytes)), std::string::npos)
      << message;
}

TEST(PlanProblem, HashIsReproducibleAndSensitive) {
  const uint64_t a = build_problem(small_matrices(), options_for(4), analytic()).hash;
  EXPECT_EQ(a, build_problem(small_matrices(), options_for(4), analytic()).hash);
  EXPECT_NE(a, build_problem(small_matrices(), options_for(5), analytic()).hash);
  auto renamed = small_matrices();
  renamed[1].name = "k_other";
  EXPECT_NE(a, build_problem(renamed, options_for(4), analytic()).hash);
  AnalyticCostModel slower = AnalyticCostModel::gpu_default();
  slower.flops_per_second /= 2;
  EXPECT_NE(a, build_problem(small_matrices(), options_for(4), slower.as_cost_fn()).hash);
}

TEST(PlanCostModel, FlopFormulasOfTheDesign) {
  // m ≤ n: standard 20m²n+10m³, Gram 8m²n+28m³ (dense); transposes cost the same.
  EXPECT_DOUBLE_EQ(ns_flops(100, 400, NsFlavor::kStandard, false), 20.0 * 1e4 * 400 + 10.0 * 1e6);
  EXPECT_DOUBLE_EQ(ns_flops(400, 100, NsFlavor::kGram, false), 8.0 * 1e4 * 400 + 28.0 * 1e6);
  EXPECT_DOUBLE_EQ(ns_flops(100, 400, NsFlavor::kGram, true), 6.0 * 1e4 * 400 + 14.0 * 1e6);
  EXPECT_DOUBLE_EQ(ns_flops(100, 400, NsFlavor::kStandard, true), 15.0 * 1e4 * 400 + 5.0 * 1e6);
  // Auto: standard when square, the cheaper otherwise.
  EXPECT_DOUBLE_EQ(ns_flops(64, 64, NsFlavor::kAuto, false), 30.0 * 64 * 64 * 64);
  EXPECT_DOUBLE_EQ(ns_flops(100, 400, NsFlavor::kAuto, false), ns_flops(100, 400, NsFlavor::kGram, false));
  EXPECT_THROW(parse_ns_flavor("fast"), Error);
}

TEST(PlanCostModel, AnalyticBatchingIsSublinear) {
  const AnalyticCostModel model = AnalyticCostModel::gpu_default();
  const double one = model.seconds(512, 2048, 1);
  const double eight = model.seconds(512, 2048, 8);
  EXPECT_LT(eight, 8 * one);
  EXPECT_NEAR(eight - one, 7 * (one - model.launch_overhead_s), 1e-15);
  AnalyticCostModel bad = model;
  bad.flops_per_second = -1;
  EXPECT_THROW(bad.as_cost_fn(), Error);
}

TEST(PlanCostTable, InterpolatesExtrapolatesAndNamesMissingShapes) {
  CostTable table;
  table.set(64, 64, 1, 1.0);
  table.set(64, 64, 4, 2.5);
  EXPECT_DOUBLE_EQ(table.seconds(64, 64, 1), 1.0);
  EXPECT_DOUBLE_EQ(table.seconds(64, 64, 2), 1.5);
  EXPECT_DOUBLE_EQ(table.seconds(64, 64, 8), 4.5);
  const std::string message = error_of([&] { table.seconds(32, 64, 1); });
  EXPECT_NE(message.find("32x64"), std::string::npos) << message;
  EXPECT_THROW(table.set(64, 64, 2, -1.0), Error);
}

}  // namespace
}  // namespace dmuon::plan

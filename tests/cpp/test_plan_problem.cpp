// Owner planner inputs: validation errors, cost models, cost tables, hashing.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <sstream>
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

// `head` followed by the end line save() writes: the count and FNV-1a of `head` in hex.
std::string with_end_line(const std::string& head, int count) {
  Hasher hasher;
  hasher.bytes(head.data(), head.size());
  std::ostringstream out;
  out << head << "end " << count << " " << std::hex << hasher.digest() << "\n";
  return out.str();
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

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

TEST(PlanCostTable, ProfileTakesTheMedianAfterWarmup) {
  int calls = 0;
  // Runs: warm-up 100 (discarded), then 5, 1, 3, 9, 2 → median 3.
  const double runs[] = {100, 5, 1, 3, 9, 2};
  const CostTable table = profile_cost_table({{8, 16, 2}}, [&](int64_t, int64_t, int64_t) { return runs[calls++]; }, 5, 1);
  EXPECT_EQ(calls, 6);
  EXPECT_DOUBLE_EQ(table.seconds(8, 16, 2), 3.0);
}

TEST(PlanCostTable, SavesAndLoadsWithKeyAndRejectsMalformedFiles) {
  const std::string path = ::testing::TempDir() + "/dmuon_cost_table_test.txt";
  CostTable table;
  table.set(128, 512, 1, 1.25e-4);
  table.set(128, 512, 3, 2.5e-4);
  table.save(path, "H200 driver 1 dmuon 0.1.0");
  CostTable loaded;
  EXPECT_FALSE(loaded.load(path, "other device"));
  ASSERT_TRUE(loaded.load(path, "H200 driver 1 dmuon 0.1.0"));
  EXPECT_EQ(loaded.entries(), table.entries());
  EXPECT_FALSE(loaded.load(path + ".missing", "x"));
  // A malformed line (under a valid end line) is reported with file and line.
  { std::ofstream(path) << with_end_line("dmuon-cost-table v2\nkey k\n128 512 one 1e-4\n", 1); }
  std::string message = error_of([&] { CostTable().load(path, "k"); });
  EXPECT_NE(message.find(path + ":3"), std::string::npos) << message;
  // So is an end line whose count is not the number of entries.
  { std::ofstream(path) << with_end_line("dmuon-cost-table v2\nkey k\n128 512 1 1e-4\n", 2); }
  message = error_of([&] { CostTable().load(path, "k"); });
  EXPECT_NE(message.find("1 entries, the end line says 2"), std::string::npos) << message;
  // A table of the previous format (no end line) is not one.
  { std::ofstream(path) << "dmuon-cost-table v1\nkey k\n128 512 1 1e-4\n"; }
  message = error_of([&] { CostTable().load(path, "k"); });
  EXPECT_NE(message.find("not a dmuon cost table"), std::string::npos) << message;
  std::remove(path.c_str());
}

// A file cut anywhere, or with one character changed, is refused with an error (never read
// as another table: the cut 5.4672999795002397e-05 → 5.4672999795002397 was a valid v1 file),
// and the table that tried to load it keeps what it held.
TEST(PlanCostTable, RefusesEveryTruncationAndEveryChangedCharacter) {
  const std::string path = ::testing::TempDir() + "/dmuon_cost_table_cut.txt";
  CostTable table;
  table.set(8, 12, 1, 5.4672999795002397e-05);
  table.set(8, 12, 2, 1.0e-4);
  table.set(5, 7, 1, 3.25e-05);
  table.save(path, "cpu | dmuon 0.1.0");
  const std::string text = read_text(path);
  CostTable kept;
  kept.set(1, 1, 1, 1.0);
  for (size_t length = 0; length < text.size(); ++length) {
    { std::ofstream(path, std::ios::binary) << text.substr(0, length); }
    EXPECT_NE(error_of([&] { kept.load(path, "cpu | dmuon 0.1.0"); }), "") << "cut to " << length << " bytes";
    ASSERT_EQ(kept.size(), 1u);
  }
  for (size_t pos = 0; pos + 1 < text.size(); ++pos) {
    std::string changed = text;
    changed[pos] = changed[pos] == '1' ? '2' : '1';
    { std::ofstream(path, std::ios::binary) << changed; }
    EXPECT_NE(error_of([&] { kept.load(path, "cpu | dmuon 0.1.0"); }), "") << "changed at " << pos;
    ASSERT_EQ(kept.size(), 1u);
  }
  { std::ofstream(path, std::ios::binary) << text; }
  ASSERT_TRUE(kept.load(path, "cpu | dmuon 0.1.0"));
  EXPECT_EQ(kept.entries(), table.entries());
  std::remove(path.c_str());
}

}  // namespace
}  // namespace dmuon::plan

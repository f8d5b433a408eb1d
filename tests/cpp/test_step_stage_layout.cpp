// The projection's view of the engine (step/stage_layout.h): every rank's bytes per peer
// in each stage's forward and return exchange, as the layout derives them for every rank,
// equal what each rank's engine counted while it ran (loopback worlds 2–4, owner and
// gather mode, many stages, sharded, replicated, stacked and whole-on-one-rank items); its
// NS batches are those the rank ran; and a transport that moves nothing fills what an
// owner receives with synthetic data, outside every phase.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "sim/pipeline.h"
#include "sim/rank_prediction.h"
#include "sim/traffic.h"
#include "step/stage_layout.h"
#include "step/synthetic.h"
#include "step_world.h"

namespace {

using dmuon::step::DType;
using dmuon::step::EngineOptions;
using dmuon::step::Mode;
using dmuon::testing::ModelParam;
using dmuon::testing::World;

std::vector<ModelParam> model() {
  return {
      {"tiny", {1, 1}, 0, true, DType::kFloat32, 0},
      {"few_rows", {2, 5}, 0, true, DType::kFloat32, 0},
      {"uneven", {7, 6}, 0, true, DType::kFloat32, 0},
      {"experts", {3, 4, 6}, 1, true, DType::kFloat32, 0},  // three items, each whole on one rank
      {"tall", {12, 5}, 0, true, DType::kFloat32, 0},
      {"square_a", {8, 8}, 0, true, DType::kFloat32, 0},
      {"square_b", {8, 8}, 0, true, DType::kFloat32, 0},
      {"replicated", {6, 9}, 0, false, DType::kFloat32, 0},
      {"other_group", {9, 4}, 0, true, DType::kFloat32, 1},
  };
}

std::vector<dmuon::step::GroupRule> rules() {
  return {dmuon::testing::gram_rule(0.02, 0.1), dmuon::testing::standard_rule(0.05, 0.0, false)};
}

using Case = std::tuple<int, Mode, int64_t>;  // world, mode, stage bytes

class StageLayoutTest : public ::testing::TestWithParam<Case> {};

TEST_P(StageLayoutTest, EveryRanksBytesPerPeerAreWhatItsEngineCounted) {
  const auto [world_size, mode, stage_bytes] = GetParam();
  const World world(model(), world_size, 1, 7);
  EngineOptions options;
  options.mode = mode;
  options.stage_bytes = stage_bytes;
  const dmuon::testing::EngineRun run = dmuon::testing::run_engine(world, options, rules(), 1);
  for (const std::string& e : run.errors) ASSERT_EQ(e, "");
  const auto layout = dmuon::step::stage_layout(world.table(), run.stages[0], mode, 4, {});
  ASSERT_EQ(layout.num_stages(), run.stages[0].size());
  if (stage_bytes > 0) EXPECT_GT(layout.num_stages(), 1u);
  const size_t w = static_cast<size_t>(world_size);
  for (size_t r = 0; r < w; ++r) {
    const auto& stats = run.stats[r];
    ASSERT_EQ(stats.stages.size(), layout.num_stages()) << "rank " << r;
    std::vector<std::tuple<int64_t, int64_t, int64_t>> batches;
    for (size_t s = 0; s < layout.num_stages(); ++s) {
      const auto& line = stats.stages[s];
      for (size_t peer = 0; peer < w; ++peer) {
        EXPECT_EQ(layout.forward[s].bytes[r * w + peer], line.forward_sent_to[peer]) << r << "→" << peer << " " << s;
        EXPECT_EQ(layout.forward[s].bytes[peer * w + r], line.forward_received_from[peer]) << peer << "→" << r;
        EXPECT_EQ(layout.back[s].bytes[r * w + peer], line.return_sent_to[peer]) << r << "→" << peer << " " << s;
        EXPECT_EQ(layout.back[s].bytes[peer * w + r], line.return_received_from[peer]) << peer << "→" << r;
      }
      for (const auto& b : layout.work[s][r].ns_batches) batches.emplace_back(b.count, b.rows, b.cols);
    }
    EXPECT_EQ(batches, stats.ns_batches) << "rank " << r;
  }
  // Gather mode returns nothing; owner mode returns at least the sharded rows.
  int64_t returned = 0;
  for (const auto& e : layout.back) returned += e.issued ? 1 : 0;
  EXPECT_EQ(returned > 0, mode == Mode::kOwner);
  // The projection's traffic sums to what every rank counted.
  const auto topology = dmuon::sim::Topology::two_level(world_size, 2, {100.0, 0.0}, {10.0, 0.0});
  const auto traffic = dmuon::sim::step_traffic(layout, topology);
  for (int r = 0; r < world_size; ++r) {
    EXPECT_EQ(traffic.total(r).sent(), run.stats[static_cast<size_t>(r)].bytes_sent) << "rank " << r;
    EXPECT_EQ(traffic.total(r).received(), run.stats[static_cast<size_t>(r)].bytes_received) << "rank " << r;
  }
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const auto [world, mode, stage_bytes] = info.param;
  return "world" + std::to_string(world) + (mode == Mode::kOwner ? "_owner" : "_gather") +
         (stage_bytes > 0 ? "_stages" : "_onestage");
}

INSTANTIATE_TEST_SUITE_P(Worlds, StageLayoutTest,
                         ::testing::Combine(::testing::Values(2, 3, 4), ::testing::Values(Mode::kOwner, Mode::kGather),
                                            ::testing::Values(int64_t{256}, int64_t{0})),
                         case_name);

TEST(StageLayout, ParametersWithoutAGradientMoveNothing) {
  const World world(model(), 3, 1, 3);
  const dmuon::testing::EngineRun run = dmuon::testing::run_engine(world, EngineOptions{}, rules(), 1);
  std::vector<bool> active(model().size(), false);
  const auto layout = dmuon::step::stage_layout(world.table(), run.stages[0], Mode::kOwner, 2, active);
  for (size_t s = 0; s < layout.num_stages(); ++s) {
    EXPECT_FALSE(layout.forward[s].issued);
    EXPECT_FALSE(layout.back[s].issued);
    for (const auto& w : layout.work[s]) EXPECT_TRUE(w.ns_batches.empty());
  }
  EXPECT_THROW(dmuon::step::stage_layout(world.table(), run.stages[0], Mode::kOwner, 2, {true}), dmuon::Error);
}

// A transport that moves nothing: an owner's received pieces are the synthetic values
// (full rank, unit variance), not zeros; the fill is no phase's time.
class RecordingOps : public dmuon::testing::ForwardingOps {
 public:
  using ForwardingOps::ForwardingOps;
  void fill_synthetic(const dmuon::step::Buffer& b, uint64_t seed) override {
    ForwardingOps::fill_synthetic(b, seed);
    filled += b.numel;
    first_seed = first_seed == 0 ? seed : first_seed;
  }
  int64_t filled = 0;
  uint64_t first_seed = 0;
};

TEST(StageLayout, AFakeWorldsOwnerOrthogonalizesSyntheticUpdates) {
  const World world(model(), 4, 1, 5);
  dmuon::step::CpuOps cpu;
  RecordingOps ops(cpu);
  dmuon::testing::NoDataTransport transport(1, 4);
  EngineOptions options;
  options.stage_bytes = 256;
  dmuon::step::StepEngine engine(transport, ops, world.specs(), options);
  auto tensors = world.local(1);
  world.set_grads(1, 1, tensors);
  ASSERT_TRUE(engine.step(tensors.views(), rules(), 1).applied());
  int64_t forward_received = 0;
  for (const auto& line : engine.last_stats().stages)
    for (int64_t b : line.forward_received_from) forward_received += b;
  EXPECT_GT(forward_received, 0);
  EXPECT_EQ(ops.filled * 4, forward_received) << "every update received is synthetic (fp32 wire)";
  EXPECT_GT(ops.first_seed, 0u);
  EXPECT_GE(engine.last_stats().model_fill_s, 0.0);
  EXPECT_EQ(engine.predicted_rank_seconds().size(), 4u);
  // The values: unit variance, no two neighbours equal, the CPU's and the header's alike.
  double sum = 0, squares = 0;
  constexpr int kN = 100000;
  for (int i = 0; i < kN; ++i) {
    const double v = dmuon::step::synthetic_value(42, static_cast<uint64_t>(i));
    sum += v;
    squares += v * v;
    ASSERT_LE(std::abs(v), std::sqrt(3.0));
  }
  EXPECT_NEAR(sum / kN, 0.0, 0.02);
  EXPECT_NEAR(squares / kN, 1.0, 0.02);
  auto buffer = cpu.allocate(DType::kFloat32, 8);
  cpu.fill_synthetic(buffer.get(), 42);
  for (int i = 0; i < 8; ++i)
    EXPECT_EQ(buffer.get().as<float>()[i], dmuon::step::synthetic_value(42, static_cast<uint64_t>(i)));
}

}  // namespace

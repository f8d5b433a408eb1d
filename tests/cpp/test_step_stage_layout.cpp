// The projection's view of the engine's plans (step/stage_layout.h; that it equals what
// every rank's engine counted: test_step_exchange_plan.cpp): parameters without a gradient
// move nothing and bad arguments are named; and a rank over a transport that moves nothing
// runs its real work, filling what an owner receives with synthetic data outside every phase.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

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

// Rank r of a world of 4 whose collectives move nothing (torch's fake process group): the
// plan is solved locally, receive buffers are filled by the model (synthetic updates of
// full rank and unit variance, not zeros; zero results; the ops poison every allocation,
// so NS on unwritten memory would raise), the fill is no phase's time, and the bytes are
// counted.
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

TEST(StageLayout, AFakeWorldsRankRunsItsRealWorkOnSyntheticUpdates) {
  const World world(model(), 4, 1, 5);
  dmuon::step::CpuOpsOptions cpu_options;
  cpu_options.poison_allocations = true;
  dmuon::step::CpuOps cpu(cpu_options);
  RecordingOps ops(cpu);
  dmuon::testing::NoDataTransport transport(1, 4);
  EngineOptions options;
  options.stage_bytes = 256;  // NOTE: the MILP too is solved locally here
  dmuon::step::StepEngine engine(transport, ops, world.specs(), options);
  auto tensors = world.local(1);
  world.set_grads(1, 1, tensors);
  ASSERT_TRUE(engine.step(tensors.views(), rules(), 1).applied());
  const auto& stats = engine.last_stats();
  int64_t sent = 0, forward_received = 0;
  for (const auto& line : stats.stages) {
    for (int64_t b : line.forward_sent_to) sent += b;
    for (int64_t b : line.return_sent_to) sent += b;
    for (int64_t b : line.forward_received_from) forward_received += b;
    EXPECT_EQ(line.forward_sent_to[1], 0) << "nothing is sent to oneself";
  }
  EXPECT_GT(stats.bytes_sent, 0);
  EXPECT_GT(stats.bytes_received, 0);
  EXPECT_EQ(sent, stats.bytes_sent);
  EXPECT_GT(forward_received, 0);
  EXPECT_EQ(ops.filled * 4, forward_received) << "every update received is synthetic (fp32 wire)";
  EXPECT_GT(ops.first_seed, 0u);
  EXPECT_GE(stats.model_fill_s, 0.0);
  EXPECT_EQ(engine.predicted_rank_seconds().size(), 4u);
  for (size_t p = 0; p < tensors.param.size(); ++p)
    for (double v : tensors.param[p].values()) ASSERT_TRUE(std::isfinite(v)) << world.model()[p].name;
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

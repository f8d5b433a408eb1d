// The step projection (csrc/sim): topology, traffic, collective costs, the pipeline
// simulation and the prediction of unmeasured ranks, on hand-computed stage layouts (what
// the engine's exchange plans give them: tests/cpp/test_step_stage_layout.cpp).
#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/check.h"
#include "error_of.h"
#include "plan/cost_model.h"
#include "sim/collective_cost.h"
#include "sim/pipeline.h"
#include "sim/rank_prediction.h"
#include "sim/topology.h"
#include "sim/traffic.h"

namespace {

using dmuon::sim::BucketTimes;
using dmuon::sim::Link;
using dmuon::sim::Phase;
using dmuon::sim::Program;
using dmuon::sim::RankStageWork;
using dmuon::sim::RankTimeline;
using dmuon::sim::StageExchange;
using dmuon::sim::StageLayout;
using dmuon::sim::Topology;

constexpr Link kIntra{100.0, 0.5};  // bytes/s, s: round numbers for hand computation
constexpr Link kInter{10.0, 2.0};

Topology flat(int world, int gpus_per_node) { return Topology::two_level(world, gpus_per_node, kIntra, kInter); }

BucketTimes times(double prepare, double ns, double return_pack, double apply) {
  BucketTimes t;
  t[Phase::kPrepare] = prepare;
  t[Phase::kNs] = ns;
  t[Phase::kReturnPack] = return_pack;
  t[Phase::kApply] = apply;
  return t;
}

// A stage layout of `world` ranks whose stage s moves forward[s] and returns back[s]
// ({src, dst, bytes} each; a stage with none does not issue that exchange).
using Moves = std::vector<std::tuple<int, int, int64_t>>;
StageLayout layout_of(int world, const std::vector<Moves>& forward, const std::vector<Moves>& back) {
  StageLayout layout;
  layout.world_size = world;
  const size_t cells = static_cast<size_t>(world * world);
  for (size_t s = 0; s < forward.size(); ++s) {
    for (auto [moves, out] : {std::make_pair(&forward[s], &layout.forward), std::make_pair(&back[s], &layout.back)}) {
      StageExchange e{!moves->empty(), std::vector<int64_t>(cells, 0)};
      for (const auto& [src, dst, bytes] : *moves) e.bytes[static_cast<size_t>(src * world + dst)] += bytes;
      out->push_back(std::move(e));
    }
    layout.work.emplace_back(static_cast<size_t>(world));
  }
  return layout;
}

TEST(SimTopology, TwoLevelPlacesGroupRanksOnNodes) {
  const Topology world = flat(16, 8);
  EXPECT_EQ(world.node_of(7), 0);
  EXPECT_EQ(world.node_of(8), 1);
  EXPECT_TRUE(world.spans_nodes());
  // HSDP 4 × 4 on 8-GPU nodes: the replicate group of shard 2 is global ranks 2, 6, 10, 14.
  const Topology replicas = Topology::two_level(4, 8, kIntra, kInter, 2, 4);
  EXPECT_EQ(replicas.node_of(0), 0);
  EXPECT_EQ(replicas.node_of(1), 0);
  EXPECT_EQ(replicas.node_of(2), 1);
  // ... and the shard group of replica 1 (ranks 4..7) sits inside node 0.
  EXPECT_FALSE(Topology::two_level(4, 8, kIntra, kInter, 4, 1).spans_nodes());
  EXPECT_THROW(Topology({}, kIntra, kInter), dmuon::Error);
  EXPECT_THROW(Topology({0, 1}, Link{0.0, 0.0}, kInter), dmuon::Error);
  EXPECT_THROW(Topology::two_level(4, 0, kIntra, kInter), dmuon::Error);
}

TEST(SimTraffic, EveryTransferOnTheLinkBetweenItsRanks) {
  // Rank 0's 3 rows of a 5×4 matrix to its owner 1 (48 bytes); the return: 48 bytes back,
  // and rank 0 (the owner of a replicated 2×4) sends rank 1 the whole of it (32 bytes).
  const StageLayout layout = layout_of(2, {{{0, 1, 48}}}, {{{1, 0, 48}, {0, 1, 32}}});
  const auto traffic = dmuon::sim::step_traffic(layout, flat(2, 8));
  ASSERT_EQ(traffic.forward.size(), 1u);
  EXPECT_TRUE(traffic.forward[0].issued);
  EXPECT_TRUE(traffic.back[0].issued);
  EXPECT_EQ(traffic.forward[0].ranks[0].send_intra, 48);
  EXPECT_EQ(traffic.forward[0].ranks[1].recv_intra, 48);
  EXPECT_EQ(traffic.forward[0].ranks[1].send_intra, 0);
  EXPECT_EQ(traffic.back[0].ranks[1].send_intra, 48);
  EXPECT_EQ(traffic.back[0].ranks[0].send_intra, 32);
  const auto r0 = traffic.total(0);
  EXPECT_EQ(r0.sent(), 48 + 32);
  EXPECT_EQ(r0.received(), 48);
  EXPECT_EQ(r0.send_inter + r0.recv_inter, 0);
  // One GPU per node: the same bytes cross the network instead.
  const auto apart = dmuon::sim::step_traffic(layout, flat(2, 1)).total(0);
  EXPECT_EQ(apart.send_inter, 80);
  EXPECT_EQ(apart.send_intra, 0);
  // An exchange not issued counts nothing.
  EXPECT_EQ(dmuon::sim::step_traffic(layout_of(2, {{}}, {{}}), flat(2, 8)).total(0).sent(), 0);
}

TEST(SimCollectiveCost, LatencyPlusTheSlowestLink) {
  dmuon::sim::Exchange e;
  e.issued = true;
  e.ranks.resize(2);
  e.ranks[0].send_intra = 200;  // 2 s on the intra link
  e.ranks[1].recv_intra = 200;
  EXPECT_DOUBLE_EQ(dmuon::sim::all_to_all_seconds(e, flat(2, 8)), 0.5 + 2.0);
  e.ranks[0].send_inter = 30;  // 3 s on the network: the slower link, and its latency
  e.ranks[1].recv_inter = 30;
  EXPECT_DOUBLE_EQ(dmuon::sim::all_to_all_seconds(e, flat(2, 8)), 2.0 + 3.0);
  e.issued = false;
  EXPECT_EQ(dmuon::sim::all_to_all_seconds(e, flat(2, 8)), 0.0);

  using dmuon::sim::RingKind;
  EXPECT_DOUBLE_EQ(dmuon::sim::ring_seconds(RingKind::kAllGather, 400, flat(4, 8)), 0.5 + 0.75 * 4.0);
  EXPECT_DOUBLE_EQ(dmuon::sim::ring_seconds(RingKind::kAllReduce, 400, flat(4, 8)), 0.5 + 1.5 * 4.0);
  EXPECT_DOUBLE_EQ(dmuon::sim::ring_seconds(RingKind::kReduceScatter, 40, flat(4, 2)), 2.0 + 0.75 * 4.0);
  EXPECT_EQ(dmuon::sim::ring_seconds(RingKind::kAllReduce, 400, flat(1, 8)), 0.0);
}

TEST(SimPipeline, ACollectiveCompletesOnlyWhenEveryRankReachedIt) {
  Program program;
  const size_t c = program.add_collective("forward 0", 0.5);
  program.compute(0, Phase::kPrepare);
  program.issue(c);
  program.wait(c);
  program.compute(0, Phase::kNs);
  // Rank 0 packs in 1 s, rank 1 in 3 s: both receive at 3 + 0.5; rank 0's NS then takes 10 s.
  const std::vector<RankTimeline> t = {{times(1, 10, 0, 0)}, {times(3, 2, 0, 0)}};
  const auto p = dmuon::sim::simulate(program, t);
  EXPECT_DOUBLE_EQ(p.collectives[0].start_s, 3.0);
  EXPECT_DOUBLE_EQ(p.ranks[0].wait_s, 2.5);
  EXPECT_DOUBLE_EQ(p.ranks[1].wait_s, 0.5);
  EXPECT_DOUBLE_EQ(p.ranks[0].end_s, 13.5);
  EXPECT_DOUBLE_EQ(p.ranks[1].end_s, 5.5);
  EXPECT_DOUBLE_EQ(p.step_s, 13.5);
  EXPECT_EQ(p.slowest_rank, 0);
  EXPECT_DOUBLE_EQ(p.ranks[0].compute_s, 11.0);
}

TEST(SimPipeline, ARanksCollectivesRunOneAtATimeInIssueOrder) {
  Program program;
  const size_t a = program.add_collective("a", 1.0), b = program.add_collective("b", 1.0);
  program.issue(a);
  program.issue(b);
  program.wait(b);
  const auto p = dmuon::sim::simulate(program, {{times(0, 0, 0, 0)}});
  EXPECT_DOUBLE_EQ(p.collectives[1].start_s, 1.0);
  EXPECT_DOUBLE_EQ(p.step_s, 2.0);
  EXPECT_THROW(dmuon::sim::simulate(program, {{times(-1, 0, 0, 0)}}), dmuon::Error);
}

// The program's operations as text: P0 (compute prepare of bucket 0), I(forward 0), W(...).
std::string describe(const Program& program) {
  std::string out;
  for (const auto& op : program.ops) {
    if (!out.empty()) out += " ";
    if (op.kind == Program::Kind::kCompute) {
      out += std::string(1, "PNRA"[static_cast<size_t>(op.phase)]) + std::to_string(op.bucket);
    } else {
      out += (op.kind == Program::Kind::kIssue ? "I(" : "W(") + program.collective_names[op.collective] + ")";
    }
  }
  return out;
}

TEST(SimPipeline, TheProgramIsTheRuntimesOrder) {
  // Three stages of one 4×2 matrix each over two ranks, owners 0, 1, 0; depth 1.
  const StageLayout layout = layout_of(2, {{{1, 0, 16}}, {{0, 1, 16}}, {{1, 0, 16}}},
                                       {{{0, 1, 16}}, {{1, 0, 16}}, {{0, 1, 16}}});
  const auto traffic = dmuon::sim::step_traffic(layout, flat(2, 8));
  const Program program = dmuon::sim::stage_pipeline_program(traffic, flat(2, 8), 1, 0.0);
  EXPECT_EQ(describe(program),
            "P0 I(forward 0) P1 I(forward 1) "
            "W(forward 0) N0 R0 I(return 0) P2 I(forward 2) "
            "W(forward 1) N1 R1 I(return 1) W(return 0) A0 "
            "W(forward 2) N2 R2 I(return 2) W(return 1) A1 "
            "W(return 2) A2");
  // With agreements, the step begins and ends with one.
  const Program agreed = dmuon::sim::stage_pipeline_program(traffic, flat(2, 8), 8, 1e-5);
  EXPECT_EQ(agreed.collective_names.front(), "all_reduce of the gradient checks");
  EXPECT_EQ(agreed.collective_names.back(), "all_reduce of the finite check");
  EXPECT_EQ(agreed.ops.back().kind, Program::Kind::kWait);
  // Gather mode: no returns.
  const StageLayout gather = layout_of(2, {{{0, 1, 16}, {1, 0, 16}}, {{0, 1, 16}, {1, 0, 16}}, {{0, 1, 16}}},
                                       {{}, {}, {}});
  const Program no_returns =
      dmuon::sim::stage_pipeline_program(dmuon::sim::step_traffic(gather, flat(2, 8)), flat(2, 8), 1, 0.0);
  EXPECT_EQ(describe(no_returns).find("return"), std::string::npos);
}

TEST(SimPipeline, OwnersOverlapWithEnoughDepthAndChainWithout) {
  // Four stages, each one 4×2 matrix sharded over four ranks and owned by a different
  // one; NS 10 s on its owner.
  std::vector<Moves> forward(4), back(4);
  for (int s = 0; s < 4; ++s)
    for (int r = 0; r < 4; ++r)
      if (r != s) {
        forward[static_cast<size_t>(s)].emplace_back(r, s, 8);
        back[static_cast<size_t>(s)].emplace_back(s, r, 8);
      }
  const StageLayout layout = layout_of(4, forward, back);
  std::vector<RankTimeline> t(4, RankTimeline(4, times(0, 0, 0, 0)));
  for (int r = 0; r < 4; ++r) t[static_cast<size_t>(r)][static_cast<size_t>(r)][Phase::kNs] = 10.0;
  const Topology fast = Topology::two_level(4, 8, Link{1e12, 0.0}, Link{1e12, 0.0});
  const auto traffic = dmuon::sim::step_traffic(layout, fast);
  // depth 4: every forward in flight at once, the four NS run side by side.
  const auto overlapped = dmuon::sim::simulate(dmuon::sim::stage_pipeline_program(traffic, fast, 4, 0.0), t);
  EXPECT_NEAR(overlapped.step_s, 10.0, 1e-9);
  // depth 1: rank 0 waits in stage 1's return for rank 1's NS before it issues stage 2's
  // forward... the NS chain: 0 and 1 overlap, then 2 waits for the return of stage 1.
  const auto chained = dmuon::sim::simulate(dmuon::sim::stage_pipeline_program(traffic, fast, 1, 0.0), t);
  EXPECT_GT(chained.step_s, 19.0);
}

TEST(SimPrediction, UnmeasuredRanksFollowTheMeasuredRanksFit) {
  // Two stages over two ranks; rank 0 measured with time = 1 ms + 2 ns per element
  // (prepare, apply) and 3 × the cost model (NS): rank 1 must follow.
  StageLayout layout = layout_of(2, {{{0, 1, 4}}, {{0, 1, 4}}}, {{{1, 0, 4}}, {{1, 0, 4}}});
  layout.work[0][0] = RankStageWork{1280, {{63, 32, 1}}, 544};
  layout.work[0][1] = RankStageWork{1248, {{16, 32, 1}}, 0};
  layout.work[1][0] = RankStageWork{544, {{33, 32, 1}}, 100};
  layout.work[1][1] = RankStageWork{512, {}, 200};
  const auto cost = dmuon::plan::AnalyticCostModel::cpu_default().as_cost_fn();
  const auto work0 = dmuon::sim::rank_work(layout, 0, cost);
  const auto work1 = dmuon::sim::rank_work(layout, 1, cost);
  EXPECT_DOUBLE_EQ(work1[0][static_cast<size_t>(Phase::kPrepare)], 1248);
  EXPECT_DOUBLE_EQ(work0[0][static_cast<size_t>(Phase::kNs)], cost(63, 32, 1));
  EXPECT_DOUBLE_EQ(work1[1][static_cast<size_t>(Phase::kNs)], 0.0);

  auto model = [](const std::array<double, 4>& w) {
    return times(1e-3 + 2e-9 * w[0], 3.0 * w[1], 0.0, 1e-3 + 2e-9 * w[3]);
  };
  RankTimeline measured;
  for (const auto& w : work0) measured.push_back(model(w));
  // NOTE: rank 0's samples of every phase with work vary in it, so each two-parameter fit is exact.
  const auto all = dmuon::sim::complete_timelines(layout, {{0, measured}}, cost);
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0][1][Phase::kNs], measured[1][Phase::kNs]);  // measured ranks are kept as given
  for (size_t s = 0; s < 2; ++s) {
    const BucketTimes expected = model(work1[s]);
    for (size_t p = 0; p < dmuon::sim::kNumPhases; ++p) {
      const Phase phase = static_cast<Phase>(p);
      // Without work (rank 1 owns nothing in stage 1): the measured idle time (none: 0).
      const double want = work1[s][p] > 0 ? expected[phase] : 0.0;
      EXPECT_NEAR(all[1][s][phase], want, 1e-12 + 1e-9 * want) << "stage " << s << " phase "
                                                                  << dmuon::sim::phase_name(phase);
    }
  }
  EXPECT_THROW(dmuon::sim::complete_timelines(layout, {{2, measured}}, cost), dmuon::Error);
  EXPECT_THROW(dmuon::sim::complete_timelines(layout, {{0, RankTimeline(1)}}, cost), dmuon::Error);
}

}  // namespace

namespace {

// The engine's stages over two ranks on different nodes: stage 0 sends rank 0's 12 bytes
// to owner 1 and returns them; stage 1 is rank 0's own whole item (nothing travels).
StageLayout two_stage_layout() {
  StageLayout layout;
  layout.world_size = 2;
  layout.forward = {StageExchange{true, {0, 12, 0, 0}}, StageExchange{false, {0, 0, 0, 0}}};
  layout.back = {StageExchange{true, {0, 0, 12, 0}}, StageExchange{false, {0, 0, 0, 0}}};
  layout.work.assign(2, std::vector<dmuon::sim::RankStageWork>(2));
  layout.work[0][0].prepare_elements = 3;
  layout.work[0][1].ns_batches = {{2, 3, 1}};
  layout.work[0][0].apply_elements = 3;
  layout.work[1][0].ns_batches = {{4, 4, 2}};
  return layout;
}

}  // namespace

TEST(SimStageLayout, TrafficAndWorkComeFromTheEnginesStages) {
  const StageLayout layout = two_stage_layout();
  const auto traffic = dmuon::sim::step_traffic(layout, flat(2, 1));
  ASSERT_EQ(traffic.forward.size(), 2u);
  EXPECT_EQ(traffic.forward[0].ranks[0].send_inter, 12);
  EXPECT_EQ(traffic.forward[0].ranks[1].recv_inter, 12);
  EXPECT_EQ(traffic.back[0].ranks[0].recv_inter, 12);
  EXPECT_FALSE(traffic.forward[1].issued);
  EXPECT_EQ(traffic.total(0).sent(), 12);
  EXPECT_EQ(traffic.total(1).received(), 12);
  const auto cost = dmuon::plan::AnalyticCostModel::cpu_default().as_cost_fn();
  const auto work0 = dmuon::sim::rank_work(layout, 0, cost);
  EXPECT_DOUBLE_EQ(work0[0][static_cast<size_t>(Phase::kPrepare)], 3);
  EXPECT_DOUBLE_EQ(work0[0][static_cast<size_t>(Phase::kNs)], 0);
  EXPECT_DOUBLE_EQ(work0[1][static_cast<size_t>(Phase::kNs)], cost(4, 4, 2));
  EXPECT_DOUBLE_EQ(work0[0][static_cast<size_t>(Phase::kReturnPack)], 0);
  // The pipeline over it at depth 1 (each exchange 2 s latency + 12 B / 10 B/s = 3.2 s):
  // forward 0 runs 0.5 → 3.7 (after rank 0's prepare); rank 1's NS 3.7 → 4.7; return 0
  // 4.7 → 7.9; rank 0 runs stage 1's NS (its own item) 3.7 → 7.7, waits for the return
  // and applies it: 7.9 + 0.25.
  std::vector<RankTimeline> t = {{times(0.5, 0, 0, 0.25), times(0, 4, 0, 0)}, {times(0, 1, 0, 0), times(0, 0, 0, 0)}};
  const auto projection = dmuon::sim::simulate(dmuon::sim::stage_pipeline_program(traffic, flat(2, 1), 1, 0.0), t);
  EXPECT_NEAR(projection.ranks[0].end_s, 8.15, 1e-9);
  EXPECT_NEAR(projection.ranks[1].end_s, 7.9, 1e-9);
}

TEST(SimStageLayout, FromStageKeepsTheLaterStagesAlone) {
  const StageLayout layout = two_stage_layout();
  // What runs at step() once stage 0 left inside backward: stage 1 (rank 0's own item).
  const StageLayout tail = layout.from_stage(1);
  ASSERT_EQ(tail.num_stages(), 1u);
  EXPECT_EQ(tail.world_size, 2);
  EXPECT_FALSE(tail.forward[0].issued);
  EXPECT_EQ(tail.work[0][0].ns_batches.size(), 1u);
  EXPECT_EQ(tail.work[0][0].ns_batches[0].rows, 4);
  const auto traffic = dmuon::sim::step_traffic(tail, flat(2, 1));
  std::vector<RankTimeline> t = {{times(0, 4, 0, 0)}, {times(0, 0, 0, 0)}};
  const auto projection = dmuon::sim::simulate(dmuon::sim::stage_pipeline_program(traffic, flat(2, 1), 1, 0.0), t);
  EXPECT_NEAR(projection.step_s, 4.0, 1e-9);
  EXPECT_EQ(layout.from_stage(2).num_stages(), 0u);
  EXPECT_NE(dmuon::testing::error_of([&] { (void)layout.from_stage(3); }).find("first stage 3 is past the layout's 2"),
            std::string::npos);
}

TEST(SimStageLayout, InconsistentLayoutsAreNamed) {
  StageLayout layout = two_stage_layout();
  layout.forward[0].bytes.pop_back();
  EXPECT_NE(dmuon::testing::error_of([&] { layout.validate(); }).find("world²"), std::string::npos);
  layout = two_stage_layout();
  layout.forward[1].bytes[1] = 4;
  EXPECT_NE(dmuon::testing::error_of([&] { layout.validate(); }).find("does not issue"), std::string::npos);
  layout = two_stage_layout();
  layout.work[1].pop_back();
  EXPECT_NE(dmuon::testing::error_of([&] { layout.validate(); }).find("the work of 1 ranks"), std::string::npos);
  EXPECT_THROW(dmuon::sim::step_traffic(two_stage_layout(), flat(3, 1)), dmuon::Error);
}

// The exchange plan (step/exchange_plan.h) on loopback worlds 1–4, owner and gather mode,
// one stage or many, over uneven, empty, 2-D (mesh) and replicated shards, stacks, column
// blocks and parameters without a gradient: what rank r sends s is, block for block, what
// s receives from r (both ways); every buffer's places tile it; every element of every
// active item reaches each rank that computes it exactly once, every holder's momentum is
// updated once and its rows come back once; inactive items move nothing; the engine moves
// what its plan says (the bytes it counted, read through the projection's view of every
// rank's plan), also for stages exchanged inside backward; and plans are made once per set
// of active items, never per step.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "error_of.h"
#include "sim/traffic.h"
#include "step/exchange_plan.h"
#include "step/stage_layout.h"
#include "step_expect.h"
#include "step_world.h"

namespace {

using dmuon::layout::DimPlacement;
using dmuon::layout::PlacementKind;
using dmuon::step::BatchPlan;
using dmuon::step::ComputePlan;
using dmuon::step::DType;
using dmuon::step::EngineOptions;
using dmuon::step::ExchangeCounts;
using dmuon::step::ExchangePlan;
using dmuon::step::ItemTable;
using dmuon::step::LandPlan;
using dmuon::step::Mode;
using dmuon::step::Piece;
using dmuon::step::PreparePlan;
using dmuon::step::StagePlan;
using dmuon::step::WirePlace;
using dmuon::testing::ModelParam;
using dmuon::testing::World;

const DimPlacement kReplicate{PlacementKind::kReplicate, 0, 1};
DimPlacement shard(int64_t dim) { return {PlacementKind::kShard, dim, 1}; }

// Every kind of piece the engine meets, on a world of `world` ranks.
std::vector<ModelParam> model(int world) {
  std::vector<ModelParam> m = {
      {"tiny", {1, 1}, 0, true, DType::kFloat32, 0},
      {"few_rows", {2, 5}, 0, true, DType::kFloat32, 0},  // empty shards from world 3 on
      {"uneven", {7, 6}, 0, true, DType::kFloat32, 0},
      {"experts", {3, 4, 6}, 1, true, DType::kFloat32, 0},  // each matrix whole on one rank
      {"tall", {12, 5}, 0, true, DType::kFloat32, 0},
      {"replicated", {6, 9}, 0, false, DType::kFloat32, 0},
      {"other_group", {9, 4}, 0, true, DType::kFloat32, 1},
      {"col_blocks", {7, 8}, 0, true, DType::kFloat32, 0},
      {"frozen", {5, 7}, 0, true, DType::kFloat32, 0},  // no gradient in the cases that leave some out
  };
  m[7].col_blocks = 2;
  if (world >= 2) {
    // Columns sharded (a TP row-parallel weight): 2-D pieces.
    ModelParam cols{"tp_cols", {6, 10}, 0, true, DType::kFloat32, 0};
    cols.mesh = dmuon::testing::row_major_mesh({world}, {shard(1)});
    m.push_back(cols);
  }
  if (world == 4) {
    ModelParam grid{"grid", {7, 9}, 0, true, DType::kFloat32, 1};  // rows by dp, columns by tp
    grid.mesh = dmuon::testing::row_major_mesh({2, 2}, {shard(0), shard(1)});
    ModelParam hsdp{"hsdp", {5, 6}, 0, true, DType::kFloat32, 0};  // two replicas of two shards
    hsdp.mesh = dmuon::testing::row_major_mesh({2, 2}, {kReplicate, shard(0)});
    m.push_back(grid);
    m.push_back(hsdp);
  }
  return m;
}

std::vector<dmuon::step::GroupRule> rules() {
  return {dmuon::testing::gram_rule(0.02, 0.1), dmuon::testing::standard_rule(0.05, 0.0, false)};
}

// [item] active: every item of a parameter with a gradient.
std::vector<bool> active_items(const ItemTable& table, const std::vector<bool>& params) {
  std::vector<bool> out(static_cast<size_t>(table.num_items()));
  for (int i = 0; i < table.num_items(); ++i)
    out[static_cast<size_t>(i)] = params[static_cast<size_t>(table.item(i).param_idx)];
  return out;
}

// The start of each peer's region in a buffer laid out by `counts`.
std::vector<int64_t> region_begins(const std::vector<int64_t>& counts) {
  std::vector<int64_t> out(counts.size(), 0);
  for (size_t k = 1; k < counts.size(); ++k) out[k] = out[k - 1] + counts[k - 1];
  return out;
}

// Places in one buffer: (offset, numel) with what lies there (item, block).
struct Cell {
  int64_t offset, numel;
  int item;
  Piece block;
};

// The cells tile [0, size) exactly: sorted, no gap, no overlap.
void expect_tiles(std::vector<Cell> cells, int64_t size, const std::string& what) {
  std::sort(cells.begin(), cells.end(), [](const Cell& a, const Cell& b) { return a.offset < b.offset; });
  int64_t at = 0;
  for (const Cell& c : cells) {
    EXPECT_EQ(c.offset, at) << what << ": a gap or an overlap before item " << c.item;
    EXPECT_GT(c.numel, 0) << what;
    at = c.offset + c.numel;
  }
  EXPECT_EQ(at, size) << what;
}

// The cell at `offset`, or null.
const Cell* cell_at(const std::vector<Cell>& cells, int64_t offset) {
  for (const Cell& c : cells)
    if (c.offset == offset) return &c;
  return nullptr;
}

bool same(const Piece& a, const Piece& b) { return a.same_block(b) && a.local_offset == b.local_offset && a.ld == b.ld; }

// Every check of the plans of every rank for one set of active items.
void check_plans(const ItemTable& table, const std::vector<dmuon::step::Stage>& stages, Mode mode,
                 const std::vector<bool>& active, const std::vector<int>& owners) {
  const int world = table.world_size();
  std::vector<ExchangePlan> plans;
  for (int r = 0; r < world; ++r) plans.push_back(dmuon::step::plan_exchange(table, stages, mode, r, active));
  for (size_t s = 0; s < stages.size(); ++s) {
    const std::string at = "stage " + std::to_string(s);
    // Per rank: what lies where in its four buffers.
    std::vector<std::vector<Cell>> forward_send(world), forward_recv(world), return_send(world), return_recv(world);
    std::map<std::pair<int, int>, int> computed, momentum_updates, rows_back;  // (item, rank) → count
    for (int r = 0; r < world; ++r) {
      const StagePlan& plan = plans[static_cast<size_t>(r)].stages[s];
      for (const ExchangeCounts* c : {&plan.forward, &plan.back}) {
        ASSERT_EQ(c->send_counts.size(), static_cast<size_t>(world));
        ASSERT_EQ(c->recv_counts.size(), static_cast<size_t>(world));
        EXPECT_EQ(c->send_counts[static_cast<size_t>(r)], 0) << at;
        EXPECT_EQ(c->recv_counts[static_cast<size_t>(r)], 0) << at;
        int64_t sent = 0, received = 0;
        for (int d = 0; d < world; ++d) sent += c->send_counts[static_cast<size_t>(d)], received += c->recv_counts[static_cast<size_t>(d)];
        EXPECT_EQ(c->send_numel, sent) << at;
        EXPECT_EQ(c->recv_numel, received) << at;
      }
      if (mode == Mode::kGather) EXPECT_TRUE(!plan.back.issued && plan.back.send_numel == 0) << at;
      for (const PreparePlan& p : plan.prepare) {
        EXPECT_TRUE(active[static_cast<size_t>(p.item)]) << at;
        EXPECT_TRUE(same(p.piece, table.piece(p.item, r))) << at;
        ++momentum_updates[{p.item, r}];
        for (int64_t t : p.targets) forward_send[r].push_back({t, p.piece.numel(), p.item, p.piece});
      }
      for (const BatchPlan& b : plan.batches) {
        ASSERT_EQ(b.items.size(), b.batch.items.size());
        EXPECT_TRUE(b.batch.computed_by(r));
        for (size_t k = 0; k < b.items.size(); ++k) {
          const ComputePlan& c = b.items[k];
          EXPECT_EQ(c.item, b.batch.items[k]);
          EXPECT_TRUE(active[static_cast<size_t>(c.item)]) << at;
          EXPECT_TRUE(owners[static_cast<size_t>(c.item)] == dmuon::step::kEveryRank ||
                      owners[static_cast<size_t>(c.item)] == r);
          ++computed[{c.item, r}];
          if (c.whole && !c.momentum_prepared) ++momentum_updates[{c.item, r}];
          if (c.applies) ++rows_back[{c.item, r}];
          EXPECT_EQ(c.applies, !table.piece(c.item, r).empty());
          // Every element of the item exactly once: in place, or from its blocks.
          const auto& it = table.item(c.item);
          std::vector<int> hits(static_cast<size_t>(it.numel()), c.whole ? 1 : 0);
          EXPECT_TRUE(!c.whole || c.blocks.empty());
          for (const WirePlace& w : c.blocks) {
            EXPECT_TRUE(same(w.block, table.piece(c.item, w.peer))) << at;
            EXPECT_EQ(w.in_send, w.peer == r);
            if (w.in_send) {
              // This rank's own piece: prepared into the send buffer, after the peers' regions.
              const Cell* own = cell_at(forward_send[r], w.offset);
              EXPECT_TRUE(own != nullptr && own->item == c.item && same(own->block, w.block)) << at;
              EXPECT_GE(w.offset, plan.forward.send_numel) << at;
            } else {
              forward_recv[r].push_back({w.offset, w.block.numel(), c.item, w.block});
            }
            for (int64_t i = 0; i < w.block.row_count; ++i)
              for (int64_t j = 0; j < w.block.col_count; ++j)
                ++hits[static_cast<size_t>((w.block.row_begin + i) * it.cols + w.block.col_begin + j)];
          }
          EXPECT_EQ(std::count(hits.begin(), hits.end(), 1), it.numel()) << table.item_name(c.item) << " on rank " << r;
          for (const WirePlace& w : c.returns) {
            EXPECT_TRUE(same(w.block, table.piece(c.item, w.peer))) << at;
            EXPECT_NE(w.peer, r);
            return_send[r].push_back({w.offset, w.block.numel(), c.item, w.block});
          }
        }
      }
      for (const LandPlan& l : plan.land) {
        EXPECT_TRUE(same(l.place.block, table.piece(l.item, r))) << at;
        EXPECT_EQ(l.place.peer, owners[static_cast<size_t>(l.item)]);
        ++rows_back[{l.item, r}];
        return_recv[r].push_back({l.place.offset, l.place.block.numel(), l.item, l.place.block});
      }
      // Every buffer is tiled by its places.
      expect_tiles(forward_send[r], plan.forward_send_numel, at + " forward send of rank " + std::to_string(r));
      expect_tiles(forward_recv[r], plan.forward.recv_numel, at + " forward receive of rank " + std::to_string(r));
      expect_tiles(return_send[r], plan.back.send_numel, at + " return send of rank " + std::to_string(r));
      expect_tiles(return_recv[r], plan.back.recv_numel, at + " return receive of rank " + std::to_string(r));
    }
    // What r sends d (at the start of d's region in r's send buffer) is what d takes from r
    // (at the start of r's region in d's receive buffer), block for block; both ways.
    for (int r = 0; r < world; ++r)
      for (int d = 0; d < world; ++d) {
        if (r == d) continue;
        const StagePlan& from = plans[static_cast<size_t>(r)].stages[s];
        const StagePlan& to = plans[static_cast<size_t>(d)].stages[s];
        EXPECT_EQ(from.forward.issued, to.forward.issued) << at;
        EXPECT_EQ(from.back.issued, to.back.issued) << at;
        for (auto [counts_from, counts_to, sent, taken, what] :
             {std::make_tuple(&from.forward, &to.forward, &forward_send[r], &forward_recv[d], "forward"),
              std::make_tuple(&from.back, &to.back, &return_send[r], &return_recv[d], "return")}) {
          const int64_t n = counts_from->send_counts[static_cast<size_t>(d)];
          EXPECT_EQ(n, counts_to->recv_counts[static_cast<size_t>(r)]) << at << " " << what << " " << r << "→" << d;
          EXPECT_TRUE(n == 0 || counts_from->issued) << at << " " << what;
          const int64_t send_base = region_begins(counts_from->send_counts)[static_cast<size_t>(d)];
          const int64_t recv_base = region_begins(counts_to->recv_counts)[static_cast<size_t>(r)];
          for (int64_t k = 0; k < n;) {
            const Cell* out = cell_at(*sent, send_base + k);
            const Cell* in = cell_at(*taken, recv_base + k);
            ASSERT_TRUE(out != nullptr && in != nullptr) << at << " " << what << " " << r << "→" << d << " at " << k;
            EXPECT_EQ(out->item, in->item) << at << " " << what;
            EXPECT_TRUE(same(out->block, in->block)) << at << " " << what;
            k += out->numel;
          }
        }
      }
    // Per active item: computed by its owner (every rank in gather mode), every holder's
    // momentum updated once and its rows back once; an inactive item appears nowhere.
    for (const auto& batch : stages[s].batches)
      for (int item : batch.items)
        for (int r = 0; r < world; ++r) {
          const bool on = active[static_cast<size_t>(item)];
          const bool holds = !table.piece(item, r).empty();
          const std::pair<int, int> key{item, r};
          EXPECT_EQ(computed[key], on && batch.computed_by(r) ? 1 : 0) << table.item_name(item) << " rank " << r;
          EXPECT_EQ(momentum_updates[key], on && holds ? 1 : 0) << table.item_name(item) << " rank " << r;
          EXPECT_EQ(rows_back[key], on && holds ? 1 : 0) << table.item_name(item) << " rank " << r;
        }
  }
}

using Case = std::tuple<int, Mode, int64_t, bool>;  // world, mode, stage bytes, some parameters without a gradient

class ExchangePlanTest : public ::testing::TestWithParam<Case> {};

TEST_P(ExchangePlanTest, EveryRanksPlanMatchesItsPeersAndCoversEveryItemOnce) {
  const auto [world_size, mode, stage_bytes, some_inactive] = GetParam();
  const World world(model(world_size), world_size, 1, 11);
  EngineOptions options;
  options.mode = mode;
  options.stage_bytes = stage_bytes;
  std::vector<bool> active_params(world.model().size(), true);
  if (some_inactive) active_params[1] = active_params[8] = false;  // few_rows, frozen
  dmuon::testing::RunHooks hooks;
  hooks.before_step = [&](int, int, dmuon::testing::RankTensors& t) {
    for (size_t p = 0; p < active_params.size(); ++p) t.has_grad[p] = active_params[p];
  };
  const dmuon::testing::EngineRun run = dmuon::testing::run_engine(world, options, rules(), 1, hooks);
  for (const std::string& e : run.errors) ASSERT_EQ(e, "");
  if (stage_bytes > 0 && world_size > 1) EXPECT_GT(run.stages[0].size(), 1u);
  const std::vector<bool> active = active_items(world.table(), active_params);
  check_plans(world.table(), run.stages[0], mode, active, run.owners[0]);

  // The engine moved what every rank's plan says (read through the projection's view of
  // them, step/stage_layout.h), stage by stage and peer by peer, and ran its NS batches;
  // the projection's traffic sums to what every rank counted.
  const auto layout = dmuon::step::stage_layout(world.table(), run.stages[0], mode, 4, active_params);
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
  const auto topology = dmuon::sim::Topology::two_level(world_size, 2, {100.0, 0.0}, {10.0, 0.0});
  const auto traffic = dmuon::sim::step_traffic(layout, topology);
  for (int r = 0; r < world_size; ++r) {
    EXPECT_EQ(traffic.total(r).sent(), run.stats[static_cast<size_t>(r)].bytes_sent) << "rank " << r;
    EXPECT_EQ(traffic.total(r).received(), run.stats[static_cast<size_t>(r)].bytes_received) << "rank " << r;
  }
  // Gather mode returns nothing; owner mode (several ranks) returns at least the sharded rows.
  int64_t returned = 0;
  for (const auto& e : layout.back) returned += e.issued ? 1 : 0;
  EXPECT_EQ(returned > 0, mode == Mode::kOwner && world_size > 1);
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const auto [world, mode, stage_bytes, some_inactive] = info.param;
  return "world" + std::to_string(world) + (mode == Mode::kOwner ? "_owner" : "_gather") +
         (stage_bytes > 0 ? "_stages" : "_onestage") + (some_inactive ? "_someinactive" : "_allactive");
}

INSTANTIATE_TEST_SUITE_P(Worlds, ExchangePlanTest,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4), ::testing::Values(Mode::kOwner, Mode::kGather),
                                            ::testing::Values(int64_t{256}, int64_t{0}), ::testing::Bool()),
                         case_name);

TEST(ExchangePlan, BadArgumentsAreNamed) {
  const World world(model(2), 2, 1, 3);
  const dmuon::testing::EngineRun run = dmuon::testing::run_engine(world, EngineOptions{}, rules(), 1);
  const std::vector<bool> all(static_cast<size_t>(world.table().num_items()), true);
  EXPECT_NE(dmuon::testing::error_of([&] { dmuon::step::plan_exchange(world.table(), run.stages[0], Mode::kOwner, 2, all); })
                .find("rank 2 outside a world of 2"),
            std::string::npos);
  EXPECT_NE(dmuon::testing::error_of([&] { dmuon::step::plan_exchange(world.table(), run.stages[0], Mode::kOwner, 0, {true}); })
                .find("1 active flags for"),
            std::string::npos);
}

// One process: an engine makes one plan per set of parameters with gradients, keeps it
// across steps, and keeps at most kMaxExchangePlans of them (the oldest dropped first).
TEST(ExchangePlan, MadeOncePerSetOfActiveParameters) {
  std::vector<ModelParam> params;
  const size_t num_params = dmuon::step::StepEngine::kMaxExchangePlans + 2;
  for (size_t p = 0; p < num_params; ++p) params.push_back({"w" + std::to_string(p), {4, 3}, 0, true, DType::kFloat32, 0});
  const World world(params, 1, 1, 9);
  dmuon::testing::LoopbackWorld loopback(1);
  dmuon::step::CpuOps cpu;
  dmuon::step::StepEngine engine(loopback.transport(0), cpu, world.specs(), EngineOptions{});
  auto tensors = world.local(0);
  int64_t step = 0;
  // One step with parameter `without` (none: −1) lacking a gradient; the plan it ran.
  auto step_without = [&](int without) {
    world.set_grads(0, 1, tensors);
    for (size_t p = 0; p < num_params; ++p) tensors.has_grad[p] = static_cast<int>(p) != without;
    EXPECT_TRUE(engine.step(tensors.views(), rules(), ++step).applied());
    return engine.exchange_plan();
  };
  const auto all = step_without(-1);
  ASSERT_NE(all, nullptr);
  EXPECT_EQ(step_without(-1), all) << "the same set: the same plan";
  const auto without_0 = step_without(0);
  EXPECT_NE(without_0, all);
  EXPECT_EQ(step_without(-1), all);
  EXPECT_EQ(step_without(0), without_0);
  // Sets 1, 2, ... fill the cache; the oldest (every parameter active, made with the
  // stages) is dropped first and made anew.
  for (int p = 1; p < static_cast<int>(dmuon::step::StepEngine::kMaxExchangePlans); ++p) step_without(p);
  EXPECT_EQ(step_without(0), without_0);
  EXPECT_NE(step_without(-1), all);
}

// A step begun from backward: the stages exchanged inside backward move what the plan of
// every item says (the stage timeline keeps their bytes), and the step is the one-shot
// step's bit for bit.
TEST(ExchangePlan, StagesExchangedEarlyFollowThePlan) {
  constexpr int kWorld = 3;
  const World world(model(kWorld), kWorld, 1, 13);
  EngineOptions options;
  options.stage_bytes = 256;
  // NOTE: a deterministic planner: both runs plan alike (the MILP stops at a wall-clock limit).
  options.solver = dmuon::plan::SolverKind::kLpt;
  const dmuon::testing::EngineRun one_shot = dmuon::testing::run_engine(world, options, rules(), 1);
  dmuon::testing::expect_no_errors(one_shot, true);
  dmuon::testing::RunHooks hooks;
  hooks.step = [&](int, int s, dmuon::step::StepEngine& engine, dmuon::testing::RankTensors& t) {
    engine.begin_step(rules(), s);
    // Backward's order: the last items first, one at a time.
    for (int item = world.table().num_items() - 1; item >= 0; --item) engine.items_ready({item}, t.views());
    return engine.step(t.views(), rules(), s);
  };
  const dmuon::testing::EngineRun early = dmuon::testing::run_engine(world, options, rules(), 1, hooks);
  dmuon::testing::expect_no_errors(early, true);
  const std::vector<bool> all(static_cast<size_t>(world.table().num_items()), true);
  for (int r = 0; r < kWorld; ++r) {
    const auto& s = early.stats[static_cast<size_t>(r)];
    EXPECT_EQ(s.early_stages, static_cast<int64_t>(one_shot.stages[0].size())) << "every stage left early";
    const ExchangePlan plan = dmuon::step::plan_exchange(world.table(), one_shot.stages[0], Mode::kOwner, r, all);
    for (size_t st = 0; st < plan.stages.size(); ++st)
      for (int d = 0; d < kWorld; ++d) {
        const size_t k = static_cast<size_t>(d);
        EXPECT_EQ(s.stages[st].forward_sent_to[k], plan.stages[st].forward.send_counts[k] * 4);
        EXPECT_EQ(s.stages[st].return_received_from[k], plan.stages[st].back.recv_counts[k] * 4);
      }
  }
  EXPECT_EQ(dmuon::testing::state_bytes(early.tensors), dmuon::testing::state_bytes(one_shot.tensors));
}

}  // namespace

// Layer spreading of owner plans: loads unchanged bit for bit, layers spread to their
// bounds on transformer shapes, matrices without a layer left alone, argument errors,
// determinism and the serialize/deserialize round trip.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/check.h"
#include "error_of.h"
#include "plan/layer_spread.h"
#include "plan/planner.h"
#include "plan_fixtures.h"

namespace dmuon::plan {
namespace {

using dmuon::testing::error_of;

// A problem with its layer ids.
struct Layered {
  Problem problem;
  std::vector<int> layer_of;
};

// A decoder's Muon matrices in manifest order (all q, then all k, ...), GPU cost model.
Layered transformer(int num_layers, int64_t h, int64_t kv, int64_t i, int world_size) {
  Layered out;
  out.problem = decoder_problem(num_layers, h, kv, i, world_size, true, &out.layer_of);
  return out;
}

Layered qwen05b(int D) { return transformer(24, 896, 128, 4864, D); }
Layered llama8b(int D) { return transformer(32, 4096, 1024, 14336, D); }

// Random shapes (3-D stacks included), sparse layer ids, some matrices without a layer.
Layered random_layered(uint32_t seed, int num_matrices, int world_size) {
  std::mt19937 rng(seed);
  const int64_t dims[] = {32, 64, 128, 256};
  std::uniform_int_distribution<int> pick(0, 3), num_shapes_dist(1, 4), layer_dist(-1, 9);
  const int num_shapes = num_shapes_dist(rng);
  std::vector<MatrixSpec> shapes;
  for (int s = 0; s < num_shapes; ++s)
    shapes.push_back({"", dims[pick(rng)], dims[pick(rng)], s == 3 ? 4 : 1});
  std::uniform_int_distribution<int> which(0, num_shapes - 1);
  Layered out;
  std::vector<MatrixSpec> matrices;
  for (int i = 0; i < num_matrices; ++i) {
    MatrixSpec m = shapes[static_cast<size_t>(which(rng))];
    m.name = "m" + std::to_string(i);
    matrices.push_back(m);
    const int layer = layer_dist(rng);
    out.layer_of.push_back(layer < 0 ? -1 : layer * 7);  // ids 0, 7, 14, ...: not dense
  }
  ProblemOptions options;
  options.world_size = world_size;
  options.bandwidth_bytes_per_s = 2e9;
  AnalyticCostModel model;
  model.flops_per_second = 1e12;
  model.launch_overhead_s = 2e-5;
  out.problem = build_problem(matrices, options, model.as_cost_fn());
  return out;
}

// plan.owner agrees with the batches, and the text rebuilds exactly this plan elsewhere.
void expect_round_trip(const Problem& problem, const Plan& plan) {
  for (size_t r = 0; r < plan.ranks.size(); ++r)
    for (const Batch& batch : plan.ranks[r].batches) {
      EXPECT_TRUE(std::is_sorted(batch.matrix_idx.begin(), batch.matrix_idx.end()));
      for (int idx : batch.matrix_idx) EXPECT_EQ(plan.owner[static_cast<size_t>(idx)], static_cast<int>(r));
    }
  const std::string text = plan.serialize();
  const Plan again = deserialize_plan(problem, text);
  EXPECT_EQ(again.owner, plan.owner);
  EXPECT_EQ(again.serialize(), text);
  for (size_t r = 0; r < plan.ranks.size(); ++r) {
    ASSERT_EQ(again.ranks[r].batches.size(), plan.ranks[r].batches.size());
    for (size_t k = 0; k < plan.ranks[r].batches.size(); ++k)
      EXPECT_EQ(again.ranks[r].batches[k].matrix_idx, plan.ranks[r].batches[k].matrix_idx);
  }
}

// The least max bytes one rank publishes for one layer of these matrices, over every
// assignment to D ranks (no capacities): exhaustive, ranks used in order.
int64_t best_layer_max_bytes(const std::vector<int64_t>& bytes, int D) {
  std::vector<int64_t> load;
  int64_t best = std::numeric_limits<int64_t>::max();
  std::function<void(size_t)> place = [&](size_t k) {
    if (k == bytes.size()) {
      best = std::min(best, *std::max_element(load.begin(), load.end()));
      return;
    }
    for (size_t r = 0; r < load.size(); ++r) {
      load[r] += bytes[k];
      place(k + 1);
      load[r] -= bytes[k];
    }
    if (static_cast<int>(load.size()) < D) {
      load.push_back(bytes[k]);
      place(k + 1);
      load.pop_back();
    }
  };
  place(0);
  return best;
}

// ---- Loads -------------------------------------------------------------------------------

TEST(PlanLayerSpread, KeepsEveryLoadExactly) {
  for (uint32_t seed = 0; seed < 40; ++seed)
    for (SolverKind solver : {SolverKind::kRoundRobin, SolverKind::kLpt}) {
      const int D = 2 + static_cast<int>(seed % 7);
      const Layered in = random_layered(seed, 10 + static_cast<int>(seed % 5) * 9, D);
      const Plan before = solve(in.problem, solver);
      Plan after = before;
      spread_layers(in.problem, in.layer_of, after);
      SCOPED_TRACE("seed " + std::to_string(seed) + " D " + std::to_string(D) + " " + solver_name(solver));
      expect_same_loads(in.problem, before, after);
      expect_round_trip(in.problem, after);
    }
}

TEST(PlanLayerSpread, KeepsMilpLoadsOnTransformers) {
  MilpOptions options;
  options.max_nodes = 200;
  for (int D : {2, 4, 7, 8}) {
    const Layered in = qwen05b(D);
    const Plan before = solve(in.problem, SolverKind::kMilp, options);
    Plan after = before;
    spread_layers(in.problem, in.layer_of, after);
    SCOPED_TRACE("D " + std::to_string(D));
    expect_same_loads(in.problem, before, after);
    expect_round_trip(in.problem, after);
    EXPECT_LE(layer_spread_stats(in.problem, in.layer_of, after).max_bytes_per_owner,
              layer_spread_stats(in.problem, in.layer_of, before).max_bytes_per_owner);
  }
}

// ---- Quality -----------------------------------------------------------------------------

// 4 same-shape matrices per layer over D ranks with equal counts: every layer's matrices
// on min(4, D) distinct owners, the bound, from a plan that starts with whole layers
// on one rank (units are dealt to ranks in input order, layer by layer).
TEST(PlanLayerSpread, SameShapeLayersReachDistinctOwners) {
  for (int D : {2, 4, 8}) {
    std::vector<MatrixSpec> matrices;
    std::vector<int> layer_of;
    for (int l = 0; l < 16; ++l)
      for (int j = 0; j < 4; ++j) {
        matrices.push_back({"layers." + std::to_string(l) + ".w" + std::to_string(j), 512, 512});
        layer_of.push_back(l);
      }
    ProblemOptions options;
    options.world_size = D;
    const Problem problem = build_problem(matrices, options, AnalyticCostModel::gpu_default().as_cost_fn());
    Plan plan = solve(problem, SolverKind::kLpt);
    for (const auto& counts : class_counts(problem, plan)) ASSERT_EQ(counts[0], 64 / D);
    const LayerSpreadStats before = layer_spread_stats(problem, layer_of, plan);
    EXPECT_EQ(before.max_matrices_per_owner, 4) << "D " << D;
    spread_layers(problem, layer_of, plan);
    const LayerSpreadStats after = layer_spread_stats(problem, layer_of, plan);
    SCOPED_TRACE("D " + std::to_string(D));
    EXPECT_EQ(after.num_layers, 16);
    EXPECT_EQ(after.matrices_bound, (4 + D - 1) / D);
    EXPECT_EQ(after.max_matrices_per_owner, after.matrices_bound);
    EXPECT_EQ(after.max_collisions, std::max(0, 4 - D));
    EXPECT_EQ(after.total_collisions, 16 * std::max(0, 4 - D));
    EXPECT_EQ(after.max_bytes_per_owner, after.bytes_bound);
    // Every layer: min(4, D) distinct owners.
    for (int l = 0; l < 16; ++l) {
      std::vector<int> owners;
      for (int j = 0; j < 4; ++j) owners.push_back(plan.owner[static_cast<size_t>(4 * l + j)]);
      std::sort(owners.begin(), owners.end());
      EXPECT_EQ(std::unique(owners.begin(), owners.end()) - owners.begin(), std::min(4, D)) << "layer " << l;
    }
  }
}

// Qwen2.5-0.5B and Llama-3.1-8B shapes with LPT plans: the worst layer's publish bytes
// reach the best any assignment of one layer's 7 matrices to D ranks can do; with D ≥ 7
// the matrices per owner reach the bound this plan's counts allow (1 when every rank holds
// at most one matrix per layer on average).
TEST(PlanLayerSpread, TransformerLayersReachTheirBounds) {
  for (auto make : {qwen05b, llama8b})
    for (int D : {2, 4, 7, 8}) {
      const Layered in = make(D);
      Plan plan = solve(in.problem, SolverKind::kLpt);
      const LayerSpreadStats before = layer_spread_stats(in.problem, in.layer_of, plan);
      spread_layers(in.problem, in.layer_of, plan);
      const LayerSpreadStats after = layer_spread_stats(in.problem, in.layer_of, plan);
      std::vector<int64_t> layer_bytes;
      for (size_t i = 0; i < in.problem.matrices.size(); ++i)
        if (in.layer_of[i] == 0) layer_bytes.push_back(in.problem.matrices[i].wire_bytes);
      SCOPED_TRACE(in.problem.matrices[0].name + " rows " + std::to_string(in.problem.matrices[0].rows) +
                   " D " + std::to_string(D));
      EXPECT_EQ(after.max_bytes_per_owner, best_layer_max_bytes(layer_bytes, D));
      EXPECT_LT(after.max_bytes_per_owner, before.max_bytes_per_owner);
      EXPECT_LE(after.total_collisions, before.total_collisions);
      if (D >= 7) {
        EXPECT_EQ(after.max_matrices_per_owner, after.matrices_bound_for_counts);
      }
      if (D >= 4) {
        EXPECT_EQ(after.max_bytes_per_owner, after.bytes_bound);
      }
    }
}

// Llama-3.1-8B at D = 8 from LPT: every rank holds ≤ 32 matrices, so all 7 of every
// layer can sit on distinct owners; spreading gets there from 4 on one owner.
TEST(PlanLayerSpread, Llama8bAtEightRanksHasNoCollisions) {
  const Layered in = llama8b(8);
  Plan plan = solve(in.problem, SolverKind::kLpt);
  EXPECT_EQ(layer_spread_stats(in.problem, in.layer_of, plan).max_matrices_per_owner, 4);
  spread_layers(in.problem, in.layer_of, plan);
  const LayerSpreadStats stats = layer_spread_stats(in.problem, in.layer_of, plan);
  EXPECT_EQ(stats.matrices_bound_for_counts, 1);
  EXPECT_EQ(stats.max_matrices_per_owner, 1);
  EXPECT_EQ(stats.total_collisions, 0);
  EXPECT_EQ(stats.worst_layer, 0);  // every layer ties at one gate_proj; lowest id
}

// ---- Matrices without a layer ------------------------------------------------------------

TEST(PlanLayerSpread, MatricesWithoutLayerAreLeftAlone) {
  const Layered in = qwen05b(4);
  const Plan before = solve(in.problem, SolverKind::kLpt);
  // No layered matrix at all: the plan comes back unchanged.
  Plan plan = before;
  spread_layers(in.problem, std::vector<int>(in.problem.matrices.size(), -1), plan);
  EXPECT_EQ(plan.serialize(), before.serialize());
  EXPECT_EQ(layer_spread_stats(in.problem, std::vector<int>(in.problem.matrices.size(), -1), plan).num_layers,
            0);
  // Only the k/v class (128x896) has no layer: its owners stay, the rest is spread.
  std::vector<int> layer_of = in.layer_of;
  for (size_t i = 0; i < layer_of.size(); ++i)
    if (in.problem.matrices[i].rows == 128) layer_of[i] = -1;
  plan = before;
  spread_layers(in.problem, layer_of, plan);
  expect_same_loads(in.problem, before, plan);
  int num_moved = 0;
  for (size_t i = 0; i < layer_of.size(); ++i) {
    if (layer_of[i] < 0)
      EXPECT_EQ(plan.owner[i], before.owner[i]) << in.problem.matrices[i].name;
    else
      num_moved += plan.owner[i] != before.owner[i];
  }
  EXPECT_GT(num_moved, 0);
  // Half of a class without a layer: they keep their owner where the rank has room left.
  layer_of = in.layer_of;
  for (size_t i = 0; i < layer_of.size(); ++i)
    if (in.problem.matrices[i].rows == 896 && in.problem.matrices[i].cols == 896 && in.layer_of[i] % 2)
      layer_of[i] = -1;
  plan = before;
  spread_layers(in.problem, layer_of, plan);
  expect_same_loads(in.problem, before, plan);
  expect_round_trip(in.problem, plan);
}

// ---- Errors, determinism, round trip -----------------------------------------------------

TEST(PlanLayerSpread, BadInputsNameTheArgument) {
  const Layered in = qwen05b(4);
  Plan plan = solve(in.problem, SolverKind::kLpt);
  const std::string original = plan.serialize();
  const std::string short_layers = error_of([&] { spread_layers(in.problem, {0, 1, 2}, plan); });
  EXPECT_NE(short_layers.find("layer_of has 3 entries, the problem has 168 matrices"), std::string::npos)
      << short_layers;
  EXPECT_NE(error_of([&] { layer_spread_stats(in.problem, {}, plan); }).find("layer_of has 0 entries"),
            std::string::npos);
  std::vector<int> negative = in.layer_of;
  negative[5] = -2;
  const std::string bad_id = error_of([&] { spread_layers(in.problem, negative, plan); });
  EXPECT_NE(bad_id.find("layer_of[5] = -2"), std::string::npos) << bad_id;
  EXPECT_NE(bad_id.find("model.layers.5.self_attn.q_proj.weight"), std::string::npos) << bad_id;
  const Layered other = qwen05b(8);
  const std::string wrong_plan = error_of([&] { spread_layers(other.problem, other.layer_of, plan); });
  EXPECT_NE(wrong_plan.find("hash"), std::string::npos) << wrong_plan;
  // Nothing changed on errors.
  EXPECT_EQ(plan.serialize(), original);
}

TEST(PlanLayerSpread, DeterministicAndIdempotent) {
  for (int D : {3, 8}) {
    const Layered in = llama8b(D);
    const Plan base = solve(in.problem, SolverKind::kLpt);
    Plan first = base, second = base;
    spread_layers(in.problem, in.layer_of, first);
    spread_layers(in.problem, in.layer_of, second);
    EXPECT_EQ(first.serialize(), second.serialize());
    Plan again = first;
    spread_layers(in.problem, in.layer_of, again);
    EXPECT_EQ(again.serialize(), first.serialize());
  }
}

TEST(PlanLayerSpread, SerializedOnRankZeroSameOwnersElsewhere) {
  for (int D : {2, 4, 7, 8}) {
    // Rank 0 solves and spreads; another rank rebuilds the same problem and reads the text.
    const Layered rank0 = qwen05b(D);
    Plan plan = solve(rank0.problem, SolverKind::kLpt);
    spread_layers(rank0.problem, rank0.layer_of, plan);
    const Layered rank1 = qwen05b(D);
    const Plan received = deserialize_plan(rank1.problem, plan.serialize());
    EXPECT_EQ(received.owner, plan.owner);
    EXPECT_EQ(received.makespan, plan.makespan);
    EXPECT_EQ(layer_spread_stats(rank1.problem, rank1.layer_of, received).max_bytes_per_owner,
              layer_spread_stats(rank0.problem, rank0.layer_of, plan).max_bytes_per_owner);
    expect_round_trip(rank0.problem, plan);
  }
}

// ---- Statistics --------------------------------------------------------------------------

// Hand-checked: D = 2; layer 3 has a, b (2·64·64 = 8192 bytes each) and c (2·32·64 = 4096);
// layer 9 has d (8192); e has no layer. Plan: a, b, d, e on rank 0; c on rank 1.
TEST(PlanLayerSpread, StatsCountCollisionsBytesAndBounds) {
  const std::vector<MatrixSpec> matrices = {
      {"a", 64, 64}, {"b", 64, 64}, {"d", 64, 64}, {"e", 64, 64}, {"c", 32, 64}};
  ProblemOptions options;
  options.world_size = 2;
  const Problem problem = build_problem(matrices, options, AnalyticCostModel::gpu_default().as_cost_fn());
  const Plan plan = assemble_plan(problem, {{{4}, {}}, {{}, {1}}}, "manual");
  const std::vector<int> layer_of = {3, 3, 9, -1, 3};
  const LayerSpreadStats stats = layer_spread_stats(problem, layer_of, plan);
  EXPECT_EQ(stats.num_layers, 2);
  EXPECT_EQ(stats.worst_layer, 3);
  EXPECT_EQ(stats.max_matrices_per_owner, 2);
  EXPECT_EQ(stats.max_collisions, 1);  // layer 3: 3 matrices on 2 owners
  EXPECT_EQ(stats.total_collisions, 1);
  EXPECT_EQ(stats.max_bytes_per_owner, 16384);
  EXPECT_EQ(stats.matrices_bound, 2);    // ceil(3 / 2)
  EXPECT_EQ(stats.collisions_bound, 1);  // 3 − 2
  EXPECT_EQ(stats.bytes_bound, 10240);   // ceil(20480 / 2)
  // Rank 0 holds 4 units of the 64x64 class, 1 of which has no layer: ≥ 3 layered over
  // 2 layers, so some layer has 2 (16384 bytes) there whatever the spreading.
  EXPECT_EQ(stats.matrices_bound_for_counts, 2);
  EXPECT_EQ(stats.bytes_bound_for_counts, 12288);
  // Spreading can only trade a and b with d and e; layer 3 keeps two 64x64 on rank 0.
  Plan spread = plan;
  spread_layers(problem, layer_of, spread);
  EXPECT_EQ(layer_spread_stats(problem, layer_of, spread).max_bytes_per_owner, 16384);
}

}  // namespace
}  // namespace dmuon::plan

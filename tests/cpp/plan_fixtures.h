// tests/cpp/plan_fixtures.h — what the owner-planner tests share: a decoder's Muon matrices
// on the GPU cost model, and the check that a plan's loads survived a rearrangement.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "plan/planner.h"

namespace dmuon::plan {

/// A decoder's Muon matrices over `world_size` ranks (GPU cost model): per layer q and o
/// (h×h), k and v (kv×h), gate and up (i×h), down (h×i); layer by layer, or with
/// `kind_major` in manifest order (every q, then every k, ...). `layer_of`: their layers.
inline Problem decoder_problem(int num_layers, int64_t h, int64_t kv, int64_t i, int world_size, bool kind_major,
                               std::vector<int>* layer_of = nullptr) {
  const std::pair<const char*, std::pair<int64_t, int64_t>> kinds[] = {
      {"self_attn.q_proj", {h, h}}, {"self_attn.k_proj", {kv, h}}, {"self_attn.v_proj", {kv, h}},
      {"self_attn.o_proj", {h, h}}, {"mlp.gate_proj", {i, h}},     {"mlp.up_proj", {i, h}},
      {"mlp.down_proj", {h, i}}};
  std::vector<MatrixSpec> matrices;
  for (int outer = 0; outer < (kind_major ? 7 : num_layers); ++outer)
    for (int inner = 0; inner < (kind_major ? num_layers : 7); ++inner) {
      const int l = kind_major ? inner : outer;
      const auto& [name, shape] = kinds[kind_major ? outer : inner];
      matrices.push_back({"model.layers." + std::to_string(l) + "." + name + ".weight", shape.first, shape.second});
      if (layer_of != nullptr) layer_of->push_back(l);
    }
  ProblemOptions options;
  options.world_size = world_size;
  return build_problem(matrices, options, AnalyticCostModel::gpu_default().as_cost_fn());
}

/// Units of each shape class on each rank: [rank][class].
inline std::vector<std::vector<int>> class_counts(const Problem& problem, const Plan& plan) {
  std::vector<std::vector<int>> counts(plan.ranks.size(), std::vector<int>(problem.shapes.size(), 0));
  for (size_t s = 0; s < problem.shapes.size(); ++s)
    for (int idx : problem.shapes[s].matrix_idx) ++counts[static_cast<size_t>(plan.owner[static_cast<size_t>(idx)])][s];
  return counts;
}

/// Everything but which matrices fill the batches is identical, bit for bit.
inline void expect_same_loads(const Problem& problem, const Plan& before, const Plan& after) {
  ASSERT_EQ(before.ranks.size(), after.ranks.size());
  EXPECT_EQ(before.makespan, after.makespan);
  EXPECT_EQ(before.lower_bound, after.lower_bound);
  EXPECT_EQ(before.solver, after.solver);
  EXPECT_EQ(before.status, after.status);
  EXPECT_EQ(class_counts(problem, before), class_counts(problem, after));
  for (size_t r = 0; r < before.ranks.size(); ++r) {
    const RankPlan& a = before.ranks[r];
    const RankPlan& b = after.ranks[r];
    EXPECT_EQ(a.compute_seconds, b.compute_seconds);
    EXPECT_EQ(a.recv_seconds, b.recv_seconds);
    EXPECT_EQ(a.load_seconds, b.load_seconds);
    EXPECT_EQ(a.recv_bytes, b.recv_bytes);
    EXPECT_EQ(a.memory_bytes, b.memory_bytes);
    ASSERT_EQ(a.batches.size(), b.batches.size());
    for (size_t k = 0; k < a.batches.size(); ++k) {
      EXPECT_EQ(a.batches[k].shape_idx, b.batches[k].shape_idx);
      EXPECT_EQ(a.batches[k].matrix_idx.size(), b.batches[k].matrix_idx.size());
      EXPECT_EQ(a.batches[k].num_matrices, b.batches[k].num_matrices);
      EXPECT_EQ(a.batches[k].compute_seconds, b.batches[k].compute_seconds);
      EXPECT_EQ(a.batches[k].recv_seconds, b.batches[k].recv_seconds);
    }
  }
}

}  // namespace dmuon::plan

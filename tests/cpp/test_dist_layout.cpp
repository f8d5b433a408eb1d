// Row layouts of sharded/replicated parameters and the bucket interleaving.
#include <gtest/gtest.h>

#include <algorithm>

#include "common/check.h"
#include "dist/buckets.h"
#include "dist/shard_layout.h"

namespace {

using dmuon::dist::RowBlock;

TEST(ShardLayout, ChunkRowsFollowsTorchChunk) {
  // torch.chunk(10, 4) → 3, 3, 3, 1; torch.chunk(5, 4) → 2, 2, 1, 0; torch.chunk(2, 4) → 1, 1, 0, 0
  EXPECT_EQ(dmuon::dist::chunk_rows(10, 4),
            (std::vector<RowBlock>{{0, 3}, {3, 3}, {6, 3}, {9, 1}}));
  EXPECT_EQ(dmuon::dist::chunk_rows(5, 4), (std::vector<RowBlock>{{0, 2}, {2, 2}, {4, 1}, {5, 0}}));
  EXPECT_EQ(dmuon::dist::chunk_rows(2, 4), (std::vector<RowBlock>{{0, 1}, {1, 1}, {2, 0}, {2, 0}}));
  EXPECT_EQ(dmuon::dist::chunk_rows(6, 4), (std::vector<RowBlock>{{0, 2}, {2, 2}, {4, 2}, {6, 0}}));
  EXPECT_EQ(dmuon::dist::chunk_rows(7, 1), (std::vector<RowBlock>{{0, 7}}));
  EXPECT_THROW(dmuon::dist::chunk_rows(7, 0), dmuon::Error);
}

TEST(ShardLayout, FlatViewsOfMatricesStacksAndConvs) {
  dmuon::dist::ParamLayout linear{{12, 5}, 0, true};
  EXPECT_EQ(linear.flat_rows(), 12);
  EXPECT_EQ(linear.cols(), 5);
  dmuon::dist::ParamLayout stack{{3, 4, 6}, 1, true};
  EXPECT_EQ(stack.flat_rows(), 12);
  EXPECT_EQ(stack.cols(), 6);
  EXPECT_EQ(stack.num_matrices(), 3);
  EXPECT_EQ(stack.matrix_rows(), 4);
  EXPECT_EQ(stack.rank_rows(2), (std::vector<RowBlock>{{0, 8}, {8, 4}}));
  dmuon::dist::ParamLayout conv{{8, 3, 3, 3}, 0, true};
  EXPECT_EQ(conv.cols(), 27);
  dmuon::dist::ParamLayout replicated{{5, 7}, 0, false};
  EXPECT_EQ(replicated.rank_rows(3), (std::vector<RowBlock>{{0, 5}, {0, 5}, {0, 5}}));
  dmuon::dist::ParamLayout vector{{5}, 0, true};
  EXPECT_THROW(vector.validate("w"), dmuon::Error);
}

TEST(ShardLayout, MatrixBlocksOfStacksMatricesAndRowBlocks) {
  dmuon::dist::ParamLayout stack{{3, 4, 6}, 1, false};
  EXPECT_EQ(stack.matrix_blocks(), (std::vector<RowBlock>{{0, 4}, {4, 4}, {8, 4}}));
  EXPECT_TRUE(stack.uniform());
  dmuon::dist::ParamLayout matrix{{12, 5}, 0, true};
  EXPECT_EQ(matrix.matrix_blocks(), (std::vector<RowBlock>{{0, 12}}));
  // A fused q, k, v projection: three equal blocks, planned and batched as a stack.
  dmuon::dist::ParamLayout qkv{{12, 4}, 0, true, {4, 4, 4}};
  qkv.validate("qkv");
  EXPECT_TRUE(qkv.uniform());
  EXPECT_EQ(qkv.num_matrices(), 3);
  EXPECT_EQ(qkv.matrix_rows(), 4);
  EXPECT_EQ(qkv.matrix_blocks(), (std::vector<RowBlock>{{0, 4}, {4, 4}, {8, 4}}));
  // Sharding still follows dim 0's chunks, across block boundaries.
  EXPECT_EQ(qkv.rank_rows(2), (std::vector<RowBlock>{{0, 6}, {6, 6}}));
  // Grouped-query attention: q larger than k and v.
  dmuon::dist::ParamLayout gqa{{16, 4}, 0, false, {8, 4, 4}};
  gqa.validate("gqa");
  EXPECT_FALSE(gqa.uniform());
  EXPECT_EQ(gqa.matrix_blocks(), (std::vector<RowBlock>{{0, 8}, {8, 4}, {12, 4}}));
}

TEST(ShardLayout, RowBlocksAreCheckedAndTransposedSwapsTheUpdateShape) {
  dmuon::dist::ParamLayout short_blocks{{12, 4}, 0, false, {4, 4}};
  EXPECT_THROW(short_blocks.validate("w"), dmuon::Error);
  dmuon::dist::ParamLayout empty_block{{8, 4}, 0, false, {8, 0}};
  EXPECT_THROW(empty_block.validate("w"), dmuon::Error);
  dmuon::dist::ParamLayout stacked_blocks{{2, 8, 4}, 1, false, {4, 4}};
  EXPECT_THROW(stacked_blocks.validate("w"), dmuon::Error);
  // HF Conv1D stores (in, out): a 3·768 × 768 projection is held as [768, 2304].
  dmuon::dist::ParamLayout conv1d{{768, 2304}, 0, false, {}, true};
  EXPECT_EQ(conv1d.update_shape(conv1d.matrix_rows()), (std::pair<int64_t, int64_t>{2304, 768}));
  dmuon::dist::ParamLayout linear{{2304, 768}, 0, false};
  EXPECT_EQ(linear.update_shape(linear.matrix_rows()), (std::pair<int64_t, int64_t>{2304, 768}));
}

TEST(Buckets, InterleaveOwnersAndRespectTheSize) {
  // Rank 0 owns 0, 1, 2; rank 1 owns 3; rank 2 owns nothing.
  const std::vector<std::vector<int>> order = {{0, 1, 2}, {3}, {}};
  const std::vector<int64_t> bytes = {10, 10, 10, 10};
  auto buckets = dmuon::dist::make_buckets(order, bytes, 20);
  ASSERT_EQ(buckets.size(), 2u);
  EXPECT_EQ(buckets[0].param_idx, (std::vector<int>{0, 3}));
  EXPECT_EQ(buckets[1].param_idx, (std::vector<int>{1, 2}));
  auto single = dmuon::dist::make_buckets(order, bytes, 0);
  ASSERT_EQ(single.size(), 1u);
  EXPECT_EQ(single[0].wire_bytes, 40);
  EXPECT_THROW(dmuon::dist::make_buckets({{0}, {0}}, {1}, 0), dmuon::Error);
  EXPECT_THROW(dmuon::dist::make_buckets({{0}}, {1, 1}, 0), dmuon::Error);
}

}  // namespace

namespace {

std::vector<size_t> run_sizes(const std::vector<std::vector<int>>& runs, const std::vector<int64_t>& counts) {
  std::vector<size_t> sizes;
  for (const auto& run : runs) {
    int64_t total = 0;
    for (int i : run) total += counts[static_cast<size_t>(i)];
    sizes.push_back(static_cast<size_t>(total));
  }
  return sizes;
}

TEST(SplitNearEqual, FewestRunsOfAtMostTwoSizes) {
  // 84 Qwen2.5-7B gate/up/down matrices, 5 per 2 GiB batch: 17 runs, 16 of 5 and one of 4.
  const std::vector<int64_t> ones(84, 1);
  const auto runs = dmuon::dist::split_near_equal(ones, 5);
  ASSERT_EQ(runs.size(), 17u);
  const auto sizes = run_sizes(runs, ones);
  EXPECT_EQ(std::count(sizes.begin(), sizes.end(), 5u), 16);
  EXPECT_EQ(std::count(sizes.begin(), sizes.end(), 4u), 1);
  // 10 in runs of ≤ 4: ⌈10/4⌉ = 3 runs of at most ⌈10/3⌉ = 4: 4, 4, 2.
  EXPECT_EQ(run_sizes(dmuon::dist::split_near_equal(std::vector<int64_t>(10, 1), 4), std::vector<int64_t>(10, 1)),
            (std::vector<size_t>{4, 4, 2}));
  // 9 in runs of ≤ 4: 3 runs of 3 (not 4, 4, 1).
  EXPECT_EQ(run_sizes(dmuon::dist::split_near_equal(std::vector<int64_t>(9, 1), 4), std::vector<int64_t>(9, 1)),
            (std::vector<size_t>{3, 3, 3}));
  // Everything fits: one run, in order.
  EXPECT_EQ(dmuon::dist::split_near_equal({1, 1, 1}, 100), (std::vector<std::vector<int>>{{0, 1, 2}}));
  EXPECT_TRUE(dmuon::dist::split_near_equal({}, 3).empty());
}

TEST(SplitNearEqual, StacksOfMatricesAndOversizedItems) {
  // Items of 3 matrices (a [3, m, n] parameter) under capacity 4: one item per run.
  EXPECT_EQ(dmuon::dist::split_near_equal({3, 3, 3}, 4), (std::vector<std::vector<int>>{{0}, {1}, {2}}));
  // An item above the capacity is a run of its own; its neighbours are not merged into it.
  EXPECT_EQ(dmuon::dist::split_near_equal({1, 5, 1}, 2), (std::vector<std::vector<int>>{{0}, {1}, {2}}));
  EXPECT_THROW(dmuon::dist::split_near_equal({1, 1}, 0), dmuon::Error);
  EXPECT_THROW(dmuon::dist::split_near_equal({1, 0}, 2), dmuon::Error);
}

}  // namespace

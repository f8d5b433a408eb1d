// Row layouts of sharded/replicated parameters and the bucket interleaving.
#include <gtest/gtest.h>

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

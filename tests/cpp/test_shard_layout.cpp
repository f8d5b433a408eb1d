// Row layouts of sharded/replicated parameters.
#include <gtest/gtest.h>


#include "common/check.h"
#include "layout/shard_layout.h"

namespace {

using dmuon::layout::RowBlock;

TEST(ShardLayout, ChunkRowsFollowsTorchChunk) {
  // torch.chunk(10, 4) → 3, 3, 3, 1; torch.chunk(5, 4) → 2, 2, 1, 0; torch.chunk(2, 4) → 1, 1, 0, 0
  EXPECT_EQ(dmuon::layout::chunk_rows(10, 4),
            (std::vector<RowBlock>{{0, 3}, {3, 3}, {6, 3}, {9, 1}}));
  EXPECT_EQ(dmuon::layout::chunk_rows(5, 4), (std::vector<RowBlock>{{0, 2}, {2, 2}, {4, 1}, {5, 0}}));
  EXPECT_EQ(dmuon::layout::chunk_rows(2, 4), (std::vector<RowBlock>{{0, 1}, {1, 1}, {2, 0}, {2, 0}}));
  EXPECT_EQ(dmuon::layout::chunk_rows(6, 4), (std::vector<RowBlock>{{0, 2}, {2, 2}, {4, 2}, {6, 0}}));
  EXPECT_EQ(dmuon::layout::chunk_rows(7, 1), (std::vector<RowBlock>{{0, 7}}));
  EXPECT_THROW(dmuon::layout::chunk_rows(7, 0), dmuon::Error);
}

TEST(ShardLayout, FlatViewsOfMatricesStacksAndConvs) {
  dmuon::layout::ParamLayout linear{{12, 5}, 0, true};
  EXPECT_EQ(linear.flat_rows(), 12);
  EXPECT_EQ(linear.cols(), 5);
  dmuon::layout::ParamLayout stack{{3, 4, 6}, 1, true};
  EXPECT_EQ(stack.flat_rows(), 12);
  EXPECT_EQ(stack.cols(), 6);
  EXPECT_EQ(stack.num_matrices(), 3);
  EXPECT_EQ(stack.matrix_rows(), 4);
  EXPECT_EQ(stack.rank_rows(2), (std::vector<RowBlock>{{0, 8}, {8, 4}}));
  dmuon::layout::ParamLayout conv{{8, 3, 3, 3}, 0, true};
  EXPECT_EQ(conv.cols(), 27);
  dmuon::layout::ParamLayout replicated{{5, 7}, 0, false};
  EXPECT_EQ(replicated.rank_rows(3), (std::vector<RowBlock>{{0, 5}, {0, 5}, {0, 5}}));
  dmuon::layout::ParamLayout vector{{5}, 0, true};
  EXPECT_THROW(vector.validate("w"), dmuon::Error);
}

TEST(ShardLayout, MatrixBlocksOfStacksMatricesAndRowBlocks) {
  dmuon::layout::ParamLayout stack{{3, 4, 6}, 1, false};
  EXPECT_EQ(stack.matrix_blocks(), (std::vector<RowBlock>{{0, 4}, {4, 4}, {8, 4}}));
  EXPECT_TRUE(stack.uniform());
  dmuon::layout::ParamLayout matrix{{12, 5}, 0, true};
  EXPECT_EQ(matrix.matrix_blocks(), (std::vector<RowBlock>{{0, 12}}));
  // A fused q, k, v projection: three equal blocks, planned and batched as a stack.
  dmuon::layout::ParamLayout qkv{{12, 4}, 0, true, {4, 4, 4}};
  qkv.validate("qkv");
  EXPECT_TRUE(qkv.uniform());
  EXPECT_EQ(qkv.num_matrices(), 3);
  EXPECT_EQ(qkv.matrix_rows(), 4);
  EXPECT_EQ(qkv.matrix_blocks(), (std::vector<RowBlock>{{0, 4}, {4, 4}, {8, 4}}));
  // Sharding still follows dim 0's chunks, across block boundaries.
  EXPECT_EQ(qkv.rank_rows(2), (std::vector<RowBlock>{{0, 6}, {6, 6}}));
  // Grouped-query attention: q larger than k and v.
  dmuon::layout::ParamLayout gqa{{16, 4}, 0, false, {8, 4, 4}};
  gqa.validate("gqa");
  EXPECT_FALSE(gqa.uniform());
  EXPECT_EQ(gqa.matrix_blocks(), (std::vector<RowBlock>{{0, 8}, {8, 4}, {12, 4}}));
}

TEST(ShardLayout, RowBlocksAreCheckedAndTransposedSwapsTheUpdateShape) {
  dmuon::layout::ParamLayout short_blocks{{12, 4}, 0, false, {4, 4}};
  EXPECT_THROW(short_blocks.validate("w"), dmuon::Error);
  dmuon::layout::ParamLayout empty_block{{8, 4}, 0, false, {8, 0}};
  EXPECT_THROW(empty_block.validate("w"), dmuon::Error);
  // A stack's row blocks cut every matrix's rows (dim 1): a fused gate/up expert stack.
  dmuon::layout::ParamLayout gate_up{{2, 8, 4}, 1, false, {4, 4}};
  gate_up.validate("gate_up");
  EXPECT_EQ(gate_up.num_matrices(), 4);
  EXPECT_EQ(gate_up.matrix_rows(), 4);
  EXPECT_EQ(gate_up.matrix_blocks(), (std::vector<RowBlock>{{0, 4}, {4, 4}, {8, 4}, {12, 4}}));
  dmuon::layout::ParamLayout stacked_short{{2, 8, 4}, 1, false, {4, 2}};
  EXPECT_THROW(stacked_short.validate("w"), dmuon::Error);
  // HF Conv1D stores (in, out): a 3·768 × 768 projection is held as [768, 2304].
  dmuon::layout::ParamLayout conv1d{{768, 2304}, 0, false, {}, true};
  EXPECT_EQ(conv1d.update_shape(conv1d.matrix_rows()), (std::pair<int64_t, int64_t>{2304, 768}));
  dmuon::layout::ParamLayout linear{{2304, 768}, 0, false};
  EXPECT_EQ(linear.update_shape(linear.matrix_rows()), (std::pair<int64_t, int64_t>{2304, 768}));
}

}  // namespace

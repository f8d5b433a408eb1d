// Column blocks (split_heads=n, split_dim=1, o_proj per head): the item table
// makes block j of a [rows, k·d] parameter a rows×d item of its own, each rank's piece its
// rows × the block's columns, strided in the local tensor (rows `local cols` apart); the
// whole engine (CPU ops, loopback transport) steps them in place against the fp64 Muon
// run block by block, sharded (uneven, empty shards), replicated and in 2-D pieces; ops
// that do not read strided views refuse such parameters by name.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "common/check.h"
#include "step_expect.h"
#include "step_world.h"

namespace {

using dmuon::layout::DimPlacement;
using dmuon::layout::PlacementKind;
using dmuon::step::DType;
using dmuon::step::EngineOptions;
using dmuon::step::GroupRule;
using dmuon::step::ItemTable;
using dmuon::step::Mode;
using dmuon::testing::EngineRun;
using dmuon::testing::ModelParam;
using dmuon::testing::World;

dmuon::layout::ParamLayout col_block_layout(std::vector<int64_t> shape, bool sharded, int64_t blocks) {
  dmuon::layout::ParamLayout layout{std::move(shape), 0, sharded};
  layout.col_blocks = blocks;
  return layout;
}

struct Expected {
  int item, rank;
  int64_t row_begin, row_count, local_offset, col_begin, col_count, ld;
  bool strided;
};

void expect_pieces(const ItemTable& table, const std::vector<Expected>& expected) {
  for (const Expected& e : expected) {
    const auto& p = table.piece(e.item, e.rank);
    const std::string where = "item " + std::to_string(e.item) + " on rank " + std::to_string(e.rank);
    EXPECT_EQ(p.row_begin, e.row_begin) << where;
    EXPECT_EQ(p.row_count, e.row_count) << where;
    EXPECT_EQ(p.local_offset, e.local_offset) << where;
    EXPECT_EQ(p.col_begin, e.col_begin) << where;
    EXPECT_EQ(p.col_count, e.col_count) << where;
    EXPECT_EQ(p.ld, e.ld) << where;
    EXPECT_EQ(p.strided(), e.strided) << where;
  }
}

// ---------------------------------------------------------------- the item table
TEST(ColBlockItems, ShardedRowsOfEveryBlockAreStridedPiecesAtWorld3) {
  // o_proj [7, 3·4] (3 heads of 4 columns), Shard(0) over 3 ranks: rows [0,3) [3,6) [6,7).
  const ItemTable o({{"o", col_block_layout({7, 12}, true, 3), DType::kFloat32, 0}}, 3);
  ASSERT_EQ(o.num_items(), 3);
  for (int j = 0; j < 3; ++j) {
    EXPECT_EQ(o.item(j).rows, 7);
    EXPECT_EQ(o.item(j).cols, 4);
    EXPECT_EQ(o.item(j).matrix_idx, j);
    EXPECT_EQ(o.item_name(j), "o[:, " + std::to_string(j) + "]");
  }
  // Block j of rank r: its rows, at column j·4 of its first local row, rows 12 apart; the
  // one-row chunk of rank 2 is contiguous.
  std::vector<Expected> expected;
  for (int j = 0; j < 3; ++j) {
    expected.push_back({j, 0, 0, 3, 4 * j, 0, 4, 12, true});
    expected.push_back({j, 1, 3, 3, 4 * j, 0, 4, 12, true});
    expected.push_back({j, 2, 6, 1, 4 * j, 0, 4, 12, false});
  }
  expect_pieces(o, expected);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(o.local_numel(0, r), (r < 2 ? 3 : 1) * 12);
    EXPECT_EQ(o.strided_on(0, r), r < 2);
    for (int j = 0; j < 3; ++j) EXPECT_FALSE(o.whole_on(j, r));
  }

  // 2 rows over 3 ranks: rank 2 holds nothing of any block.
  const ItemTable few({{"few", col_block_layout({2, 6}, true, 2), DType::kFloat32, 0}}, 3);
  for (int j = 0; j < 2; ++j) {
    EXPECT_EQ(few.piece(j, 0).row_count, 1);
    EXPECT_EQ(few.piece(j, 1).row_begin, 1);
    EXPECT_TRUE(few.piece(j, 2).empty());
    EXPECT_EQ(few.source(j, 2, 0), -1);
  }

  // Replicated (DDP) over 3 ranks: every rank holds every block whole, strided; a replica
  // set whose lowest rank sends.
  const ItemTable rep({{"rep", col_block_layout({5, 6}, false, 3), DType::kFloat32, 0}}, 3);
  for (int j = 0; j < 3; ++j)
    for (int r = 0; r < 3; ++r) {
      EXPECT_TRUE(rep.whole_on(j, r));
      EXPECT_TRUE(rep.replicated_on(j, r));
      expect_pieces(rep, {{j, r, 0, 5, 2 * j, 0, 2, 6, true}});
    }
  EXPECT_EQ(rep.source(1, 2, 0), 0);
  EXPECT_EQ(rep.first_whole_holder(2), 0);
}

TEST(ColBlockItems, ColumnShardsCutBlocksIntoTwoDimensionalPieces) {
  // [4, 12] in 2 blocks of 6 columns, Shard(1) over 3 ranks: columns [0,4) [4,8) [8,12).
  const DimPlacement cols{PlacementKind::kShard, 1, 1};
  dmuon::layout::ParamLayout layout = col_block_layout({4, 12}, true, 2);
  layout.mesh = dmuon::testing::row_major_mesh({3}, {cols});
  const ItemTable t({{"tp", layout, DType::kFloat32, 0}}, 3);
  expect_pieces(t, {
                       {0, 0, 0, 4, 0, 0, 4, 4, false},  // block 0's columns 0–3: all of rank 0's
                       {0, 1, 0, 4, 0, 4, 2, 4, true},   // block 0's columns 4–5: rank 1's first two
                       {1, 1, 0, 4, 2, 0, 2, 4, true},   // block 1's columns 0–1: rank 1's last two
                       {1, 2, 0, 4, 0, 2, 4, 4, false},  // block 1's columns 2–5: all of rank 2's
                   });
  EXPECT_TRUE(t.piece(0, 2).empty());
  EXPECT_TRUE(t.piece(1, 0).empty());
}

TEST(ColBlockItems, BadColumnBlocksAreNamed) {
  const auto error_of = [](dmuon::layout::ParamLayout layout) {
    try {
      ItemTable({{"o_proj", std::move(layout), DType::kFloat32, 0}}, 2);
    } catch (const dmuon::Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error_of(col_block_layout({4, 10}, true, 3)).find("o_proj: 10 columns are not divisible into 3"),
            std::string::npos);
  dmuon::layout::ParamLayout rows = col_block_layout({4, 12}, true, 2);
  rows.row_blocks = {2, 2};
  EXPECT_NE(error_of(rows).find("o_proj: 2 column blocks need one 2-D matrix without row blocks"), std::string::npos);
  dmuon::layout::ParamLayout stack{{2, 4, 6}, 1, true};
  stack.col_blocks = 2;
  EXPECT_NE(error_of(stack).find("o_proj: 2 column blocks need one 2-D matrix"), std::string::npos);
}

// ---------------------------------------------------------------- the engine
// Per-head o_proj-like weights: sharded (uneven), replicated (DDP), bfloat16, next to a
// plain matrix of a block's shape (batched with the blocks), two groups with lr ratios.
std::vector<ModelParam> col_block_model() {
  std::vector<ModelParam> model = {
      {"o_proj", {7, 12}, 0, true, DType::kFloat32, 0},      {"o_replicated", {6, 9}, 0, false, DType::kFloat32, 0},
      {"o_half", {8, 8}, 0, true, DType::kBFloat16, 1},      {"plain", {7, 4}, 0, true, DType::kFloat32, 0},
      {"o_few_rows", {2, 6}, 0, true, DType::kFloat32, 1},
  };
  model[0].col_blocks = 3;
  model[1].col_blocks = 3;
  model[2].col_blocks = 2;
  model[4].col_blocks = 2;
  return model;
}

std::vector<GroupRule> col_block_rules() {
  return {dmuon::testing::gram_rule(0.5, 0.01, true, "original"),
          dmuon::testing::standard_rule(0.5, 0.0, false, "match_rms_adamw")};
}

TEST(ColBlockEngine, EachBlockIsOrthogonalizedAsItsOwnMatrixInPlace) {
  const std::vector<GroupRule> rules = col_block_rules();
  for (int world_size : {1, 3})
    for (Mode mode : {Mode::kOwner, Mode::kGather}) {
      const World world(col_block_model(), world_size, 2, 29);
      EXPECT_EQ(world.table().num_items(), 11);
      EngineOptions options;
      options.mode = mode;
      options.solver = dmuon::plan::SolverKind::kLpt;
      options.stage_bytes = 256;  // NOTE: several stages
      const EngineRun run = dmuon::testing::run_engine(world, options, rules, 2);
      SCOPED_TRACE("world " + std::to_string(world_size) + ", " + dmuon::step::mode_name(mode));
      dmuon::testing::expect_no_errors(run, true);
      // NOTE: the row blocks' bound (float32 NS and wire against fp64); bfloat16 weights
      // round the update to 8 bits.
      dmuon::testing::expect_matches_reference(world, run, rules, 2, [](const ModelParam& p) {
        const bool half = p.dtype == DType::kBFloat16;
        return std::make_pair(half ? 3e-2 : 1e-4, half ? 1e-2 : 1e-6);
      });
    }
}

TEST(ColBlockEngine, OpsWithoutStridedViewsRefuseColumnBlocksByName) {
  struct ContiguousOnly : dmuon::testing::ForwardingOps {
    using ForwardingOps::ForwardingOps;
    bool strided_pieces(DType) const override { return false; }
  };
  const World world(col_block_model(), 3, 1, 5);
  dmuon::testing::RunHooks hooks;
  std::vector<std::unique_ptr<ContiguousOnly>> ops;
  hooks.ops = dmuon::testing::per_rank_ops(ops, 3);
  const EngineRun run = dmuon::testing::run_engine(world, EngineOptions{}, col_block_rules(), 1, hooks);
  for (const std::string& e : run.errors)
    EXPECT_NE(e.find("parameter 'o_proj': its 3 column blocks are strided pieces"), std::string::npos) << e;
}

}  // namespace

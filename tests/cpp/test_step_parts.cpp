// The step engine's parts without a pipeline: items and pieces, stage formation, the
// route decision table, typed options, and the CPU ops' element semantics (16-bit
// conversions, momentum rounded like torch's lerp on 16-bit tensors, apply, the gate).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "error_of.h"
#include "step/cpu/cpu_elements.h"
#include "step/cpu/cpu_ops.h"
#include "step/items.h"
#include "step/options.h"
#include "step/device_ops.h"
#include "step/stages.h"

namespace {

using dmuon::step::DType;
using dmuon::step::ItemTable;
using dmuon::step::ParamSpec;
using dmuon::testing::contains;
using dmuon::testing::error_of;

// ---------------------------------------------------------------- items and pieces
TEST(StepItems, PiecesOfShardedReplicatedAndStackedParameters) {
  const std::vector<ParamSpec> specs = {
      {"w", {{5, 3}, 0, true}, DType::kFloat32, 0},      // torch.chunk: rows 2,2,1,0 over 4 ranks
      {"e", {{3, 4, 5}, 1, true}, DType::kFloat32, 0},   // experts 1,1,1,0: flat rows 4 each
      {"r", {{2, 6}, 0, false}, DType::kBFloat16, 1},    // replicated
      {"conv", {{4, 2, 3, 3}, 0, true}, DType::kFloat32, 0},  // 4 × 18
      {"empty", {{0, 5}, 0, true}, DType::kFloat32, 0},  // no item
  };
  const ItemTable table(specs, 4);
  ASSERT_EQ(table.num_items(), 1 + 3 + 1 + 1);
  EXPECT_EQ(table.items_of(4).second, 0);
  // w: rows [0,2) [2,4) [4,5) and none.
  EXPECT_EQ(table.piece(0, 0).row_count, 2);
  EXPECT_EQ(table.piece(0, 2).row_begin, 4);
  EXPECT_EQ(table.piece(0, 2).row_count, 1);
  EXPECT_TRUE(table.piece(0, 3).empty());
  EXPECT_FALSE(table.whole_on(0, 0));
  // e: expert k whole on rank k, none on rank 3; each at offset 0 of its rank's local tensor.
  for (int k = 0; k < 3; ++k) {
    const int item = table.items_of(1).first + k;
    EXPECT_EQ(table.item(item).matrix_idx, k);
    EXPECT_TRUE(table.whole_on(item, k));
    EXPECT_EQ(table.piece(item, k).local_offset, 0);
    EXPECT_TRUE(table.piece(item, 3).empty());
    EXPECT_EQ(table.item_name(item), "e[" + std::to_string(k) + "]");
  }
  // r: whole everywhere.
  const int r_item = table.items_of(2).first;
  for (int rank = 0; rank < 4; ++rank) EXPECT_TRUE(table.whole_on(r_item, rank));
  EXPECT_EQ(table.item(r_item).dtype, DType::kBFloat16);
  EXPECT_EQ(table.item(r_item).group, 1);
  // conv: one 4 × 18 item, a row each.
  const int c_item = table.items_of(3).first;
  EXPECT_EQ(table.item(c_item).cols, 18);
  EXPECT_EQ(table.local_numel(3, 1), 18);
}

TEST(StepItems, AStackShardedWithinExpertsGivesPiecesWithOffsets) {
  // 2 experts of 3 rows, replicated-free Shard(0) over the stack's dim 0 = 2 at world 3:
  // rank 2 holds nothing; a [1, 3, 4] stack at world 1 holds all.
  const ItemTable table({{"e", {{2, 3, 4}, 1, true}, DType::kFloat32, 0}}, 3);
  EXPECT_EQ(table.local_rows(0, 0).count, 3);
  EXPECT_EQ(table.local_rows(0, 2).count, 0);
  EXPECT_EQ(table.piece(1, 1).row_count, 3);
  EXPECT_EQ(table.piece(1, 1).local_offset, 0);
}

TEST(StepItems, RowBlocksOfAShardedStackGivePiecesOfEachExpertsBlocks) {
  // 3 experts of 2 + 2 rows × 5 (gate, up), Shard(0) over 2 ranks: experts 0, 1 on rank 0.
  dmuon::layout::ParamLayout layout{{3, 4, 5}, 1, true, {2, 2}};
  const ItemTable table({{"gate_up", layout, DType::kFloat32, 0}}, 2);
  ASSERT_EQ(table.num_items(), 6);
  EXPECT_EQ(table.item(3).rows, 2);
  EXPECT_EQ(table.item_name(3), "gate_up[1]");
  // Item 3: expert 1's up rows, at local rows 1·4 + 2 of rank 0; item 5: expert 2's up, rank 1.
  EXPECT_EQ(table.piece(3, 0).row_begin, 0);
  EXPECT_EQ(table.piece(3, 0).row_count, 2);
  EXPECT_EQ(table.piece(3, 0).local_offset, (1 * 4 + 2) * 5);
  EXPECT_TRUE(table.piece(3, 1).empty());
  EXPECT_EQ(table.piece(5, 1).local_offset, 2 * 5);
  EXPECT_TRUE(table.whole_on(4, 1));
}

// Split orthogonalization: every row block is an item of its own; a rank's piece
// of a block is the block's rows inside the rank's Shard(0) chunk, so a chunk may hold the
// end of one block and the start of the next (two pieces at offsets of one local tensor).
dmuon::layout::ParamLayout row_block_layout(std::vector<int64_t> shape, bool sharded, std::vector<int64_t> blocks) {
  dmuon::layout::ParamLayout layout;
  layout.global_shape = std::move(shape);
  layout.sharded = sharded;
  layout.row_blocks = std::move(blocks);
  return layout;
}

TEST(StepItems, RowBlocksCutByShardsGivePiecesOfBlocks) {
  // Fused q, k, v of 12 + 6 + 6 rows × 5, torch.chunk over 3 ranks: rows [0,8) [8,16) [16,24).
  const ItemTable qkv({{"qkv", row_block_layout({24, 5}, true, {12, 6, 6}), DType::kFloat32, 0}}, 3);
  ASSERT_EQ(qkv.num_items(), 3);
  EXPECT_EQ(qkv.item(0).rows, 12);
  EXPECT_EQ(qkv.item(1).rows, 6);
  EXPECT_EQ(qkv.item(2).cols, 5);
  struct Expected { int item, rank; int64_t row_begin, row_count, local_offset; };
  const std::vector<Expected> expected = {
      {0, 0, 0, 8, 0},  {0, 1, 8, 4, 0},    // q: rows 0–7 on rank 0, 8–11 at the start of rank 1's chunk
      {1, 1, 0, 4, 20}, {1, 2, 4, 2, 0},    // k: rank 1 after its 4 q rows (4·5 elements), then rank 2
      {2, 2, 0, 6, 10},                      // v: rank 2 after its 2 k rows
  };
  for (const Expected& e : expected) {
    const auto& piece = qkv.piece(e.item, e.rank);
    EXPECT_EQ(piece.row_begin, e.row_begin) << e.item << " on " << e.rank;
    EXPECT_EQ(piece.row_count, e.row_count) << e.item << " on " << e.rank;
    EXPECT_EQ(piece.local_offset, e.local_offset) << e.item << " on " << e.rank;
    EXPECT_EQ(piece.col_count, 5);
  }
  EXPECT_TRUE(qkv.piece(0, 2).empty());
  EXPECT_TRUE(qkv.piece(1, 0).empty());
  EXPECT_TRUE(qkv.piece(2, 0).empty() && qkv.piece(2, 1).empty());
  EXPECT_TRUE(qkv.whole_on(2, 2));  // v lies inside rank 2's chunk
  EXPECT_EQ(qkv.first_whole_holder(0), -1);

  // Gate/up 5 + 5 rows × 3 over 4 ranks (uneven: chunks 3, 3, 3, 1): rank 1 holds the end of
  // gate and the first row of up; rank 3 the last row of up.
  const ItemTable gate_up({{"gate_up", row_block_layout({10, 3}, true, {5, 5}), DType::kFloat32, 0}}, 4);
  EXPECT_EQ(gate_up.piece(0, 1).row_begin, 3);
  EXPECT_EQ(gate_up.piece(0, 1).row_count, 2);
  EXPECT_EQ(gate_up.piece(1, 1).row_begin, 0);
  EXPECT_EQ(gate_up.piece(1, 1).row_count, 1);
  EXPECT_EQ(gate_up.piece(1, 1).local_offset, 2 * 3);
  EXPECT_EQ(gate_up.piece(1, 3).row_begin, 4);
  EXPECT_EQ(gate_up.piece(1, 3).local_offset, 0);
  EXPECT_TRUE(gate_up.piece(0, 3).empty());

  // Per-head blocks of a replicated q (3 heads of 2 rows, world 2): whole blocks on every
  // rank, each a replica set whose lowest holder sends.
  const ItemTable heads({{"q", row_block_layout({6, 4}, false, {2, 2, 2}), DType::kFloat32, 0}}, 2);
  ASSERT_EQ(heads.num_items(), 3);
  for (int item = 0; item < 3; ++item) {
    EXPECT_TRUE(heads.whole_on(item, 0) && heads.whole_on(item, 1));
    EXPECT_EQ(heads.piece(item, 1).local_offset, item * 2 * 4);
    EXPECT_TRUE(heads.replicated_on(item, 1));
    EXPECT_EQ(heads.source(item, 1, 0), 0);
  }
}

TEST(StepItems, StackShardedOnItsRowDimGivesRowPiecesOfEveryMatrix) {
  // A stack [3, 7 rows, 2] whose dim 1 (every matrix's rows) is chunked over a 1-D mesh of
  // 3 ranks (torch.chunk: 3, 3, 1 rows): each matrix is an item with a row piece per rank.
  dmuon::layout::ParamLayout layout{{3, 7, 2}, 1, true};
  layout.mesh = dmuon::layout::MeshPlacement{{3}, {{dmuon::layout::PlacementKind::kShard, 1, 1}}, {{0}, {1}, {2}}};
  const ItemTable staged({{"o_proj", layout, DType::kFloat32, 0}}, 3);
  ASSERT_EQ(staged.num_items(), 3);
  const int64_t begin[] = {0, 3, 6}, count[] = {3, 3, 1};
  for (int head = 0; head < 3; ++head) {
    EXPECT_EQ(staged.item(head).rows, 7);
    EXPECT_EQ(staged.item(head).cols, 2);
    for (int rank = 0; rank < 3; ++rank) {
      const auto& piece = staged.piece(head, rank);
      EXPECT_EQ(piece.row_begin, begin[rank]) << head << " on " << rank;
      EXPECT_EQ(piece.row_count, count[rank]) << head << " on " << rank;
      // Head-major staging: head j's rows of the chunk follow heads 0..j−1's, contiguous.
      EXPECT_EQ(piece.local_offset, head * count[rank] * 2) << head << " on " << rank;
      EXPECT_EQ(piece.col_count, 2);
    }
  }
  EXPECT_EQ(staged.local_numel(0, 2), 3 * 1 * 2);
}

TEST(StepItems, BadSpecsAreNamed) {
  EXPECT_TRUE(contains(error_of([] { ItemTable({{"vec", {{5}, 0, true}, DType::kFloat32, 0}}, 2); }), "vec"));
  EXPECT_TRUE(contains(error_of([] { ItemTable({{"x", {{2, 2}, 0, true}, DType::kInt32, 0}}, 2); }),
                       "parameter 'x': dtype int32"));
  EXPECT_TRUE(contains(error_of([] { ItemTable({{"g", {{2, 2}, 0, true}, DType::kFloat32, -1}}, 2); }),
                       "parameter 'g': group index -1"));
}

// ---------------------------------------------------------------- stages
// Workspace of the fake ops: 100 bytes per matrix plus 50.
int64_t fake_ns_bytes(int64_t, int64_t, int64_t count, DType, dmuon::ns::Algorithm) { return 50 + 100 * count; }

TEST(StepStages, EveryItemInOneBatchOfOneShapeUnderTheCaps) {
  // 10 square items over groups {0, 1} and dtypes, 5 tall ones, 3 wide ones; 3 owners.
  std::vector<ParamSpec> specs;
  for (int i = 0; i < 10; ++i)
    specs.push_back({"sq" + std::to_string(i), {{8, 8}, 0, true}, i % 3 == 0 ? DType::kBFloat16 : DType::kFloat32, i % 2});
  for (int i = 0; i < 5; ++i) specs.push_back({"tall" + std::to_string(i), {{16, 4}, 0, true}, DType::kFloat32, 0});
  specs.push_back({"wide", {{3, 4, 12}, 1, true}, DType::kFloat32, 0});
  const ItemTable table(specs, 3);
  std::vector<dmuon::step::OwnerBatches> owners(3);
  for (int r = 0; r < 3; ++r) owners[static_cast<size_t>(r)].owner = r;
  // Rank 0: all squares in one plan batch; rank 1: the talls; rank 2: the wide stack.
  std::vector<int> squares, talls, wides;
  for (int i = 0; i < table.num_items(); ++i)
    (table.item(i).rows == 8 ? squares : table.item(i).rows == 16 ? talls : wides).push_back(i);
  owners[0].batches = {squares};
  owners[1].batches = {talls};
  owners[2].batches = {wides};
  const std::vector<dmuon::ns::Algorithm> algorithms = {dmuon::ns::Algorithm::kGram, dmuon::ns::Algorithm::kStandard};
  for (int64_t stage_bytes : {int64_t{0}, int64_t{3 * 8 * 8 * 2 * 2}}) {
    for (int64_t ns_cap : {int64_t{0}, int64_t{350}}) {
      dmuon::step::StageLimits limits{2, stage_bytes, ns_cap};
      const auto stages = dmuon::step::make_stages(table, owners, algorithms, limits, fake_ns_bytes);
      std::map<int, int> seen;
      for (size_t s = 0; s < stages.size(); ++s) {
        std::set<int> owners_in_stage;
        for (const auto& batch : stages[s].batches) {
          EXPECT_TRUE(owners_in_stage.insert(batch.owner).second) << "an owner has one batch per stage";
          for (int item : batch.items) {
            ++seen[item];
            const auto& it = table.item(item);
            EXPECT_EQ(it.rows, batch.rows);
            EXPECT_EQ(it.cols, batch.cols);
            EXPECT_EQ(it.group, batch.group);
            EXPECT_EQ(it.dtype, batch.dtype);
          }
          const int64_t count = static_cast<int64_t>(batch.items.size());
          EXPECT_EQ(batch.ns_bytes, fake_ns_bytes(0, 0, count, DType::kFloat32, {}));
          EXPECT_EQ(batch.wire_bytes, count * batch.rows * batch.cols * 2);
          if (count > 1 && ns_cap > 0) {
            EXPECT_LE(batch.ns_bytes, ns_cap);
          }
          if (count > 1 && stage_bytes > 0) {
            EXPECT_LE(batch.wire_bytes, stage_bytes / 3);
          }
        }
      }
      ASSERT_EQ(seen.size(), static_cast<size_t>(table.num_items()));
      for (const auto& [item, times] : seen) EXPECT_EQ(times, 1) << "item " << item;
      if (stage_bytes == 0 && ns_cap == 0) {
        // Squares split by (group, dtype) only: {g0 f32, g1 f32, g0 bf16, g1 bf16} → 4 batches.
        EXPECT_EQ(stages.size(), 4u);
      }
      if (ns_cap == 350 && stage_bytes == 0) {
        // 350 bytes hold 3 matrices: 5 talls → near-equal batches of 3 and 2.
        std::vector<size_t> tall_sizes;
        for (const auto& stage : stages)
          for (const auto& b : stage.batches)
            if (b.rows == 16) tall_sizes.push_back(b.items.size());
        EXPECT_EQ(tall_sizes, (std::vector<size_t>{3, 2}));
      }
    }
  }
}

TEST(StepStages, OneProcessHasOneStageAndGatherOneBatchPerStage) {
  std::vector<ParamSpec> specs;
  for (int i = 0; i < 6; ++i) specs.push_back({"p" + std::to_string(i), {{4 + i % 2, 4}, 0, true}, DType::kFloat32, 0});
  const std::vector<dmuon::ns::Algorithm> algorithms = {dmuon::ns::Algorithm::kGram};
  {
    const ItemTable table(specs, 1);
    std::vector<int> all{0, 1, 2, 3, 4, 5};
    const auto stages = dmuon::step::make_stages(table, {{0, dmuon::step::shape_batches(table, all)}}, algorithms,
                                                 {4, 16, 350}, fake_ns_bytes);
    ASSERT_EQ(stages.size(), 1u);
    EXPECT_EQ(stages[0].batches.size(), 2u) << "the wire does not bound one process's batches, the workspace does";
  }
  {
    const ItemTable table(specs, 3);
    std::vector<int> all{0, 1, 2, 3, 4, 5};
    const auto stages = dmuon::step::make_stages(table, {{dmuon::step::kEveryRank, dmuon::step::shape_batches(table, all)}},
                                                 algorithms, {4, 4 * 4 * 4 * 2, 0}, fake_ns_bytes);
    // NOTE: 128 bytes hold two 4×4 float32 items and one 5×4: [2, 1] + [1, 1, 1].
    ASSERT_EQ(stages.size(), 5u) << "gather: a stage holds one batch of at most stage_bytes";
    for (const auto& s : stages) EXPECT_EQ(s.batches.size(), 1u);
  }
  EXPECT_TRUE(contains(error_of([&] {
                         const ItemTable table(specs, 2);
                         dmuon::step::make_stages(table, {{0, {{0, 2}}}, {1, {{2, 4}}}}, algorithms, {4, 0, 0},
                                                  fake_ns_bytes);
                       }),
                       "is listed twice"));
}

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
  const auto runs = dmuon::step::split_near_equal(ones, 5);
  ASSERT_EQ(runs.size(), 17u);
  const auto sizes = run_sizes(runs, ones);
  EXPECT_EQ(std::count(sizes.begin(), sizes.end(), 5u), 16);
  EXPECT_EQ(std::count(sizes.begin(), sizes.end(), 4u), 1);
  // 10 in runs of ≤ 4: ⌈10/4⌉ = 3 runs of at most ⌈10/3⌉ = 4: 4, 4, 2.
  EXPECT_EQ(run_sizes(dmuon::step::split_near_equal(std::vector<int64_t>(10, 1), 4), std::vector<int64_t>(10, 1)),
            (std::vector<size_t>{4, 4, 2}));
  // 9 in runs of ≤ 4: 3 runs of 3 (not 4, 4, 1).
  EXPECT_EQ(run_sizes(dmuon::step::split_near_equal(std::vector<int64_t>(9, 1), 4), std::vector<int64_t>(9, 1)),
            (std::vector<size_t>{3, 3, 3}));
  // Everything fits: one run, in order.
  EXPECT_EQ(dmuon::step::split_near_equal({1, 1, 1}, 100), (std::vector<std::vector<int>>{{0, 1, 2}}));
  EXPECT_TRUE(dmuon::step::split_near_equal({}, 3).empty());
}

TEST(SplitNearEqual, StacksOfMatricesAndOversizedItems) {
  // Items of 3 matrices (a [3, m, n] parameter) under capacity 4: one item per run.
  EXPECT_EQ(dmuon::step::split_near_equal({3, 3, 3}, 4), (std::vector<std::vector<int>>{{0}, {1}, {2}}));
  // An item above the capacity is a run of its own; its neighbours are not merged into it.
  EXPECT_EQ(dmuon::step::split_near_equal({1, 5, 1}, 2), (std::vector<std::vector<int>>{{0}, {1}, {2}}));
  EXPECT_THROW(dmuon::step::split_near_equal({1, 1}, 0), dmuon::Error);
  EXPECT_THROW(dmuon::step::split_near_equal({1, 0}, 2), dmuon::Error);
}

// ---------------------------------------------------------------- device support
TEST(StepDeviceOps, SupportedDtypesAndWhyNot) {
  using dmuon::step::DeviceKind;
  std::string why;
  EXPECT_TRUE(dmuon::step::ops_support(DeviceKind::kCpu, DType::kFloat64, &why));
  EXPECT_TRUE(dmuon::step::ops_support(DeviceKind::kCuda, DType::kBFloat16, &why));
  EXPECT_FALSE(dmuon::step::ops_support(DeviceKind::kCuda, DType::kFloat64, &why));
  EXPECT_TRUE(contains(why, "float64 parameters are not supported by the CUDA step ops")) << why;
  EXPECT_FALSE(dmuon::step::ops_support(DeviceKind::kCpu, DType::kInt32, &why));
  EXPECT_TRUE(contains(why, "int32 is not a floating-point type")) << why;
  EXPECT_FALSE(dmuon::step::ops_support(DeviceKind::kCuda, DType::kFloat64));  // no reason asked for
}

// ---------------------------------------------------------------- options
TEST(StepOptions, ParsedOnceWithNamedErrors) {
  EXPECT_EQ(dmuon::step::parse_mode("gather"), dmuon::step::Mode::kGather);
  EXPECT_TRUE(contains(error_of([] { dmuon::step::parse_mode("owners"); }), "mode must be 'owner' or 'gather'"));
  EXPECT_TRUE(contains(error_of([] { dmuon::step::parse_wire_dtype("fp8"); }), "wire_dtype must be"));
  EXPECT_EQ(dmuon::step::resolve_wire_dtype(dmuon::step::WireDType::kAuto, dmuon::step::DeviceKind::kCuda),
            DType::kBFloat16);
  EXPECT_EQ(dmuon::step::resolve_wire_dtype(dmuon::step::WireDType::kAuto, dmuon::step::DeviceKind::kCpu),
            DType::kFloat32);
  dmuon::step::EngineOptions options;
  EXPECT_EQ(options.depth_for(3), 6) << "0: twice the world size";
  options.num_streams = 9;
  EXPECT_TRUE(contains(error_of([&] { options.validate(); }), "num_streams must be between 1 and 8"));
  dmuon::step::GroupRule rule;
  rule.lr = 0.1, rule.weight_decay = 0.01, rule.momentum = 0.9, rule.nesterov = false;
  rule.adjust_lr = dmuon::optim::AdjustLr::kSpectral;
  rule.schedule = {dmuon::ns::Algorithm::kStandard, {{3.4445, -4.775, 2.0315}}, {}, 1e-7};
  rule.validate();
  EXPECT_DOUBLE_EQ(rule.decay(), 1.0 - 0.1 * 0.01);
  EXPECT_DOUBLE_EQ(rule.update_scale(4, 16), -0.1 * 0.5);
  rule.momentum = 1.0;
  EXPECT_TRUE(contains(error_of([&] { rule.validate(); }), "momentum must be in [0, 1)"));
}

// ---------------------------------------------------------------- CPU elements and ops
TEST(StepCpuElements, SixteenBitConversionsRoundTripAndRoundToEven) {
  using namespace dmuon::step::cpu;
  for (uint32_t bits = 0; bits < 65536; ++bits) {
    const bf16_t b{static_cast<uint16_t>(bits)};
    const f16_t h{static_cast<uint16_t>(bits)};
    if (!std::isnan(to_float(b))) {
      ASSERT_EQ(to_bf16(to_float(b)).bits, b.bits) << bits;
    } else {
      ASSERT_TRUE(std::isnan(to_float(to_bf16(to_float(b)))));
    }
    if (!std::isnan(to_float(h))) {
      ASSERT_EQ(to_f16(to_float(h)).bits, h.bits) << bits;
    } else {
      ASSERT_TRUE(std::isnan(to_float(to_f16(to_float(h)))));
    }
  }
  // Ties to even, overflow, subnormals.
  EXPECT_EQ(to_float(to_bf16(1.0f + 1.0f / 256)), 1.0f);             // halfway: the even neighbour
  EXPECT_EQ(to_float(to_bf16(1.0f + 3.0f / 256)), 1.0f + 4.0f / 256);  // halfway: up to the even one
  EXPECT_EQ(to_float(to_f16(1.0f + 1.0f / 2048)), 1.0f);
  EXPECT_EQ(to_float(to_f16(65504.0f)), 65504.0f);
  EXPECT_TRUE(std::isinf(to_float(to_f16(65520.0f))));
  EXPECT_EQ(to_float(to_f16(65519.0f)), 65504.0f);
  EXPECT_EQ(to_float(to_f16(std::ldexp(1.0f, -24))), std::ldexp(1.0f, -24));  // the smallest subnormal
  EXPECT_EQ(to_float(to_f16(std::ldexp(1.0f, -26))), 0.0f);                   // below half of it
  EXPECT_EQ(to_float(to_f16(std::ldexp(3.0f, -25))), std::ldexp(2.0f, -24));  // 1.5 ulp: to even (2)
}

// torch's lerp on bfloat16 tensors: float arithmetic, one rounding per result. The ops'
// momentum and U of a bfloat16 piece into a float32 wire, against that emulation.
TEST(StepCpuOps, HalfPrecisionMomentumRoundsLikeTorchLerp) {
  using namespace dmuon::step::cpu;
  dmuon::step::CpuOps ops;
  const int n = 257;
  std::vector<bf16_t> grad(n), momentum(n);
  std::vector<float> wire(n, -1.f), expected_u(n), expected_m(n);
  const float mu = 0.95f;
  for (int i = 0; i < n; ++i) {
    grad[i] = to_bf16(std::sin(0.37f * i) * 3.f);
    momentum[i] = to_bf16(std::cos(0.11f * i));
    const float g = to_float(grad[i]), m = to_float(momentum[i]);
    // lerp(m, g, 1 − μ) with |w| < 0.5: m + w·(g − m); lerp(g, m, μ) with μ ≥ 0.5: m − (m − g)·(1 − μ).
    const float w = static_cast<float>(1.0 - 0.95);
    expected_m[i] = to_float(to_bf16(m + w * (g - m)));
    expected_u[i] = to_float(to_bf16(expected_m[i] - (expected_m[i] - g) * (1.f - mu)));
  }
  dmuon::step::PreparePiece piece{{grad.data(), DType::kBFloat16, n, {}},
                                  {momentum.data(), DType::kBFloat16, n, {}},
                                  {0.95, true},
                                  {wire.data(), DType::kFloat32, n, {}}};
  ops.prepare_pieces({piece}, {});
  for (int i = 0; i < n; ++i) {
    ASSERT_EQ(to_float(momentum[i]), expected_m[i]) << i;
    ASSERT_EQ(wire[i], expected_u[i]) << i;
  }
}

// Subnormals in the momentum update read and are written as zero (flush-to-zero and
// denormals-are-zero while the pass runs), and the calling thread's mode is restored.
// Catches: the flush removed (a subnormal momentum entry, which makes every later step on
// it slow) or left set after the pass.
TEST(StepCpuOps, MomentumUpdateFlushesSubnormalsAndRestoresTheThreadsMode) {
  dmuon::step::CpuOps ops;
  const float tiny = std::numeric_limits<float>::min();  // the smallest normal float
  // 0: a normal entry whose lerp result, 0.5·m, is subnormal → 0; 1: a subnormal entry
  // (a loaded state) → 0; 2: an entry whose decrement (1 − μ)·m is subnormal → it stays
  // (the decay stops near tiny/(1 − μ)).
  std::vector<float> grad = {0.f, 0.f, 0.f}, momentum = {1.5f * tiny, 1e-40f, 1.5f * tiny};
  for (const auto& [mu, i] : {std::pair<double, int>{0.5, 0}, {0.99, 1}, {0.95, 2}}) {
    dmuon::step::PreparePiece piece{{&grad[static_cast<size_t>(i)], DType::kFloat32, 1, {}},
                                    {&momentum[static_cast<size_t>(i)], DType::kFloat32, 1, {}},
                                    {mu, false},
                                    {}};
    ops.prepare_pieces({piece}, {});
  }
  EXPECT_EQ(momentum[0], 0.f);
  EXPECT_EQ(momentum[1], 0.f);
  EXPECT_EQ(momentum[2], 1.5f * tiny);
  volatile float half_tiny = tiny;
  half_tiny = half_tiny * 0.5f;
  EXPECT_NE(half_tiny, 0.f) << "the thread still flushes subnormals after the pass";
}

// sum_into: parts `stride` apart summed, scaled and rounded once into another dtype, or
// added to what dst holds; a size that does not fit is named.
TEST(StepCpuOps, SumIntoAddsPartsAcrossDtypes) {
  using namespace dmuon::step::cpu;
  dmuon::step::CpuOps ops;
  // Three parts of 2 elements, 3 apart (the third element of each part is not read).
  std::vector<float> src = {1.f, 2.f, 99.f, 10.f, 20.f, 99.f, 100.f, 200.f};
  std::vector<bf16_t> dst = {to_bf16(5.f), to_bf16(5.f)};
  const dmuon::step::Buffer from{src.data(), DType::kFloat32, 8, {}}, to{dst.data(), DType::kBFloat16, 2, {}};
  ops.sum_into(from, 3, 3, to, 0.5, false);
  EXPECT_EQ(to_float(dst[0]), 55.5f);   // (1 + 10 + 100) / 2
  EXPECT_EQ(to_float(dst[1]), 111.f);   // (2 + 20 + 200) / 2
  std::vector<double> acc = {1.0, 1.0};
  ops.sum_into(from, 1, 2, {acc.data(), DType::kFloat64, 2, {}}, 1.0, true);
  EXPECT_EQ(acc, (std::vector<double>{2.0, 3.0}));
  const std::string error = dmuon::testing::error_of([&] { ops.sum_into(from, 4, 3, to, 1.0, false); });
  EXPECT_NE(error.find("4 parts of 2 elements 3 apart"), std::string::npos) << error;
}

// The fingerprint of the step begun from backward (step/fingerprint.h): the same bits give
// the same sum however the pieces are split into calls or ordered, a strided view sums as
// its elements copied out; any one bit flipped anywhere, a sign flipped (the norm kept),
// two entries swapped, or another salt change it; a NaN's bits are its own.
TEST(StepCpuOps, FingerprintIsEqualForEqualBitsAndChangesWithAnyOne) {
  dmuon::step::CpuOps ops;
  using dmuon::step::Buffer;
  using dmuon::step::FingerprintPiece;
  std::vector<float> f32(97);
  for (size_t i = 0; i < f32.size(); ++i) f32[i] = std::sin(0.37f * static_cast<float>(i)) * 3.f;
  f32[5] = std::numeric_limits<float>::quiet_NaN();
  f32[6] = -0.f;
  std::vector<uint16_t> b16(40);
  for (size_t i = 0; i < b16.size(); ++i) b16[i] = static_cast<uint16_t>(0x3f80 + 7 * i);
  std::vector<double> f64 = {1.5, -2.25, 1e-300, 0.0};
  auto sum_of = [&](const std::vector<std::vector<FingerprintPiece>>& calls) {
    std::vector<int32_t> sum(2, 0);
    const Buffer view{sum.data(), DType::kInt32, 2, {}};
    for (const auto& pieces : calls) ops.fingerprint(pieces, view);
    uint64_t out;
    std::memcpy(&out, sum.data(), sizeof(out));
    return out;
  };
  auto pieces = [&]() -> std::vector<FingerprintPiece> {
    return {{{f32.data(), DType::kFloat32, 97, {}}, 3},
            {{b16.data(), DType::kBFloat16, 40, {}}, 4},
            {{f64.data(), DType::kFloat64, 4, {}}, 5}};
  };
  const uint64_t base = sum_of({pieces()});
  EXPECT_NE(base, 0u);
  const std::vector<FingerprintPiece> all = pieces();
  EXPECT_EQ(sum_of({{all[2]}, {all[0], all[1]}}), base);
  EXPECT_EQ(sum_of({{all[1], all[2], all[0]}}), base);
  // A strided view (3 rows of 5, 11 apart) as its 15 elements copied out.
  const Buffer strided = Buffer{f32.data(), DType::kFloat32, 97, {}}.rows(2, 3, 5, 11);
  std::vector<float> packed;
  for (int64_t k = 0; k < 15; ++k) packed.push_back(f32[static_cast<size_t>(2 + strided.offset_of(k))]);
  EXPECT_EQ(sum_of({{{strided, 9}}}), sum_of({{{{packed.data(), DType::kFloat32, 15, {}}, 9}}}));
  // Any one bit of any element.
  for (size_t i = 0; i < f32.size(); ++i)
    for (int bit : {0, 22, 31}) {
      uint32_t bits;
      std::memcpy(&bits, &f32[i], 4);
      const float saved = f32[i];
      bits ^= 1u << bit;
      std::memcpy(&f32[i], &bits, 4);
      EXPECT_NE(sum_of({pieces()}), base) << "element " << i << " bit " << bit;
      f32[i] = saved;
    }
  for (size_t i = 0; i < b16.size(); ++i) {
    b16[i] ^= 1;
    EXPECT_NE(sum_of({pieces()}), base) << "bfloat16 element " << i;
    b16[i] ^= 1;
  }
  EXPECT_EQ(sum_of({pieces()}), base);
  // Every sign flipped (the norm kept), two entries swapped, another salt.
  std::vector<float> kept = f32;
  for (float& v : f32) v = -v;
  EXPECT_NE(sum_of({pieces()}), base);
  f32 = kept;
  std::swap(f32[10], f32[11]);
  EXPECT_NE(sum_of({pieces()}), base);
  f32 = kept;
  std::vector<FingerprintPiece> salted = pieces();
  salted[0].salt = 30;
  EXPECT_NE(sum_of({salted}), base);
  // The sum's own form is named.
  std::vector<float> not_a_sum(2);
  const std::string error = error_of([&] { ops.fingerprint(pieces(), {not_a_sum.data(), DType::kFloat32, 2, {}}); });
  EXPECT_NE(error.find("the sum must be int32 [2]"), std::string::npos) << error;
}

TEST(StepCpuOps, ApplySkipsNonFiniteEntriesAndHonoursTheGate) {
  dmuon::step::CpuOps ops;
  std::vector<float> param = {1.f, 2.f, 3.f, 4.f}, wire = {0.5f, NAN, INFINITY, -1.f};
  std::vector<int32_t> flags = {0, 0}, gate = {1};
  const dmuon::step::Buffer flag_view{flags.data(), DType::kInt32, 2, {}};
  dmuon::step::ApplyPiece piece;
  piece.param = {param.data(), DType::kFloat32, 4, {}};
  piece.wire = {wire.data(), DType::kFloat32, 4, {}};
  piece.scale = -0.1;
  piece.decay = 0.5;
  piece.flag_idx = 1;
  ops.apply_pieces({piece}, {gate.data(), DType::kInt32, 1, {}}, flag_view);
  EXPECT_EQ(param, (std::vector<float>{1.f, 2.f, 3.f, 4.f})) << "a closed gate writes nothing";
  ops.apply_pieces({piece}, {}, flag_view);
  EXPECT_EQ(param, (std::vector<float>{0.5f - 0.1f * 0.5f, 1.f, 1.5f, 2.f + 0.1f}));
  EXPECT_EQ(flags, (std::vector<int32_t>{0, 1}));
}

}  // namespace

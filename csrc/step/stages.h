// dmuon/step/stages.h — the pipeline's units: NS batches and stages, from the plan.
//
// The plan gives each owner its items as same-shape batches in execution order. Each is
// split by param group and dtype (one schedule, one element type per launch), then into
// NS batches of near-equal size whose NS workspace fits `ns_batch_bytes` and whose wire
// bytes fit the owner's share of a stage (stage_bytes / world; stage_bytes in gather mode,
// where a stage holds one batch), at least one item each. Stage s holds every owner's s-th
// NS batch, so an owner's NS in a stage is always whole same-shape batches. One process
// (world 1) has one stage holding all its batches: nothing travels, nothing to pipeline.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "ns/schedule.h"
#include "step/items.h"

namespace dmuon::step {

/// NsBatch::owner of gather mode: every rank computes the batch.
inline constexpr int kEveryRank = -1;

/// Same-shape items of one group and dtype, orthogonalized in one batched launch.
struct NsBatch {
  int owner = 0;  ///< the rank that computes it, or kEveryRank
  int group = 0;
  DType dtype = DType::kFloat32;
  int64_t rows = 0, cols = 0;
  std::vector<int> items;  ///< item indices, in plan order
  int64_t wire_bytes = 0;  ///< Σ item elements · wire element size
  int64_t ns_bytes = 0;    ///< NS workspace of the whole batch
  bool computed_by(int rank) const { return owner == kEveryRank || owner == rank; }
};

/// One pipeline stage: every owner's s-th NS batch.
struct Stage {
  std::vector<NsBatch> batches;
  int64_t wire_bytes = 0;
};

/// One owner's plan batches (item indices of one shape each), in execution order.
struct OwnerBatches {
  int owner = 0;  ///< rank, or kEveryRank (gather mode)
  std::vector<std::vector<int>> batches;
};

/// Bytes of NS workspace `count` rows×cols matrices of `dtype` need under `algorithm`
/// (DeviceOps::ns_workspace_bytes).
using NsBytesFn = std::function<int64_t(int64_t rows, int64_t cols, int64_t count, DType dtype, ns::Algorithm)>;

struct StageLimits {
  int64_t wire_element_bytes = 4;
  int64_t stage_bytes = 0;     ///< ≤ 0: no bound
  int64_t ns_batch_bytes = 0;  ///< ≤ 0: no bound
  /// Stages in backward order: each owner's NS batches hold items from the last
  /// (highest index) down, and run latest first, so that stage 0 holds the matrices
  /// backward finishes first (items follow parameter registration order).
  bool backward_order = false;
  /// With backward_order: [item] → its backward window (plan/stage_windows.h, ids from
  /// the last item's 0 up). NS batches then never cross a window, and stage w holds every
  /// owner's batches of window w (possibly several of one owner, possibly none), so that
  /// stage w leaves once backward is through window w. Empty: stage s holds every owner's
  /// s-th NS batch.
  std::vector<int> window_of;
};

/// The stages of a plan (see the file header). group_algorithms[g] is group g's NS
/// algorithm. Throws dmuon::Error when a batch mixes shapes or an item is listed twice.
std::vector<Stage> make_stages(const ItemTable& table, const std::vector<OwnerBatches>& owners,
                               const std::vector<ns::Algorithm>& group_algorithms, const StageLimits& limits,
                               const NsBytesFn& ns_bytes);

/// `items` grouped by (rows, cols), each group in input order, groups in order of first
/// appearance: the batches of one owner without a planner (gather mode, one process).
std::vector<std::vector<int>> shape_batches(const ItemTable& table, const std::vector<int>& items);

/// Consecutive runs of items (item i holds counts[i] ≥ 1 matrices) as few as `capacity`
/// matrices per run allows, of near-equal size: a run closes before it would pass
/// ⌈total / ⌈total / capacity⌉⌉ matrices, so same-count items give runs of at most two
/// sizes (one NS problem, one CUDA graph, one workspace each). An item larger than the
/// capacity is a run of its own. Returns the runs as item indices, in order.
std::vector<std::vector<int>> split_near_equal(const std::vector<int64_t>& counts, int64_t capacity);

/// How many rows×cols matrices fit `limit` bytes of NS workspace (at least one).
int64_t ns_batch_capacity(int64_t rows, int64_t cols, DType dtype, ns::Algorithm algorithm, int64_t limit,
                          const NsBytesFn& ns_bytes);

}  // namespace dmuon::step

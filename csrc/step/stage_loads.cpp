// dmuon/step/stage_loads.cpp — a plan's stages and each rank's NS seconds in them (see stage_loads.h).
#include "step/stage_loads.h"

#include <algorithm>

#include "common/check.h"
#include "plan/stage_windows.h"
#include "step/stages.h"

namespace dmuon::step {

std::vector<StageLoad> plan_stage_loads(const plan::Problem& problem, const plan::Plan& plan, int64_t stage_bytes,
                                        int64_t wire_element_bytes, bool backward_order, bool windowed,
                                        const std::vector<int>& group_of) {
  const int D = problem.world_size();
  DMUON_CHECK(plan.problem_hash == problem.hash && plan.owner.size() == problem.matrices.size() &&
                  plan.ranks.size() == static_cast<size_t>(D),
              "plan_stage_loads: plan was made for problem hash ", plan.problem_hash, ", this problem has hash ",
              problem.hash, " (inputs differ)");
  DMUON_CHECK(wire_element_bytes >= 1, "plan_stage_loads: wire_element_bytes must be at least 1, got ",
              wire_element_bytes);

  // One Shard(0) parameter per planned matrix (a stack: one per unit, its matrices items).
  std::vector<ParamSpec> params;
  for (const plan::MatrixSpec& m : problem.matrices) {
    ParamSpec spec;
    spec.name = m.name;
    spec.layout.global_shape = m.batch > 1 ? std::vector<int64_t>{m.batch, m.rows, m.cols}
                                           : std::vector<int64_t>{m.rows, m.cols};
    spec.layout.batch_dims = m.batch > 1 ? 1 : 0;
    spec.layout.sharded = true;
    spec.dtype = DType::kBFloat16;
    params.push_back(std::move(spec));
  }
  const ItemTable table(std::move(params), D);

  // Each owner's plan batches as item lists, in the plan's order.
  std::vector<OwnerBatches> owners;
  for (int r = 0; r < D; ++r) {
    OwnerBatches batches{r, {}};
    for (const plan::Batch& b : plan.ranks[static_cast<size_t>(r)].batches) {
      std::vector<int> items;
      for (int idx : b.matrix_idx) {
        const auto [first, count] = table.items_of(idx);
        for (int k = 0; k < count; ++k) items.push_back(first + k);
      }
      batches.batches.push_back(std::move(items));
    }
    owners.push_back(std::move(batches));
  }
  // NOTE: the engine's windows (engine_plan.cpp): over the planned matrices, one item each
  // (stacks: every item of a unit in its window).
  std::vector<int> window_of;
  if (backward_order && windowed && plan::uses_backward_windows(problem)) {
    const std::vector<int> windows = plan::backward_stage_windows(problem, group_of);
    for (int item = 0; item < table.num_items(); ++item)
      window_of.push_back(windows[static_cast<size_t>(table.item(item).param_idx)]);
  }
  const StageLimits limits{wire_element_bytes, stage_bytes, 0, backward_order, window_of};
  const std::vector<Stage> stages =
      make_stages(table, owners, {ns::Algorithm::kStandard}, limits,
                  [](int64_t, int64_t, int64_t, DType, ns::Algorithm) { return int64_t{0}; });

  // Each NS batch at the planner's price of its units.
  std::vector<int> shape_of(problem.matrices.size(), 0);
  for (size_t s = 0; s < problem.shapes.size(); ++s)
    for (int idx : problem.shapes[s].matrix_idx) shape_of[static_cast<size_t>(idx)] = static_cast<int>(s);
  std::vector<StageLoad> loads;
  for (const Stage& stage : stages) {
    StageLoad load;
    load.rank_seconds.assign(static_cast<size_t>(D), 0.0);
    load.first_matrix = static_cast<int>(problem.matrices.size());
    load.wire_bytes = stage.wire_bytes;
    for (const NsBatch& batch : stage.batches) {
      const int matrix = table.item(batch.items.front()).param_idx;
      const plan::ShapeClass& cls = problem.shapes[static_cast<size_t>(shape_of[static_cast<size_t>(matrix)])];
      const int64_t count = static_cast<int64_t>(batch.items.size());
      // NOTE: items of a stack come in whole units but for a stack split over batches.
      const int64_t units = std::clamp<int64_t>((count + cls.stack - 1) / cls.stack, 1, cls.max_batch());
      load.rank_seconds[static_cast<size_t>(batch.owner)] += cls.batch_seconds[static_cast<size_t>(units - 1)];
      load.num_matrices += count;
      for (int item : batch.items) {
        load.first_matrix = std::min(load.first_matrix, table.item(item).param_idx);
        load.last_matrix = std::max(load.last_matrix, table.item(item).param_idx);
      }
    }
    for (double s : load.rank_seconds) {
      load.max_seconds = std::max(load.max_seconds, s);
      load.mean_seconds += s / D;
    }
    loads.push_back(std::move(load));
  }
  return loads;
}

}  // namespace dmuon::step

// dmuon/step/stage_layout.cpp — every rank's exchange plan, read as bytes and work.
#include "step/stage_layout.h"

#include "common/check.h"

namespace dmuon::step {

sim::StageLayout stage_layout(const ItemTable& table, const std::vector<Stage>& stages, Mode mode,
                              int64_t wire_size, const std::vector<bool>& active_params) {
  DMUON_CHECK(wire_size >= 1, "stage_layout: wire_size must be >= 1, got ", wire_size);
  DMUON_CHECK(active_params.empty() || static_cast<int>(active_params.size()) == table.num_params(),
              "stage_layout: ", active_params.size(), " active flags for ", table.num_params(), " parameters");
  const int world = table.world_size();
  std::vector<bool> active(static_cast<size_t>(table.num_items()));
  for (int i = 0; i < table.num_items(); ++i)
    active[static_cast<size_t>(i)] =
        active_params.empty() || active_params[static_cast<size_t>(table.item(i).param_idx)];
  sim::StageLayout out;
  out.world_size = world;
  const size_t cells = static_cast<size_t>(world) * static_cast<size_t>(world);
  out.forward.assign(stages.size(), sim::StageExchange{false, std::vector<int64_t>(cells, 0)});
  out.back = out.forward;
  out.work.assign(stages.size(), std::vector<sim::RankStageWork>(static_cast<size_t>(world)));
  // NOTE: one rank's plan at a time (a plan holds O(items · world) places).
  for (int r = 0; r < world; ++r) {
    const ExchangePlan plan = plan_exchange(table, stages, mode, r, active);
    for (size_t s = 0; s < stages.size(); ++s) {
      const StagePlan& stage = plan.stages[s];
      for (auto [exchange, counts] : {std::make_pair(&out.forward[s], &stage.forward),
                                      std::make_pair(&out.back[s], &stage.back)}) {
        exchange->issued = counts->issued;
        for (int d = 0; d < world; ++d)
          exchange->bytes[static_cast<size_t>(r * world + d)] = counts->send_counts[static_cast<size_t>(d)] * wire_size;
      }
      sim::RankStageWork& work = out.work[s][static_cast<size_t>(r)];
      for (const PreparePlan& piece : stage.prepare) work.prepare_elements += static_cast<double>(piece.piece.numel());
      for (const BatchPlan& batch : stage.batches)
        work.ns_batches.push_back({batch.batch.rows, batch.batch.cols, static_cast<int64_t>(batch.batch.items.size())});
      for (const LandPlan& rows : stage.land) work.apply_elements += static_cast<double>(rows.place.block.numel());
    }
  }
  out.validate();
  return out;
}

}  // namespace dmuon::step

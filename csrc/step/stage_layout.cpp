// dmuon/step/stage_layout.cpp — every rank's exchanges and work per stage (the engine's
// rules, see the header).
#include "step/stage_layout.h"

#include "common/check.h"

namespace dmuon::step {

sim::StageLayout stage_layout(const ItemTable& table, const std::vector<Stage>& stages, Mode mode,
                              int64_t wire_size, const std::vector<bool>& active_params) {
  DMUON_CHECK(wire_size >= 1, "stage_layout: wire_size must be >= 1, got ", wire_size);
  DMUON_CHECK(active_params.empty() || static_cast<int>(active_params.size()) == table.num_params(),
              "stage_layout: ", active_params.size(), " active flags for ", table.num_params(), " parameters");
  const int world = table.world_size();
  const size_t cells = static_cast<size_t>(world) * static_cast<size_t>(world);
  auto active = [&](int item) {
    return active_params.empty() || active_params[static_cast<size_t>(table.item(item).param_idx)];
  };
  sim::StageLayout out;
  out.world_size = world;
  for (const Stage& stage : stages) {
    sim::StageExchange forward, back;
    forward.bytes.assign(cells, 0);
    back.bytes.assign(cells, 0);
    std::vector<sim::RankStageWork> work(static_cast<size_t>(world));
    for (const NsBatch& batch : stage.batches) {
      int64_t count = 0;
      for (int item : batch.items) {
        if (!active(item)) continue;
        ++count;
        // Forward: a piece goes to every other rank that computes the item without holding it whole.
        for (int c = 0; c < world; ++c) forward.issued = forward.issued || (batch.computed_by(c) && !table.whole_on(item, c));
        for (int src = 0; src < world; ++src) {
          const Piece& piece = table.piece(item, src);
          if (piece.empty()) continue;
          const int64_t elements = piece.numel();
          bool travels = batch.computed_by(src) && !table.whole_on(item, src);  // its own piece, read in place
          for (int dst = 0; dst < world; ++dst) {
            // NOTE: of replicas, only the block's source for `dst` sends it (ItemTable::source).
            if (dst == src || !batch.computed_by(dst) || table.whole_on(item, dst) || table.source(item, src, dst) != src)
              continue;
            forward.bytes[static_cast<size_t>(src * world + dst)] += elements * wire_size;
            travels = true;
          }
          // NOTE: an owner's whole item goes straight into its iterate (momentum inside the NS phase).
          if (travels || !batch.computed_by(src)) work[static_cast<size_t>(src)].prepare_elements += static_cast<double>(elements);
        }
        // Return (owner mode): the owner sends every other rank its rows; they apply them.
        if (mode != Mode::kOwner || batch.owner == kEveryRank) continue;
        for (int dst = 0; dst < world; ++dst) {
          const Piece& piece = table.piece(item, dst);
          if (dst == batch.owner || piece.empty()) continue;
          back.issued = true;
          back.bytes[static_cast<size_t>(batch.owner * world + dst)] += piece.numel() * wire_size;
          work[static_cast<size_t>(dst)].apply_elements += static_cast<double>(piece.numel());
        }
      }
      if (count == 0) continue;
      for (int r = 0; r < world; ++r)
        if (batch.computed_by(r)) work[static_cast<size_t>(r)].ns_batches.push_back({batch.rows, batch.cols, count});
    }
    out.forward.push_back(std::move(forward));
    out.back.push_back(std::move(back));
    out.work.push_back(std::move(work));
  }
  out.validate();
  return out;
}

}  // namespace dmuon::step

// dmuon/step/exchange_plan.cpp — the engine's exchange rules (see the header), made into
// one rank's plan.
#include "step/exchange_plan.h"

#include <map>
#include <set>
#include <utility>

#include "common/check.h"

namespace dmuon::step {
namespace {

using Places = std::map<std::pair<int, int>, int64_t>;  // (item, peer) → offset in a buffer

// Lays a buffer out peer by peer, this rank's region empty: fill(peer, offset) places that
// peer's pieces from `offset` on and returns the offset after them. Returns the end.
template <typename Fill>
int64_t by_peer(int world, int rank, std::vector<int64_t>& counts, const Fill& fill) {
  int64_t offset = 0;
  for (int peer = 0; peer < world; ++peer) {
    if (peer == rank) continue;
    const int64_t end = fill(peer, offset);
    counts[static_cast<size_t>(peer)] = end - offset;
    offset = end;
  }
  return offset;
}

// Stage `stage`'s plan on `rank`.
StagePlan plan_stage(const ItemTable& table, const Stage& stage, bool owner_mode, int rank,
                     const std::vector<bool>& active) {
  const int world = table.world_size();
  const auto is_active = [&](int item) { return active[static_cast<size_t>(item)]; };
  StagePlan plan;
  for (ExchangeCounts* counts : {&plan.forward, &plan.back}) {
    counts->send_counts.assign(static_cast<size_t>(world), 0);
    counts->recv_counts.assign(static_cast<size_t>(world), 0);
  }

  // Forward sends: per destination, the pieces this rank is the source of; then its own
  // pieces of the items it computes without holding them whole.
  std::map<int, std::vector<int64_t>> targets;  // item → its places in the send buffer
  std::map<int, int64_t> own_at;                // item → its own piece's place
  int64_t offset = by_peer(world, rank, plan.forward.send_counts, [&](int d, int64_t at) {
    for (const NsBatch& batch : stage.batches) {
      if (!batch.computed_by(d)) continue;
      for (int item : batch.items) {
        const Piece& p = table.piece(item, rank);
        if (!is_active(item) || p.empty() || table.whole_on(item, d) || table.source(item, rank, d) != rank) continue;
        targets[item].push_back(at);
        at += p.numel();
      }
    }
    return at;
  });
  plan.forward.send_numel = offset;
  for (const NsBatch& batch : stage.batches)
    for (int item : batch.items) {
      if (!is_active(item)) continue;
      for (int c = 0; c < world; ++c)
        plan.forward.issued = plan.forward.issued || (batch.computed_by(c) && !table.whole_on(item, c));
      const Piece& p = table.piece(item, rank);
      if (!batch.computed_by(rank) || table.whole_on(item, rank) || p.empty()) continue;
      own_at[item] = offset;
      targets[item].push_back(offset);
      offset += p.numel();
    }
  plan.forward_send_numel = offset;

  // Forward receives: per source, the blocks it sends of the items this rank computes.
  Places recv_at;
  plan.forward.recv_numel = by_peer(world, rank, plan.forward.recv_counts, [&](int src, int64_t at) {
    for (const NsBatch& batch : stage.batches) {
      if (!batch.computed_by(rank)) continue;
      for (int item : batch.items) {
        const Piece& p = table.piece(item, src);
        if (!is_active(item) || table.whole_on(item, rank) || p.empty() || table.source(item, src, rank) != src)
          continue;
        recv_at[{item, src}] = at;
        at += p.numel();
      }
    }
    return at;
  });

  // Prepare: every active piece of this rank, but a whole item it computes and sends nowhere.
  std::set<int> prepared;
  for (const NsBatch& batch : stage.batches)
    for (int item : batch.items) {
      const Piece& p = table.piece(item, rank);
      if (!is_active(item) || p.empty()) continue;
      const auto found = targets.find(item);
      std::vector<int64_t> places = found == targets.end() ? std::vector<int64_t>{} : found->second;
      if (places.empty() && batch.computed_by(rank)) continue;
      plan.prepare.push_back({item, p, std::move(places)});
      prepared.insert(item);
    }

  // This rank's NS batches: their active items.
  for (const NsBatch& batch : stage.batches) {
    if (!batch.computed_by(rank)) continue;
    BatchPlan mine{batch, {}};
    mine.batch.items.clear();
    for (int item : batch.items)
      if (is_active(item)) mine.batch.items.push_back(item);
    if (!mine.batch.items.empty()) plan.batches.push_back(std::move(mine));
  }

  // Return (mode owner): per destination, its blocks of this rank's batches; per source,
  // this rank's blocks of that owner's batches.
  Places return_at, back_at;
  if (owner_mode) {
    plan.back.send_numel = by_peer(world, rank, plan.back.send_counts, [&](int d, int64_t at) {
      for (const BatchPlan& mine : plan.batches)
        for (int item : mine.batch.items) {
          const Piece& p = table.piece(item, d);
          if (p.empty()) continue;
          return_at[{item, d}] = at;
          at += p.numel();
        }
      return at;
    });
    plan.back.recv_numel = by_peer(world, rank, plan.back.recv_counts, [&](int src, int64_t at) {
      for (const NsBatch& batch : stage.batches) {
        if (batch.owner != src) continue;
        for (int item : batch.items) {
          const Piece& p = table.piece(item, rank);
          if (!is_active(item) || p.empty()) continue;
          back_at[{item, src}] = at;
          at += p.numel();
        }
      }
      return at;
    });
    for (const NsBatch& batch : stage.batches)
      for (int item : batch.items) {
        if (!is_active(item)) continue;
        for (int d = 0; d < world; ++d)
          plan.back.issued = plan.back.issued || (d != batch.owner && !table.piece(item, d).empty());
      }
  }

  // Each computed item: its blocks (own from the send buffer, every other from its source),
  // the blocks it returns, whether this rank applies rows of it.
  for (BatchPlan& mine : plan.batches)
    for (int item : mine.batch.items) {
      ComputePlan c;
      c.item = item;
      c.piece = table.piece(item, rank);
      c.whole = table.whole_on(item, rank);
      c.momentum_prepared = c.whole && prepared.count(item) > 0;
      for (int src = 0; src < world && !c.whole; ++src) {
        const Piece& p = table.piece(item, src);
        if (p.empty() || table.source(item, src, rank) != src) continue;
        c.blocks.push_back(src == rank ? WirePlace{p, src, own_at.at(item), true}
                                       : WirePlace{p, src, recv_at.at({item, src}), false});
      }
      for (int d = 0; d < world && owner_mode; ++d) {
        const Piece& p = table.piece(item, d);
        if (d != rank && !p.empty()) c.returns.push_back({p, d, return_at.at({item, d}), false});
      }
      c.applies = !c.piece.empty();
      c.round_through_wire = owner_mode && table.param(table.item(item).param_idx).whole_on_rank < 0 &&
                             table.replicated_on(item, rank);
      mine.items.push_back(std::move(c));
    }

  // Land: this rank's blocks of the other owners' items, in stage order.
  for (const NsBatch& batch : stage.batches) {
    if (!owner_mode || batch.owner == rank) continue;
    for (int item : batch.items) {
      const Piece& p = table.piece(item, rank);
      if (is_active(item) && !p.empty()) plan.land.push_back({item, {p, batch.owner, back_at.at({item, batch.owner}), false}});
    }
  }
  return plan;
}

}  // namespace

ExchangePlan plan_exchange(const ItemTable& table, const std::vector<Stage>& stages, Mode mode, int rank,
                           const std::vector<bool>& active) {
  DMUON_CHECK(rank >= 0 && rank < table.world_size(), "plan_exchange: rank ", rank, " outside a world of ",
              table.world_size());
  DMUON_CHECK(static_cast<int>(active.size()) == table.num_items(), "plan_exchange: ", active.size(),
              " active flags for ", table.num_items(), " items");
  ExchangePlan plan;
  plan.rank = rank;
  for (const Stage& stage : stages) plan.stages.push_back(plan_stage(table, stage, mode == Mode::kOwner, rank, active));
  return plan;
}

}  // namespace dmuon::step

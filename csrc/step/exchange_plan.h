// dmuon/step/exchange_plan.h — one rank's exchanges of a step, planned once as data: per
// stage, the counts and offsets of the forward all_to_all (pieces to the ranks that
// compute their items) and of the return (result rows back to the ranks that hold them),
// and what this rank packs, assembles, returns and applies. The engine only executes it
// (pack at these offsets, issue, assemble and apply from them); the projection reads every
// rank's (step/stage_layout.h).
//
// Every rank derives every rank's plan alike from the items, the stages and the set of
// items the pipeline runs (active), so the collectives match:
//   forward  a piece goes to each other rank that computes its item without holding it
//            whole, from its block's source (ItemTable::source: replicas send a block
//            once); per destination the stage's batches in order, their items in order.
//            After the peers' regions the send buffer holds this rank's own pieces of the
//            items it computes but does not hold whole (read by its iterate, never sent).
//            Issued when some rank computes an active item it does not hold whole.
//   prepare  momentum of every active piece of this rank, U into its first place in the
//            send buffer (copies into the others), but for an item this rank computes and
//            holds whole and sends nowhere (its iterate reads it in place).
//   ns       this rank's batches, their active items: a whole item read in place, else
//            assembled from one wire piece per block (its own from the send buffer).
//   return   (mode owner) the owner sends every other holder its block of the result; per
//            destination its batches in order. Issued when an active item has a holder
//            other than its owner.
//   land     the blocks other owners return to this rank, in stage order, applied.
#pragma once

#include <cstdint>
#include <vector>

#include "step/items.h"
#include "step/options.h"
#include "step/stages.h"

namespace dmuon::step {

/// One all_to_all of a stage as this rank issues it.
struct ExchangeCounts {
  std::vector<int64_t> send_counts, recv_counts;  ///< [peer] elements (0 for this rank)
  int64_t send_numel = 0;  ///< Σ send_counts: the collective's part of the send buffer
  int64_t recv_numel = 0;  ///< Σ recv_counts: the receive buffer
  bool issued = false;     ///< the collective runs (decided alike on every rank)
};

/// A block of an item in a wire buffer.
struct WirePlace {
  Piece block;           ///< the piece of the rank that holds it
  int peer = 0;          ///< the rank it comes from (assembly, land) or goes to (return)
  int64_t offset = 0;    ///< first element in the buffer
  bool in_send = false;  ///< (assembly) this rank's own piece, in the forward's send buffer
};

/// Momentum of one of this rank's pieces, and U into the forward's send buffer.
struct PreparePlan {
  int item = 0;
  Piece piece;                   ///< this rank's
  std::vector<int64_t> targets;  ///< U's places (the pass writes the first, copies the rest); none: momentum only
};

/// One item of one of this rank's NS batches.
struct ComputePlan {
  int item = 0;
  Piece piece;                     ///< this rank's
  bool whole = false;              ///< held whole here: read in place by the iterate
  bool momentum_prepared = false;  ///< whole, and prepare updated its momentum (the iterate only reads it)
  std::vector<WirePlace> blocks;   ///< not whole: one per block, in the forward's buffers
  std::vector<WirePlace> returns;  ///< (mode owner) every other holder's block, in the return's send buffer
  bool applies = false;            ///< this rank holds a piece: it applies its rows of the result
  /// Rows replicas also hold: applied as the wire carries them (bit for bit the replicas').
  bool round_through_wire = false;
};

/// One of this rank's NS batches: the stage's batch restricted to the active items.
struct BatchPlan {
  NsBatch batch;
  std::vector<ComputePlan> items;  ///< [k] of batch.items[k]
};

/// Rows another owner returns to this rank: `place` in the return's receive buffer.
struct LandPlan {
  int item = 0;
  WirePlace place;
};

struct StagePlan {
  ExchangeCounts forward;
  int64_t forward_send_numel = 0;  ///< the forward's send buffer: the peers' regions, then own pieces
  std::vector<PreparePlan> prepare;
  std::vector<BatchPlan> batches;
  ExchangeCounts back;  ///< empty counts, never issued, in mode gather
  std::vector<LandPlan> land;
};

/// The plan of rank `rank` for one set of active items.
struct ExchangePlan {
  int rank = 0;
  std::vector<StagePlan> stages;
};

/// Rank `rank`'s plan of `stages` over `table` when the items with active[i] run (see the
/// file header). Throws dmuon::Error when `active` does not hold one flag per item or the
/// rank is outside the table's world.
ExchangePlan plan_exchange(const ItemTable& table, const std::vector<Stage>& stages, Mode mode, int rank,
                           const std::vector<bool>& active);

}  // namespace dmuon::step

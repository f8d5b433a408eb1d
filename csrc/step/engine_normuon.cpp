// dmuon/step/engine_normuon.cpp — NorMuon's state v around the pipeline (optim/normuon.h).
//
// v is sharded like the parameter's rows (ParamTensors::row_state): each rank holds the v
// rows of the rows it holds. The owner of a matrix needs every row's v (the rows are
// divided by √v and the matrix rescaled to its norm), so around the pipeline:
//   gather   each row block's source (the rank that sends that block's U to the owner, of
//            the blocks starting at column 0) sends its v rows to the owner: one float32
//            all_to_all; the owner assembles the whole v of each matrix it computes
//   (stages) the owner's consume() updates v and normalizes O (DeviceOps::normuon)
//   return   the owner sends every holder the new v of its rows (one all_to_all); each
//            holder, the owner included, writes its rows of row_state
// A matrix whose owner is its only holder (one process, a matrix whole on its owner) uses
// the owner's row_state in place: nothing moves.
// NOTE: why not keep v on the owner: the state would then follow the plan (a checkpoint
// could not be resumed at another world, or with another plan, without a replanning
// step); sharded like the rows it is ordinary optimizer state (DTensor Shard(0) under
// FSDP2) and resumes anywhere. Cost: 2 × 4 bytes per row per step, against 2 × wire bytes
// × cols for the update (0.1% at 1536 columns in bfloat16).
#include <algorithm>
#include <string>
#include <vector>

#include "common/check.h"
#include "step/engine_state.h"

namespace dmuon::step {

namespace {

// Rows of `piece` in its rank's row_state of the parameter.
Buffer v_rows(const ParamTensors& t, const Piece& piece) {
  return t.row_state.slice(piece.local_offset / piece.col_count, piece.row_count, "NorMuon state rows of a piece");
}

// One float32 all_to_all of state rows: to[d] (in order) is what peer d receives from this
// rank, from[s] the buffers peer s's rows land in (in the order s packs them). Over a
// transport that moves nothing the targets are left as they are.
void exchange_rows(DeviceOps& ops, Transport& transport, int rank, const std::vector<std::vector<Buffer>>& to,
                   const std::vector<std::vector<Buffer>>& from, const std::string& what) {
  const size_t world = to.size();
  std::vector<int64_t> send_counts(world, 0), recv_counts(world, 0);
  for (size_t d = 0; d < world; ++d) {
    for (const Buffer& b : to[d]) send_counts[d] += b.numel;
    for (const Buffer& b : from[d]) recv_counts[d] += b.numel;
  }
  DMUON_CHECK(send_counts[static_cast<size_t>(rank)] == 0 && recv_counts[static_cast<size_t>(rank)] == 0,
              what, ": rows to or from this rank itself");
  int64_t sent = 0, received = 0;
  for (size_t d = 0; d < world; ++d) sent += send_counts[d], received += recv_counts[d];
  OwnedBuffer send = ops.allocate(DType::kFloat32, sent), recv = ops.allocate(DType::kFloat32, received);
  int64_t at = 0;
  std::vector<CopyPiece> copies;
  for (const std::vector<Buffer>& rows : to)
    for (const Buffer& b : rows) copies.push_back({b, send.get().slice(at, b.numel)}), at += b.numel;
  ops.copy(copies);
  transport.all_to_all(send.get(), send_counts, recv.get(), recv_counts, what)->wait();
  if (!transport.moves_data()) return;
  at = 0;
  copies.clear();
  for (const std::vector<Buffer>& rows : from)
    for (const Buffer& b : rows) copies.push_back({recv.get().slice(at, b.numel), b}), at += b.numel;
  ops.copy(copies);
}

}  // namespace

bool StepEngine::normuon_active(const StepState& st, int item) const {
  return st.active[static_cast<size_t>(item)] &&
         (*st.rules)[static_cast<size_t>(table_.item(item).group)].normuon.enabled;
}

bool StepEngine::sole_holder(int item, int rank) const {
  for (int d = 0; d < world_; ++d)
    if (d != rank && !table_.piece(item, d).empty()) return false;
  return table_.whole_on(item, rank);
}

void StepEngine::normuon_gather(StepState& st) {
  const int num_items = table_.num_items();
  const std::vector<ParamTensors>& tensors = *st.tensors;
  st.normuon_v.assign(static_cast<size_t>(num_items), Buffer{});
  st.normuon_at.assign(static_cast<size_t>(num_items), -1);
  bool any = false;
  int64_t full = 0;
  for (int i = 0; i < num_items; ++i) {
    if (!normuon_active(st, i)) continue;
    any = true;
    if (owners_[static_cast<size_t>(i)] != rank_) continue;
    const ParamTensors& t = tensors[static_cast<size_t>(table_.item(i).param_idx)];
    if (sole_holder(i, rank_)) {
      st.normuon_v[static_cast<size_t>(i)] = v_rows(t, table_.piece(i, rank_));
    } else {
      st.normuon_at[static_cast<size_t>(i)] = full;
      full += table_.item(i).rows;
    }
  }
  // NOTE: every rank decides alike (tables, owners and the agreed active set are the
  // same everywhere), so the collectives below are called by all ranks or by none.
  if (!any || world_ == 1) return;
  st.normuon_exchanged = true;
  st.normuon_full = ops_.allocate(DType::kFloat32, full);
  const Buffer whole = st.normuon_full.get();

  // NOTE: zeros over a transport that moves nothing (a fake world), where no rows arrive.
  if (!transport_.moves_data()) ops_.fill_zero(whole);
  // Send: this rank's v rows of every block it is the source of, per owner; receive every
  // other source's rows of the matrices this rank computes, into their place in `whole`.
  std::vector<std::vector<Buffer>> to(static_cast<size_t>(world_)), from(static_cast<size_t>(world_));
  for (int d = 0; d < world_; ++d) {
    if (d == rank_) continue;
    for (int i = 0; i < num_items; ++i) {
      const Piece& me = table_.piece(i, rank_);
      if (normuon_active(st, i) && owners_[static_cast<size_t>(i)] == d && !me.empty() && me.col_begin == 0 &&
          table_.source(i, rank_, d) == rank_)
        to[static_cast<size_t>(d)].push_back(v_rows(tensors[static_cast<size_t>(table_.item(i).param_idx)], me));
      const int64_t at = st.normuon_at[static_cast<size_t>(i)];
      const Piece& p = table_.piece(i, d);
      if (at >= 0 && !p.empty() && p.col_begin == 0 && table_.source(i, d, rank_) == d)
        from[static_cast<size_t>(d)].push_back(whole.slice(at + p.row_begin, p.row_count));
    }
  }
  exchange_rows(ops_, transport_, rank_, to, from,
                "all_to_all of NorMuon's state rows to their owners (" + step_name(st.step_idx) + ")");
  // The whole v of each matrix this rank computes: its own rows besides the received ones.
  std::vector<CopyPiece> own;
  for (int i = 0; i < num_items; ++i) {
    const int64_t at = st.normuon_at[static_cast<size_t>(i)];
    if (at < 0) continue;
    const Piece& me = table_.piece(i, rank_);
    if (!me.empty() && me.col_begin == 0)
      own.push_back({v_rows(tensors[static_cast<size_t>(table_.item(i).param_idx)], me),
                     whole.slice(at + me.row_begin, me.row_count)});
    st.normuon_v[static_cast<size_t>(i)] = whole.slice(at, table_.item(i).rows);
  }
  ops_.copy(own);
}

void StepEngine::normuon_return(StepState& st) {
  const int num_items = table_.num_items();
  if (!st.normuon_exchanged) return;  // NOTE: as normuon_gather decided, alike on every rank
  const std::vector<ParamTensors>& tensors = *st.tensors;
  const Buffer whole = st.normuon_full.get();
  // Send every holder the new v rows of the matrices this rank computed; receive this
  // rank's rows of the matrices others computed, straight into its row_state.
  std::vector<std::vector<Buffer>> to(static_cast<size_t>(world_)), from(static_cast<size_t>(world_));
  for (int d = 0; d < world_; ++d) {
    if (d == rank_) continue;
    for (int i = 0; i < num_items; ++i) {
      const int64_t at = st.normuon_at[static_cast<size_t>(i)];
      const Piece& p = table_.piece(i, d);
      if (at >= 0 && !p.empty()) to[static_cast<size_t>(d)].push_back(whole.slice(at + p.row_begin, p.row_count));
      const Piece& me = table_.piece(i, rank_);
      if (normuon_active(st, i) && owners_[static_cast<size_t>(i)] == d && !me.empty())
        from[static_cast<size_t>(d)].push_back(v_rows(tensors[static_cast<size_t>(table_.item(i).param_idx)], me));
    }
  }
  exchange_rows(ops_, transport_, rank_, to, from,
                "all_to_all of NorMuon's state rows back to their holders (" + step_name(st.step_idx) + ")");
  // This rank's own rows of the matrices it computed.
  std::vector<CopyPiece> own;
  for (int i = 0; i < num_items; ++i) {
    const int64_t at = st.normuon_at[static_cast<size_t>(i)];
    const Piece& me = table_.piece(i, rank_);
    if (at < 0 || me.empty()) continue;
    own.push_back({whole.slice(at + me.row_begin, me.row_count),
                   v_rows(tensors[static_cast<size_t>(table_.item(i).param_idx)], me)});
  }
  ops_.copy(own);
}

}  // namespace dmuon::step

// dmuon/step/engine_state.h — what StepEngine carries inside one step (internal to
// csrc/step/engine*.cpp): the step's state from phase to phase, an exchange in flight,
// and the early work of an open step.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "step/engine.h"

namespace dmuon::step {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

/// The block `piece` in a rank's local tensor of an item's parameter ([row_count,
/// col_count], contiguous, or its rows piece.ld apart: a strided view).
inline Buffer piece_view(const Buffer& local, const Piece& piece) {
  if (!piece.strided()) return local.slice(piece.local_offset, piece.numel(), "piece of a local tensor");
  return local.rows(piece.local_offset, piece.row_count, piece.col_count, piece.ld, "piece of a local tensor");
}
/// NOTE: the form of row pieces, kept for callers that pass the item's columns (a piece
/// knows its own).
inline Buffer piece_view(const Buffer& local, const Piece& piece, int64_t /*cols*/) { return piece_view(local, piece); }

// What one step carries from phase to phase.
struct StepEngine::StepState {
  // finish() → commit(): the caller's descriptors, kept (the pointers below point here).
  std::vector<ParamTensors> tensors_kept;
  std::vector<GroupRule> rules_kept;
  const std::vector<ParamTensors>* tensors = nullptr;
  const std::vector<GroupRule>* rules = nullptr;
  int64_t step_idx = 0;
  Clock::time_point start;
  int num_checked = 0;              // flag slots: parameters, then the CheckOnly gradients
  OwnedBuffer flags;                // int32 [2·num_checked]: check()'s
  std::vector<bool> active_params;  // [param] has a gradient on every rank
  std::vector<bool> active;         // [item] goes through the pipeline (active, not made ready early)
  std::shared_ptr<const ExchangePlan> plan;  // of `active` (StepEngine::plan_for)
  std::vector<int> partial_of;      // [item] index of its check() partials, −1 when none
  Partials partials;
  OwnedBuffer gate;                 // the one-process gated step only (empty view otherwise)
  OwnedBuffer result_flags;         // int32 [num_params]
  // NorMuon (engine_normuon.cpp): [item] the whole v the owner computes with (empty: not
  // NorMuon or not computed here), its offset in normuon_full (−1: in row_state itself).
  std::vector<Buffer> normuon_v;
  std::vector<int64_t> normuon_at;
  OwnedBuffer normuon_full;
  bool normuon_exchanged = false;  // the gather's all_to_all ran: the return's runs too
  // NOTE: early stages: run_stage keeps its results (own rows and the return
  // buffer) instead of applying and returning them; commit() does both after the agreement.
  bool hold = false;
};

// One exchange of a stage: its buffers (laid out as the stage's plan says), its collective.
struct StepEngine::Flight {
  OwnedBuffer send, recv;
  std::unique_ptr<Pending> pending;
  // A held return (StepState::hold), landed by commit(): this rank's own rows of the
  // stage's results with where they apply.
  std::vector<OwnedBuffer> own_held;
  std::vector<ApplyPiece> own_apply;
  std::vector<int> own_items;  // [k] the item of own_apply[k]
};

// The early work of an open step (begin_step → commit or discard): nothing here is the
// caller's memory; committing copies it there.
struct StepEngine::Early {
  int64_t step_idx = 0;
  std::vector<GroupRule> rules;       // the schedules the early NS batches point to
  OwnedBuffer flags;                  // int32 [2·num_params], as check()'s
  std::vector<bool> ready;            // [item] made ready (whether or not this rank had work)
  std::vector<OwnedBuffer> staging;   // the staged momentum's memory (one per staging call and dtype)
  std::vector<Buffer> staged;         // [item] its momentum after this step (owner's work only)
  std::vector<OwnedBuffer> held;      // one per early NS batch: its results, row-major per item
  std::vector<Buffer> result;         // [item] its O (rows×cols) inside `held`
  int64_t num_batches = 0, num_items = 0;
  // Stages exchanged early (items that travel): a stage's forward is issued once
  // every item in it is marked ready, stages strictly in order; its NS and return one
  // stage later (or in finish()), its landing and apply wait for commit().
  std::vector<bool> marked;           // [item] the caller made it ready
  // NOTE: the descriptors of a marked item's parameter as that call gave them: a stage
  // leaves on a later call, whose tensors need not describe the earlier parameters.
  std::vector<ParamTensors> given;    // [param]
  size_t next_stage = 0;              // stages [0, next_stage) have their forward issued
  size_t ns_done = 0;                 // stages [0, ns_done) have run their NS (results held)
  std::unique_ptr<StepState> st;      // their state: tensors with staged momentum, gate, active
  std::vector<Buffer> staged_param;       // [param] a staged copy of its local momentum (or empty)
  std::vector<Flight> forward, back;      // [stage]
  std::vector<Partials> partials;         // [stage] its check's partial sums
  double ns_s = 0;                    // NS seconds of early stages run inside items_ready
  int64_t ns_items = 0;               // matrices orthogonalized there
  double local_ns_s = 0;              // seconds of local_items_ready (items whole on this rank)
  // The items made ready with `watch`, and their gradients' fingerprint as items_ready read
  // them (int32 [2]; allocated by the first such call): finish() compares its tensors'.
  std::vector<int> watched;
  OwnedBuffer fingerprint;
};

}  // namespace dmuon::step

// dmuon/step/engine_step.cpp — one step's phases: check, agreement, pipeline, result
// agreement; the one-process gated step, and the two-phase finish() + commit().
#include <algorithm>
#include <utility>

#include "common/check.h"
#include "step/engine_state.h"

namespace dmuon::step {

// A fresh step's state (flags zeroed; nothing active yet).
std::unique_ptr<StepEngine::StepState> StepEngine::new_state(int num_items, int num_params, int num_extra) {
  auto st = std::make_unique<StepState>();
  st->start = Clock::now();
  st->num_checked = num_params + num_extra;
  st->active_params.assign(static_cast<size_t>(num_params), false);
  st->active.assign(static_cast<size_t>(num_items), false);
  st->partial_of.assign(static_cast<size_t>(num_items), -1);
  return st;
}

// Check: NaN/Inf flags of every local gradient and momentum buffer (reads only), but for
// the items made ready early (their flags are the early work's, unless `recheck_early`),
// and of `extra`.
void StepEngine::check_rest(StepState& st, const std::vector<CheckOnly>& extra, bool recheck_early) {
  const int num_params = table_.num_params();
  st.flags = ops_.allocate(DType::kInt32, std::max(1, 2 * st.num_checked));
  ops_.fill_zero(st.flags.get());
  std::vector<CheckPiece> pieces;
  for (int p = 0; p < num_params; ++p) {
    const ParamTensors& t = (*st.tensors)[static_cast<size_t>(p)];
    if (!t.has_grad) continue;
    const GroupRule& rule = (*st.rules)[static_cast<size_t>(table_.param(p).group)];
    const auto [first, count] = table_.items_of(p);
    for (int item = first; item < first + count; ++item) {
      const Piece& piece = table_.piece(item, rank_);
      if (piece.empty() || (early_ && early_->ready[static_cast<size_t>(item)] && !recheck_early)) continue;
      const bool sum = computes(item, rank_) && table_.whole_on(item, rank_);
      if (sum) st.partial_of[static_cast<size_t>(item)] = static_cast<int>(pieces.size());
      const int64_t cols = table_.item(item).cols;
      pieces.push_back({piece_view(t.grad, piece, cols), piece_view(t.momentum, piece, cols),
                        {rule.momentum, rule.nesterov}, p, sum});
    }
  }
  // NOTE: a checked-only gradient stands in for its own momentum (bit 1 is ignored).
  for (size_t k = 0; k < extra.size(); ++k)
    if (extra[k].has_grad && extra[k].grad.numel > 0)
      pieces.push_back({extra[k].grad, extra[k].grad, {}, num_params + static_cast<int>(k), false});
  // partial_of holds positions among all pieces; make them indices among the summed ones.
  int next = 0;
  std::vector<int> summed_index(pieces.size(), -1);
  for (size_t k = 0; k < pieces.size(); ++k)
    if (pieces[k].sum_update) summed_index[k] = next++;
  for (int& idx : st.partial_of)
    if (idx >= 0) idx = summed_index[static_cast<size_t>(idx)];
  if (!pieces.empty()) st.partials = ops_.check(pieces, st.flags.get());
}

// The pipeline: the forwards of the next `depth` stages in flight during stage k's NS, and
// the returns of the `depth` stages before it; a stage is applied once its return has had
// `depth` stages' time to arrive.
// NOTE: why `depth` both ways (measured on the bucketed runtime this engine replaced): on GPUs every
// wait for a collective is a wait of the compute stream, and a collective completes only
// when every rank reached it; with less slack each owner's NS chains to another owner's
// (world 4, Qwen2.5-7B: a 327 ms step against 153 ms of NS on the slowest rank). The price
// is `depth` stages of buffers each way.
void StepEngine::run_pipeline(StepState& st) {
  const size_t num_stages = stages_.size();
  stats_.num_stages = static_cast<int64_t>(num_stages);
  // NOTE: lines made by begin_step keep what the early stages recorded.
  const bool fresh = stats_.stages.size() != num_stages;
  stats_.stages.resize(num_stages);
  for (size_t s = 0; s < num_stages && fresh; ++s) {
    StageTimeline& line = stats_.stages[s];
    line.stage_idx = static_cast<int64_t>(s);
    for (auto* v : {&line.forward_sent_to, &line.forward_received_from, &line.return_sent_to,
                    &line.return_received_from})
      v->assign(static_cast<size_t>(world_), 0);
  }
  last_plan_ = st.plan;
  normuon_gather(st);
  const size_t depth = static_cast<size_t>(depth_);
  std::vector<Flight> forward(num_stages), back(num_stages);
  size_t num_issued = 0;
  auto issue_forwards_before = [&](size_t end) {
    for (; num_issued < std::min(end, num_stages); ++num_issued) forward[num_issued] = issue_forward(num_issued, st);
  };
  issue_forwards_before(depth + 1);
  for (size_t k = 0; k < num_stages; ++k) {
    back[k] = run_stage(k, st, forward[k]);
    issue_forwards_before(k + depth + 2);
    if (k >= depth) land(k - depth, st, back[k - depth]);
  }
  for (size_t j = num_stages > depth ? num_stages - depth : 0; j < num_stages; ++j) land(j, st, back[j]);
  normuon_return(st);
}

// The end of a written step: one host read of the result flags; several ranks agree on the
// first parameter whose result was not finite (with the caller's `extra_max`, in the same
// all_reduce), and every rank raises naming it.
std::vector<int64_t> StepEngine::agree_results(StepState& st, const std::vector<int64_t>& extra_max) {
  const int num_params = table_.num_params();
  const std::vector<int32_t> host = ops_.read_flags({st.result_flags.get()});
  int first_bad = -1;
  for (int p = 0; p < num_params && first_bad < 0; ++p)
    if (host[static_cast<size_t>(p)] != 0) first_bad = p;
  std::vector<int64_t> extra = extra_max;
  if (world_ > 1) {
    // NOTE: max over ranks of (num_params − first bad index) finds the smallest bad index.
    std::vector<int64_t> local{first_bad < 0 ? 0 : num_params - first_bad};
    local.insert(local.end(), extra_max.begin(), extra_max.end());
    const std::vector<int64_t> agreed =
        transport_.all_reduce(local, ReduceOp::kMax, "all_reduce of the result flags (" + step_name(st.step_idx) + ")");
    first_bad = agreed[0] != 0 ? static_cast<int>(num_params - agreed[0]) : -1;
    extra.assign(agreed.begin() + 1, agreed.end());
  }
  // NOTE: every rank knows the step's outcome now: an update that was not finite is raised
  // below on every rank alike, with the rest of the step applied everywhere (not torn).
  writes_began_ = false;
  // NOTE: the device is past the step's last pass here (read_flags waited for it).
  clock_.resolve();
  stats_.total_s = seconds_since(st.start);
  DMUON_CHECK(first_bad < 0, "dmuon ", step_name(st.step_idx), ": the orthogonalized update of parameter '",
              table_.param(first_bad).name,
              "' is not finite; its non-finite entries were not applied (the rest of the step was)");
  return extra;
}

StepOutcome StepEngine::step(const std::vector<ParamTensors>& tensors, const std::vector<GroupRule>& rules,
                             int64_t step_idx, const std::vector<CheckOnly>& extra, bool agree_results,
                             const StartChecks& checks) {
  DMUON_CHECK(!committed_, "StepEngine::step(", step_name(step_idx), "): the last step's results are not agreed yet "
              "(call agree_committed first)");
  writes_began_ = false;
  if (world_ == 1 && !step_open()) {
    DMUON_CHECK(checks.error.empty(), checks.error);
    return step_gated(tensors, rules, step_idx, extra);
  }
  StepOutcome outcome = finish(tensors, rules, step_idx, extra, checks);
  DMUON_CHECK(outcome.status != StepOutcome::Status::kCorruptMomentum, outcome.message);
  if (outcome.status != StepOutcome::Status::kAgreed) return outcome;
  commit(agree_results || world_ == 1);
  outcome.status = StepOutcome::Status::kApplied;
  return outcome;
}

// One process, nothing begun early: the check gates every write on the device, and the
// step's one host wait is at its end.
StepOutcome StepEngine::step_gated(const std::vector<ParamTensors>& tensors, const std::vector<GroupRule>& rules,
                                   int64_t step_idx, const std::vector<CheckOnly>& extra) {
  clock_.drop();
  stats_ = StepStats{};
  stats_.pipeline_depth = depth_;
  const int num_params = table_.num_params();
  validate(tensors, rules, extra);
  make_stages_for(rules);
  std::unique_ptr<StepState> st = new_state(table_.num_items(), num_params, static_cast<int>(extra.size()));
  st->tensors = &tensors;
  st->rules = &rules;
  st->step_idx = step_idx;
  check_rest(*st, extra);
  for (int p = 0; p < num_params; ++p) st->active_params[static_cast<size_t>(p)] = tensors[static_cast<size_t>(p)].has_grad;
  for (int i = 0; i < table_.num_items(); ++i)
    st->active[static_cast<size_t>(i)] = st->active_params[static_cast<size_t>(table_.item(i).param_idx)];
  st->plan = plan_for(st->active);
  st->gate = ops_.make_gate(st->flags.get());
  st->result_flags = ops_.allocate(DType::kInt32, std::max(1, num_params));
  ops_.fill_zero(st->result_flags.get());
  stats_.check_s = seconds_since(st->start);
  writes_began_ = true;  // NOTE: enqueued behind the gate
  run_pipeline(*st);

  const std::vector<int32_t> host = ops_.read_flags({st->flags.get()});
  // NOTE: a closed gate wrote nothing.
  if (std::any_of(host.begin(), host.end(), [](int32_t flag) { return flag != 0; })) writes_began_ = false;
  for (int p = 0; p < num_params; ++p)
    DMUON_CHECK(host[static_cast<size_t>(2 * p + 1)] == 0, "the momentum buffer of parameter '", table_.param(p).name,
                "' holds NaN or Inf at ", step_name(step_idx), " (corrupt optimizer state); nothing was updated");
  std::vector<int> bad;
  for (int k = 0; k < st->num_checked; ++k)
    if (host[static_cast<size_t>(2 * k)] != 0) bad.push_back(k);
  if (!bad.empty()) {
    // NOTE: the gate was closed: nothing was written, whatever ran.
    stats_.total_s = seconds_since(st->start);
    return nonfinite_gradient(bad, st->active_params, step_idx, extra);
  }
  agree_results(*st);
  StepOutcome outcome;
  outcome.active = st->active_params;
  return outcome;
}

StepOutcome StepEngine::finish(const std::vector<ParamTensors>& tensors, const std::vector<GroupRule>& rules,
                               int64_t step_idx, const std::vector<CheckOnly>& extra, const StartChecks& checks) {
  DMUON_CHECK(!agreed_, "StepEngine::finish: ", step_name(agreed_ ? agreed_->step_idx : 0),
              " was finished but neither committed nor discarded");
  DMUON_CHECK(!committed_, "StepEngine::finish(", step_name(step_idx), "): the last step's results are not agreed "
              "yet (call agree_committed first)");
  // NOTE: every exit but the agreed one closes the step: early results are dropped, once
  // the returns in flight are done with their buffers (a wait that fails adds nothing to
  // the error already leaving).
  struct CloseUnlessAgreed {
    StepEngine& engine;
    bool agreed = false;
    ~CloseUnlessAgreed() {
      if (agreed) return;
      try {
        engine.drain_early();
      } catch (...) {
      }
      engine.early_.reset();
    }
  } close{*this};
  // Early stages: the NS of those not yet run (gated; every rank issued the same ones).
  finish_early_stages();
  // NOTE: the early work's device times are read before they are summed below (the
  // agreement's read_flags waits for the device a little later anyway).
  clock_.resolve();
  const bool early_stages = early_ && early_->next_stage > 0;
  if (!early_stages) {
    stats_ = StepStats{};
    stats_.pipeline_depth = depth_;
  } else {
    stats_.early_stages = static_cast<int64_t>(early_->next_stage);
    // NOTE: every fill so far ran inside items_ready (start_stats at begin_step).
    stats_.early_fill_s = stats_.model_fill_s;
  }
  // The work begun before step(): early stages' NS and the items whole on this rank (their
  // NS ran in items_ready; commit_early counts them in num_orthogonalized).
  if (early_) {
    stats_.early_ns_s = early_->ns_s + early_->local_ns_s;
    stats_.early_orthogonalized = early_->ns_items + early_->num_items;
  }
  const int num_params = table_.num_params();
  const std::string at_step = " at " + step_name(step_idx);
  std::unique_ptr<StepState> st = new_state(table_.num_items(), num_params, static_cast<int>(extra.size()));
  st->tensors_kept = tensors;
  st->rules_kept = rules;
  st->tensors = &st->tensors_kept;
  st->rules = &st->rules_kept;
  st->step_idx = step_idx;

  // Input checks. NOTE: with several ranks, one rank's bad input joins the agreement, so
  // that the others raise too instead of waiting in a collective it never joins.
  // NOTE: where this rank's begun work is stale (checks.changed), every item is checked
  // again from `tensors`. Where the caller may have changed gradients it handed over (items
  // made ready with `watch`), their fingerprint as read then is compared with `tensors`' now,
  // both read beside the step's flags: unchanged bits keep the early check's flags; changed,
  // this rank's begun work is stale, and its items are checked again and read a second time.
  // Another rank's stale work (the agreement drops the begun work on every rank) needs no
  // new check here: this rank's gradients are as they were checked.
  StartChecks mine = checks;
  const bool compare = early_ && !early_->watched.empty() && !checks.changed;
  OwnedBuffer fingerprint_now;
  try {
    validate(tensors, rules, extra);
    if (early_stages)
      for (size_t g = 0; g < rules.size() && g < early_->rules.size(); ++g)
        DMUON_CHECK(rules[g].schedule.algorithm == early_->rules[g].schedule.algorithm, "StepEngine::finish: group ", g,
                    "'s NS algorithm differs from begin_step()'s, but stages were exchanged early", at_step);
    make_stages_for(rules);
    if (early_) {
      early_->step_idx = step_idx;
      for (int i = 0; i < table_.num_items(); ++i)
        DMUON_CHECK(!early_->ready[static_cast<size_t>(i)] ||
                        tensors[static_cast<size_t>(table_.item(i).param_idx)].has_grad,
                    "item '", table_.item_name(i), "' was made ready early", at_step,
                    ", but its parameter has no gradient at finish()");
    }
    check_rest(*st, extra, checks.changed);
    if (compare) fingerprint_now = fingerprint_watched(tensors);
  } catch (const std::exception& e) {
    if (world_ == 1) throw;
    if (mine.error.empty()) mine.error = e.what();
  }

  // This rank's flags (and its early work's, where they are current), then the agreement.
  const int num_checked = st->num_checked;
  std::vector<int32_t> host(static_cast<size_t>(2 * num_checked), 0);
  if (mine.error.empty()) {
    std::vector<Buffer> buffers{st->flags.get()};
    const bool early_flags = early_ && !checks.changed;
    if (early_flags) buffers.push_back(early_->flags.get());
    // NOTE: no fingerprint now: a watched gradient is gone (the work is stale).
    const bool summed = compare && !fingerprint_now.get().empty();
    if (summed) buffers.insert(buffers.end(), {early_->fingerprint.get(), fingerprint_now.get()});
    const std::vector<int32_t> read = ops_.read_flags(buffers);
    const size_t after_own = static_cast<size_t>(std::max(1, 2 * num_checked));
    const auto given = read.begin() + static_cast<std::ptrdiff_t>(after_own) +
                       (early_flags ? static_cast<std::ptrdiff_t>(early_->flags.get().numel) : 0);
    if (compare && (!summed || !std::equal(given, given + 2, given + 2))) {
      mine.changed = true;
      try {
        check_rest(*st, extra, true);
        const std::vector<int32_t> again = ops_.read_flags({st->flags.get()});
        std::copy(again.begin(), again.begin() + 2 * num_checked, host.begin());
      } catch (const std::exception& e) {
        if (world_ == 1) throw;
        mine.error = e.what();
      }
    } else {
      std::copy(read.begin(), read.begin() + 2 * num_checked, host.begin());
      if (early_flags)
        for (int k = 0; k < 2 * num_params; ++k)
          host[static_cast<size_t>(k)] |= read[after_own + static_cast<size_t>(k)];
    }
  }
  StartFacts facts;
  for (int p = 0; p < num_params; ++p)
    facts.has_grad.push_back(tensors.size() > static_cast<size_t>(p) && tensors[static_cast<size_t>(p)].has_grad);
  for (const CheckOnly& e : extra) facts.has_grad.push_back(e.has_grad);
  for (int k = 0; k < num_checked && facts.first_nonfinite < 0; ++k)
    if (host[static_cast<size_t>(2 * k)] != 0) facts.first_nonfinite = k;
  for (int p = 0; p < num_params && facts.first_corrupt < 0; ++p)
    if (host[static_cast<size_t>(2 * p + 1)] != 0) facts.first_corrupt = p;

  const StartAgreed agreed = agree_start(transport_, mine, facts, step_idx, [&](int i) {
    return i < num_params ? "parameter '" + table_.param(i).name + "'"
                          : "parameter '" + extra[static_cast<size_t>(i - num_params)].name + "' (checked with the step)";
  });
  if (world_ > 1) stats_.agreement_bytes = int64_t{kStartAgreementValues} * static_cast<int64_t>(sizeof(int64_t));
  stats_.begun_stale = agreed.changed && early_;
  for (int p = 0; p < num_params; ++p) st->active_params[static_cast<size_t>(p)] = facts.has_grad[static_cast<size_t>(p)];
  if (agreed.first_corrupt >= 0) {
    StepOutcome outcome;
    outcome.status = StepOutcome::Status::kCorruptMomentum;
    outcome.corrupt_params = {agreed.first_corrupt};
    outcome.active = st->active_params;
    outcome.message = "the momentum buffer of parameter '" + table_.param(agreed.first_corrupt).name +
                      "' holds NaN or Inf" + at_step + " (corrupt optimizer state); nothing was updated";
    stats_.total_s = seconds_since(st->start);
    return outcome;
  }
  stats_.check_s = seconds_since(st->start);
  if (agreed.first_nonfinite >= 0) {
    stats_.total_s = seconds_since(st->start);
    return nonfinite_gradient({agreed.first_nonfinite}, st->active_params, step_idx, extra);
  }
  // NOTE: a stale begun step on some rank: every rank drops its begun work (the forwards it
  // issued are completed first) and steps every item from the tensors as they are.
  if (agreed.changed && early_) {
    drain_early();
    early_.reset();
    stats_.early_stages = stats_.early_orthogonalized = 0;
    stats_.early_ns_s = stats_.early_fill_s = 0;
  }
  for (int i = 0; i < table_.num_items(); ++i)
    st->active[static_cast<size_t>(i)] = st->active_params[static_cast<size_t>(table_.item(i).param_idx)] &&
                                         !(early_ && early_->ready[static_cast<size_t>(i)]);
  st->plan = plan_for(st->active);
  StepOutcome outcome;
  outcome.status = StepOutcome::Status::kAgreed;
  outcome.active = st->active_params;
  agreed_ = std::move(st);
  close.agreed = true;
  return outcome;
}

void StepEngine::commit(bool agree) {
  DMUON_CHECK(agreed_, "StepEngine::commit: no finished step to commit (call finish() first, and commit only "
              "when it returned kAgreed)");
  std::unique_ptr<StepState> st = std::move(agreed_);
  std::unique_ptr<Early> early = std::move(early_);
  // NOTE: set for the whole of commit(): its first pass writes (staged momentum, or the
  // first stage's momentum before its forward exchange), a rank without pieces of its own
  // there a little later.
  writes_began_ = true;
  st->result_flags = ops_.allocate(DType::kInt32, std::max(1, table_.num_params()));
  ops_.fill_zero(st->result_flags.get());
  if (early) {
    commit_early(*st, *early);
    commit_early_stages(*st, *early);
  }
  early.reset();  // NOTE: staging and held results are written back; free them before the pipeline's buffers
  run_pipeline(*st);
  if (!agree) {
    committed_ = std::move(st);
    return;
  }
  agree_results(*st);
}

std::vector<int64_t> StepEngine::agree_committed(const std::vector<int64_t>& extra_max) {
  DMUON_CHECK(committed_, "StepEngine::agree_committed: no step was committed without its result agreement");
  const std::unique_ptr<StepState> st = std::move(committed_);
  return agree_results(*st, extra_max);
}

void StepEngine::discard() {
  drain_early();
  early_.reset();
  agreed_.reset();
}

}  // namespace dmuon::step

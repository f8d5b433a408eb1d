// dmuon/step/engine_early.cpp — work begun before step(): items made ready early are
// checked, their momentum staged and their Newton–Schulz run at once; the results are
// held until the agreed step is committed (engine_step.cpp), or dropped.
#include <algorithm>
#include <map>
#include <tuple>
#include <utility>

#include "common/check.h"
#include "step/engine_state.h"

namespace dmuon::step {

void StepEngine::begin_step(const std::vector<GroupRule>& rules, int64_t step_idx) {
  DMUON_CHECK(!committed_, "StepEngine::begin_step(", step_name(step_idx), "): the last step's results are not "
              "agreed yet (call agree_committed first)");
  DMUON_CHECK(!step_open(), "StepEngine::begin_step(", step_name(step_idx), "): ",
              step_name(early_ ? early_->step_idx : agreed_->step_idx),
              " is still open (finish and commit it, or discard it)");
  for (const GroupRule& rule : rules) rule.validate();
  writes_began_ = false;
  // NOTE: early results are held as NS left them; NorMuon's transform (and its state) is
  // not wired into early work yet.
  for (size_t g = 0; g < rules.size(); ++g)
    DMUON_CHECK(!rules[g].normuon.enabled, "normuon=True (Muon group ", g,
                ") is not supported with early work (the weight-ownership mode)");
  for (int p = 0; p < table_.num_params(); ++p)
    DMUON_CHECK(table_.param(p).group >= 0 && static_cast<size_t>(table_.param(p).group) < rules.size(),
                "parameter '", table_.param(p).name, "': group index ", table_.param(p).group, " but ", rules.size(),
                " group rules");
  auto early = std::make_unique<Early>();
  early->step_idx = step_idx;
  early->rules = rules;
  early->flags = ops_.allocate(DType::kInt32, std::max(1, 2 * table_.num_params()));
  ops_.fill_zero(early->flags.get());
  const size_t n = static_cast<size_t>(table_.num_items());
  early->ready.assign(n, false);
  early->staged.resize(n);
  early->result.resize(n);
  early->marked.assign(n, false);
  // NOTE: the stages are fixed now (by the rules' algorithms), so that the stages
  // exchanged early are the ones finish() and commit() continue.
  make_stages_for(rules);
  early->forward.resize(stages_.size());
  early->back.resize(stages_.size());
  early->partials.resize(stages_.size());
  start_stats();
  early_ = std::move(early);
}

void StepEngine::items_ready(const std::vector<int>& items, const std::vector<ParamTensors>& tensors, bool watch) {
  DMUON_CHECK(early_, "StepEngine::items_ready: no step is begun (call begin_step first)");
  Early& early = *early_;
  const std::string at_step = " at " + step_name(early.step_idx);
  DMUON_CHECK(static_cast<int>(tensors.size()) == table_.num_params(), "StepEngine::items_ready: ", tensors.size(),
              " parameters' tensors for ", table_.num_params(), " parameters");
  // The ids, and the items this rank has work for: whole on it, computed by it.
  // NOTE: every id is checked before any is marked, so a refused call changes nothing.
  std::vector<int> work;
  std::vector<bool> in_call(static_cast<size_t>(table_.num_items()), false);
  for (int item : items) {
    DMUON_CHECK(item >= 0 && item < table_.num_items(), "StepEngine::items_ready: item id ", item,
                " is out of range [0, ", table_.num_items(), ")", at_step);
    const std::string name = "item '" + table_.item_name(item) + "' (id " + std::to_string(item) + ")";
    DMUON_CHECK(!early.ready[static_cast<size_t>(item)] && !in_call[static_cast<size_t>(item)],
                "StepEngine::items_ready: ", name, " was made ready twice", at_step);
    in_call[static_cast<size_t>(item)] = true;
    const Item& it = table_.item(item);
    // NOTE: an item that travels waits for its stage (advance_stages); one whole on its
    // owner is worked on at once (it changes no rank's collectives).
    const bool travels = world_ > 1 && table_.param(it.param_idx).whole_on_rank < 0;
    if (!travels && !computes(item, rank_)) continue;
    const ParamTensors& t = tensors[static_cast<size_t>(it.param_idx)];
    const ParamSpec& spec = table_.param(it.param_idx);
    DMUON_CHECK(t.has_grad, "StepEngine::items_ready: ", name, " has no gradient on rank ", rank_, at_step);
    const int64_t numel = table_.local_numel(it.param_idx, rank_);
    if (travels && numel == 0) continue;
    for (const auto& [b, what] : {std::make_pair(t.grad, "gradient"), std::make_pair(t.momentum, "momentum buffer")})
      DMUON_CHECK(b.dtype == spec.dtype && b.numel == numel && (numel == 0 || (b.data != nullptr && b.device == ops_.device())),
                  "StepEngine::items_ready: parameter '", spec.name, "' on rank ", rank_, ": its ", what, " holds ",
                  b.numel, " elements of ", dtype_name(b.dtype), " on ", device_name(b.device), ", expected ", numel,
                  " of ", dtype_name(spec.dtype), " on ", device_name(ops_.device()));
    if (!travels) work.push_back(item);
  }
  if (watch) {
    if (early.fingerprint.get().empty()) {
      early.fingerprint = ops_.allocate(DType::kInt32, 2);
      ops_.fill_zero(early.fingerprint.get());
    }
    add_fingerprint(items, tensors, early.fingerprint.get());
    early.watched.insert(early.watched.end(), items.begin(), items.end());
  }
  if (early.given.empty()) early.given.resize(static_cast<size_t>(table_.num_params()));
  for (int item : items) {
    early.marked[static_cast<size_t>(item)] = true;
    const size_t p = static_cast<size_t>(table_.item(item).param_idx);
    early.given[p] = tensors[p];
    if (world_ == 1 || table_.param(table_.item(item).param_idx).whole_on_rank >= 0)
      early.ready[static_cast<size_t>(item)] = true;
  }
  if (!work.empty()) {
    // NOTE: timed like the early stages' NS (EngineOptions::timing), so that the
    // share of NS inside backward counts these too (at world 1 they are all of it).
    exit_if_asked("ns", early.step_idx);
    const PhaseClock::Mark start = clock_.start();
    local_items_ready(work, tensors);
    clock_.stop(start, {{PhaseField::kEarlyLocalNs}});
  }
  advance_stages(tensors);
}

// NOTE: items_ready checked the pieces' sizes before it adds; finish() validated its
// tensors before it sums.
void StepEngine::add_fingerprint(const std::vector<int>& items, const std::vector<ParamTensors>& tensors,
                                 const Buffer& sum) {
  std::vector<FingerprintPiece> pieces;
  for (int item : items) {
    const Piece& piece = table_.piece(item, rank_);
    if (piece.empty()) continue;
    const Buffer& grad = tensors[static_cast<size_t>(table_.item(item).param_idx)].grad;
    pieces.push_back({piece_view(grad, piece), static_cast<uint64_t>(item)});
  }
  ops_.fingerprint(pieces, sum);
}

OwnedBuffer StepEngine::fingerprint_watched(const std::vector<ParamTensors>& tensors) {
  for (int item : early_->watched)
    if (!tensors[static_cast<size_t>(table_.item(item).param_idx)].has_grad) return {};
  OwnedBuffer sum = ops_.allocate(DType::kInt32, 2);
  ops_.fill_zero(sum.get());
  add_fingerprint(early_->watched, tensors, sum.get());
  return sum;
}

// Whether items_ready would work now (engine.h): what it works on at once, or the next
// stage complete. NOTE: true where items_ready would throw, so that the caller's hand-over
// reaches the check that names its fault.
bool StepEngine::items_start_work(const std::vector<int>& items) const {
  if (!early_) return true;
  const Early& early = *early_;
  std::vector<int> given = items;
  std::sort(given.begin(), given.end());
  for (int item : given) {
    if (item < 0 || item >= table_.num_items()) return true;
    const bool travels = world_ > 1 && table_.param(table_.item(item).param_idx).whole_on_rank < 0;
    if (!travels && computes(item, rank_)) return true;
  }
  if (world_ == 1 || early.next_stage >= stages_.size()) return false;
  for (const NsBatch& batch : stages_[early.next_stage].batches)
    for (int item : batch.items)
      if (!early.marked[static_cast<size_t>(item)] && !std::binary_search(given.begin(), given.end(), item))
        return false;
  return true;
}

// Items whole on this rank, which it computes: check, staged momentum and NS now.
void StepEngine::local_items_ready(const std::vector<int>& work, const std::vector<ParamTensors>& tensors) {
  Early& early = *early_;

  // Check and staging: momentum copied aside (the caller's buffer is never written before
  // the agreement), the check reads the gradient and that copy.
  std::vector<Buffer> momentum;
  for (int item : work) {
    const Item& it = table_.item(item);
    momentum.push_back(piece_view(tensors[static_cast<size_t>(it.param_idx)].momentum, table_.piece(item, rank_), it.cols));
  }
  const std::vector<Buffer> staged = stage_copies(momentum);
  std::vector<CheckPiece> pieces;
  std::vector<int> partial_of(static_cast<size_t>(table_.num_items()), -1);
  for (size_t k = 0; k < work.size(); ++k) {
    const int item = work[k];
    const Item& it = table_.item(item);
    const GroupRule& rule = early.rules[static_cast<size_t>(it.group)];
    partial_of[static_cast<size_t>(item)] = static_cast<int>(pieces.size());
    pieces.push_back({piece_view(tensors[static_cast<size_t>(it.param_idx)].grad, table_.piece(item, rank_), it.cols),
                      staged[k], {rule.momentum, rule.nesterov}, it.param_idx, true});
    early.staged[static_cast<size_t>(item)] = staged[k];
  }
  const Partials partials = ops_.check(pieces, early.flags.get());
  // NOTE: a NaN anywhere so far closes the gate: iterates get zeros (the ops' NS never
  // sees a non-finite input), the staged momentum stays as copied, and the agreement
  // refuses the step on every rank.
  const OwnedBuffer gate = ops_.make_gate(early.flags.get());

  // NS batches: same (group, dtype, shape), in order of first appearance, under the NS
  // workspace bound.
  std::vector<std::pair<std::tuple<int, int, int64_t, int64_t>, std::vector<int>>> runs;
  for (int item : work) {
    const Item& it = table_.item(item);
    const auto key = std::make_tuple(it.group, static_cast<int>(it.dtype), it.rows, it.cols);
    auto run = std::find_if(runs.begin(), runs.end(), [&](const auto& r) { return r.first == key; });
    if (run == runs.end()) run = runs.insert(runs.end(), {key, {}});
    run->second.push_back(item);
  }
  for (const auto& [key, members] : runs) {
    const auto [group, dtype_code, rows, cols] = key;
    const DType dtype = static_cast<DType>(dtype_code);
    const GroupRule& rule = early.rules[static_cast<size_t>(group)];
    const int64_t capacity = std::min<int64_t>(
        static_cast<int64_t>(members.size()),
        ns_batch_capacity(rows, cols, dtype, rule.schedule.algorithm, options_.ns_batch_bytes,
                          [&](int64_t r, int64_t c, int64_t k, DType d, ns::Algorithm a) {
                            return ops_.ns_workspace_bytes(r, c, k, d, a);
                          }));
    const std::vector<int64_t> ones(members.size(), 1);
    for (const std::vector<int>& part : split_near_equal(ones, capacity)) {
      const int64_t count = static_cast<int64_t>(part.size());
      const NsBatchDesc desc{rows, cols, count, dtype, &rule.schedule, options_.graphs};
      std::vector<LocalMatrix> matrices;
      for (size_t j = 0; j < part.size(); ++j) {
        const int item = members[static_cast<size_t>(part[j])];
        const Item& it = table_.item(item);
        const Piece& me = table_.piece(item, rank_);
        matrices.push_back({piece_view(tensors[static_cast<size_t>(it.param_idx)].grad, me, cols),
                            early.staged[static_cast<size_t>(item)], {rule.momentum, rule.nesterov},
                            partial_of[static_cast<size_t>(item)], static_cast<int64_t>(j)});
      }
      OwnedBuffer held;
      ops_.orthogonalize(
          desc, [&](const NsView& iterate, bool first) {
            ops_.prepare_to_iterate(matrices, partials, desc, iterate, first, gate.get());
          },
          [&](const NsView& result) {
            // NOTE: held in the result's own element type: exact, and 16 bits on CUDA.
            if (held.get().numel != count * rows * cols || held.get().dtype != result.dtype)
              held = ops_.allocate(result.dtype, count * rows * cols);
            std::vector<WirePiece> rows_of;
            for (int64_t j = 0; j < count; ++j)
              rows_of.push_back({held.get().slice(j * rows * cols, rows * cols), j, 0, rows});
            ops_.result_to_pieces(result, desc, rows_of);
          });
      for (size_t j = 0; j < part.size(); ++j)
        early.result[static_cast<size_t>(members[static_cast<size_t>(part[j])])] =
            held.get().slice(static_cast<int64_t>(j) * rows * cols, rows * cols);
      early.held.push_back(std::move(held));
      ++early.num_batches;
      early.num_items += count;
    }
  }
}

// The agreed step's early items: staged momentum into the buffers, held results applied.
void StepEngine::commit_early(StepState& st, Early& early) {
  const PhaseClock::Mark start = clock_.start();
  std::vector<CopyPiece> momentum;
  std::vector<ApplyPiece> apply;
  for (int item = 0; item < table_.num_items(); ++item) {
    if (early.staged[static_cast<size_t>(item)].empty() && early.result[static_cast<size_t>(item)].empty())
      continue;
    const Item& it = table_.item(item);
    const ParamTensors& t = (*st.tensors)[static_cast<size_t>(it.param_idx)];
    const GroupRule& rule = (*st.rules)[static_cast<size_t>(it.group)];
    const Piece& me = table_.piece(item, rank_);
    momentum.push_back({early.staged[static_cast<size_t>(item)], piece_view(t.momentum, me, it.cols)});
    apply.push_back({piece_view(t.param, me, it.cols), early.result[static_cast<size_t>(item)], 0, 0, it.rows,
                     item_scale(rule, item), rule.decay(), it.param_idx});
  }
  ops_.copy(momentum);
  if (!apply.empty()) ops_.apply_pieces(apply, Buffer{}, st.result_flags.get());
  stats_.num_orthogonalized += early.num_items;
  stats_.num_ns_batches += early.num_batches;
  clock_.stop(start, {{PhaseField::kApply}});
}

// Copies of `sources` in memory the open step holds (one allocation per dtype, each copy
// starting on a 16-byte boundary as its own allocation would), made by one copy() call.
// NOTE: one list per stage, not a copy per parameter: at fake world 64 the early stages
// staged Qwen2.5-1.5B's 196 momentum buffers one by one inside backward.
std::vector<Buffer> StepEngine::stage_copies(const std::vector<Buffer>& sources) {
  Early& early = *early_;
  const auto padded = [](const Buffer& b) {
    const int64_t unit = std::max<int64_t>(1, 16 / dtype_size(b.dtype));
    return (b.numel + unit - 1) / unit * unit;
  };
  std::map<DType, int64_t> total;
  for (const Buffer& b : sources) total[b.dtype] += padded(b);
  std::map<DType, std::pair<Buffer, int64_t>> memory;  // dtype → (its allocation, elements handed out)
  for (const auto& [dtype, numel] : total) {
    early.staging.push_back(ops_.allocate(dtype, numel));
    memory[dtype] = {early.staging.back().get(), 0};
  }
  std::vector<Buffer> copies;
  std::vector<CopyPiece> pieces;
  for (const Buffer& b : sources) {
    auto& [whole, used] = memory[b.dtype];
    copies.push_back(whole.slice(used, b.numel, "a staged momentum copy"));
    used += padded(b);
    pieces.push_back({b, copies.back()});
  }
  ops_.copy(pieces);
  return copies;
}

// ---- Early stages: items that travel.

// Issues the forward of every stage whose items are all marked, strictly in stage order,
// and after each the NS of the stage before it (one stage of slack for its exchange) and
// that stage's return. NOTE: forward s+1 then return s, stage by stage: the collective
// order every rank shares, however its stages completed across calls. A return lands only
// in commit(), so it may leave inside backward: what is left at step() is the last
// stage's NS and return.
// NOTE: a stage is complete on a rank from what the caller marked there; every rank marks
// the same items by the time finish() agrees (the hooks fire for the same parameters), so
// every rank issues the same stages. A stage with an item never marked (a parameter
// without a gradient this step) and every stage after it go through commit()'s pipeline.
void StepEngine::advance_stages(const std::vector<ParamTensors>& tensors) {
  Early& early = *early_;
  if (world_ == 1) return;
  while (early.next_stage < stages_.size()) {
    const Stage& stage = stages_[early.next_stage];
    bool complete = true;
    for (const NsBatch& batch : stage.batches)
      for (int item : batch.items) complete = complete && early.marked[static_cast<size_t>(item)];
    if (!complete) break;
    issue_early_stage(early.next_stage, tensors);
    ++early.next_stage;
    if (early.ns_done + 1 == early.next_stage) continue;
    const PhaseClock::Mark start = clock_.start();
    const int64_t before = stats_.num_orthogonalized;
    run_early_ns(early.ns_done++);
    clock_.stop(start, {{PhaseField::kEarlyNs}});
    early.ns_items += stats_.num_orthogonalized - before;
  }
}

// Stage s's check (into the early flags), momentum into staged copies, U into its send
// buffer, and its forward exchange.
void StepEngine::issue_early_stage(size_t s, const std::vector<ParamTensors>& /*tensors: Early::given instead*/) {
  Early& early = *early_;
  if (!early.st) {
    early.st = new_state(table_.num_items(), table_.num_params(), 0);
    early.st->tensors_kept.resize(static_cast<size_t>(table_.num_params()));
    early.st->tensors = &early.st->tensors_kept;
    early.st->rules = &early.rules;
    early.st->step_idx = early.step_idx;
    early.st->hold = true;
    // NOTE: an early stage exchanges exactly its items that travel (items_ready worked on
    // the others at once), so every stage issued early runs the plan of that set.
    for (int i = 0; i < table_.num_items(); ++i)
      early.st->active[static_cast<size_t>(i)] = table_.param(table_.item(i).param_idx).whole_on_rank < 0;
    early.st->plan = plan_for(early.st->active);
    early.staged_param.resize(static_cast<size_t>(table_.num_params()));
  }
  StepState& st = *early.st;
  std::vector<int> items;  // the stage's items with a piece here, not worked on at once
  for (const NsBatch& batch : stages_[s].batches)
    for (int item : batch.items) {
      if (early.ready[static_cast<size_t>(item)]) continue;  // whole on its owner: done at once
      early.ready[static_cast<size_t>(item)] = true;
      if (!table_.piece(item, rank_).empty()) items.push_back(item);
    }
  // NOTE: the caller's momentum is never written before the agreement: a copy of each
  // parameter's local momentum takes this step's (commit() copies it back).
  std::vector<int> to_stage;
  std::vector<Buffer> momentum;
  for (int item : items) {
    const int p = table_.item(item).param_idx;
    if (!early.staged_param[static_cast<size_t>(p)].empty() ||
        std::find(to_stage.begin(), to_stage.end(), p) != to_stage.end())
      continue;
    to_stage.push_back(p);
    momentum.push_back(early.given[static_cast<size_t>(p)].momentum);
  }
  const std::vector<Buffer> staged = stage_copies(momentum);
  for (size_t k = 0; k < to_stage.size(); ++k) {
    const size_t p = static_cast<size_t>(to_stage[k]);
    const ParamTensors& t = early.given[p];
    early.staged_param[p] = staged[k];
    st.tensors_kept[p] = {t.param, t.grad, staged[k], true};
  }
  std::vector<CheckPiece> pieces;
  int num_summed = 0;  // NOTE: partial_of indexes the summed pieces of this stage's check
  for (int item : items) {
    const Item& it = table_.item(item);
    const ParamTensors& t = st.tensors_kept[static_cast<size_t>(it.param_idx)];
    const Piece& piece = table_.piece(item, rank_);
    const GroupRule& rule = early.rules[static_cast<size_t>(it.group)];
    const bool sum = computes(item, rank_) && table_.whole_on(item, rank_);
    if (sum) st.partial_of[static_cast<size_t>(item)] = num_summed++;
    pieces.push_back({piece_view(t.grad, piece), piece_view(t.momentum, piece), {rule.momentum, rule.nesterov},
                      it.param_idx, sum});
  }
  if (!pieces.empty()) early.partials[s] = ops_.check(pieces, early.flags.get());
  // NOTE: a NaN so far closes the gate: pieces go out as zeros, and the agreement refuses
  // the step on every rank.
  st.gate = ops_.make_gate(early.flags.get());
  early.forward[s] = issue_forward(s, st);
}

// Stage s's NS on this rank from its received pieces, its return issued; own rows held
// (StepState::hold).
void StepEngine::run_early_ns(size_t s) {
  Early& early = *early_;
  StepState& st = *early.st;
  st.partials = std::move(early.partials[s]);
  early.back[s] = run_stage(s, st, early.forward[s]);
}

// finish(): the NS and return of the stages issued early and not yet run (before the
// agreement, gated).
void StepEngine::finish_early_stages() {
  if (!early_) return;
  Early& early = *early_;
  while (early.ns_done < early.next_stage) run_early_ns(early.ns_done++);
}

// commit(): the early stages' staged momentum into the buffers, their returns (issued
// after their NS) landed in stage order, and this rank's own rows applied.
void StepEngine::commit_early_stages(StepState& st, Early& early) {
  if (early.next_stage == 0) return;
  const PhaseClock::Mark start = clock_.start();
  std::vector<CopyPiece> momentum;
  for (int p = 0; p < table_.num_params(); ++p)
    if (!early.staged_param[static_cast<size_t>(p)].empty())
      momentum.push_back({early.staged_param[static_cast<size_t>(p)], (*st.tensors)[static_cast<size_t>(p)].momentum});
  ops_.copy(momentum);
  StepState& es = *early.st;
  // NOTE: the early state applies with this step's result flags and an open gate (the
  // agreement passed); its tensors' params are the caller's.
  es.result_flags = std::move(st.result_flags);
  es.gate = OwnedBuffer{};
  const std::vector<ParamTensors> es_tensors_at_issue = std::move(es.tensors_kept);
  es.tensors_kept = *st.tensors;
  es.rules = st.rules;
  for (size_t s = 0; s < early.next_stage; ++s) {
    Flight& back = early.back[s];
    // NOTE: own rows were described on items_ready's tensors; they apply to finish()'s
    // (the same memory where the caller passes the same tensors), at the same offset.
    for (size_t k = 0; k < back.own_apply.size(); ++k) {
      ApplyPiece& a = back.own_apply[k];
      // NOTE: lr and weight decay are finish()'s (a scheduler may change them after backward).
      const int item = back.own_items[k];
      const GroupRule& rule = (*st.rules)[static_cast<size_t>(table_.item(item).group)];
      a.scale = item_scale(rule, item);
      a.decay = rule.decay();
      const Buffer& was = es_tensors_at_issue[static_cast<size_t>(a.flag_idx)].param;
      const Buffer& now = (*st.tensors)[static_cast<size_t>(a.flag_idx)].param;
      const int64_t offset = (static_cast<const char*>(a.param.data) - static_cast<const char*>(was.data)) /
                             dtype_size(a.param.dtype);
      a.param = a.param.strided() ? now.rows(offset, a.param.numel / a.param.row_len, a.param.row_len, a.param.ld,
                                             "an early stage's own rows")
                                  : now.slice(offset, a.param.numel, "an early stage's own rows");
    }
    if (!back.own_apply.empty()) ops_.apply_pieces(back.own_apply, Buffer{}, es.result_flags.get());
    land(s, es, back);
  }
  st.result_flags = std::move(es.result_flags);
  clock_.stop(start, {{PhaseField::kApply}});
}

// Drops the early stages: exchanges still in flight are waited for (every rank issued them).
void StepEngine::drain_early() {
  if (!early_) return;
  for (std::vector<Flight>* flights : {&early_->forward, &early_->back})
    for (Flight& f : *flights)
      if (f.pending) f.pending->wait();
}

// A fresh step's stats, with a timeline line per stage.
void StepEngine::start_stats() {
  clock_.drop();
  stats_ = StepStats{};
  stats_.pipeline_depth = depth_;
  stats_.stages.resize(stages_.size());
  for (size_t s = 0; s < stages_.size(); ++s) {
    StageTimeline& line = stats_.stages[s];
    line.stage_idx = static_cast<int64_t>(s);
    for (auto* v : {&line.forward_sent_to, &line.forward_received_from, &line.return_sent_to,
                    &line.return_received_from})
      v->assign(static_cast<size_t>(world_), 0);
  }
}

void StepEngine::add_phase_seconds(const PhaseTarget& target, double seconds) {
  const auto stage_line = [&]() -> StageTimeline* {
    return target.stage < stats_.stages.size() ? &stats_.stages[target.stage] : nullptr;
  };
  switch (target.field) {
    case PhaseField::kMomentum: stats_.momentum_s += seconds; break;
    case PhaseField::kModelFill: stats_.model_fill_s += seconds; break;
    case PhaseField::kNs: stats_.ns_s += seconds; break;
    case PhaseField::kApply: stats_.apply_s += seconds; break;
    case PhaseField::kEarlyNs:
      if (early_) early_->ns_s += seconds;
      break;
    case PhaseField::kEarlyLocalNs:
      if (early_) early_->local_ns_s += seconds;
      break;
    case PhaseField::kStagePrepare:
      if (StageTimeline* line = stage_line()) line->prepare_s += seconds;
      break;
    case PhaseField::kStageNs:
      if (StageTimeline* line = stage_line()) line->ns_s += seconds;
      break;
    case PhaseField::kStageApply:
      if (StageTimeline* line = stage_line()) line->apply_s += seconds;
      break;
  }
}

}  // namespace dmuon::step

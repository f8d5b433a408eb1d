// dmuon/step/engine.cpp — the pipelined step (the plan: engine_plan.cpp).
#include "step/engine.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <map>
#include <sstream>
#include <tuple>
#include <utility>

#include "common/check.h"
#include "common/env.h"
#include "ns/batch_streams.h"
#include "ns/ns_bound.h"
#include "step/engine_state.h"

namespace dmuon::step {

StepEngine::~StepEngine() = default;

StepEngine::StepEngine(Transport& transport, DeviceOps& ops, std::vector<ParamSpec> params, EngineOptions options)
    : transport_(transport),
      ops_(ops),
      table_(std::move(params), transport.world_size()),
      options_(std::move(options)),
      rank_(transport.rank()),
      world_(transport.world_size()),
      clock_(ops, options_.timing, [this](const PhaseTarget& t, double seconds) { add_phase_seconds(t, seconds); }) {
  options_.validate();
  DMUON_CHECK(rank_ >= 0 && rank_ < world_, "StepEngine: rank ", rank_, " outside a world of ", world_);
  wire_dtype_ = resolve_wire_dtype(options_.wire_dtype, ops_.device().kind);
  depth_ = options_.depth_for(world_);
  // NOTE: decided from every rank's pieces, so that every rank refuses alike.
  for (int p = 0; p < table_.num_params(); ++p) {
    const ParamSpec& spec = table_.param(p);
    if (ops_.strided_pieces(spec.dtype)) continue;
    for (int r = 0; r < world_; ++r)
      DMUON_CHECK(!table_.strided_on(p, r), "parameter '", spec.name, "': its ", spec.layout.col_blocks,
                  " column blocks are strided pieces of its local tensors, which the ", device_name(ops_.device()),
                  " step ops do not read for ", dtype_name(spec.dtype),
                  " parameters yet; leave its group unsplit (split_dim=None)");
  }
  // Test hook: where this process ends as a crashed rank would (read when the engine is made).
  const std::string exit_at = env::kTestExit.get();
  if (!exit_at.empty()) {
    const size_t at = exit_at.find('@');
    test_exit_phase_ = exit_at.substr(0, at);
    DMUON_CHECK(at != std::string::npos && (test_exit_phase_ == "exchange" || test_exit_phase_ == "ns") &&
                    exit_at.find_first_not_of("0123456789", at + 1) == std::string::npos && at + 1 < exit_at.size(),
                "DMUON_TEST_EXIT must be PHASE@STEP with PHASE exchange or ns, got '", exit_at, "'");
    test_exit_step_ = std::stoll(exit_at.substr(at + 1));
  }
  make_plan();
}

// NOTE: std::_Exit, not an error: the fault tests need a rank that vanishes mid-step (no
// unwinding, no Python handler, its sockets closed by the kernel), as a crashed one does.
void StepEngine::exit_if_asked(const char* phase, int64_t step_idx) const {
  if (step_idx == test_exit_step_ && test_exit_phase_ == phase) std::_Exit(17);
}

// NOTE: a matrix stored transposed (HF Conv1D, layout::ParamLayout::transposed) takes the lr
// ratio of its (cols, rows), the shape the model uses it in.
double StepEngine::item_scale(const GroupRule& rule, int item) const {
  const Item& it = table_.item(item);
  const auto [m, n] = table_.param(it.param_idx).layout.update_shape(it.rows);
  return rule.update_scale(m, n);
}

bool StepEngine::computes(int item, int rank) const {
  const int owner = owners_[static_cast<size_t>(item)];
  return owner == kEveryRank || owner == rank;
}

void StepEngine::validate(const std::vector<ParamTensors>& tensors, const std::vector<GroupRule>& rules,
                          const std::vector<CheckOnly>& extra) const {
  for (const CheckOnly& e : extra)
    DMUON_CHECK(e.grad.numel == 0 || (e.grad.data != nullptr && e.grad.device == ops_.device()), "gradient '", e.name,
                "' (checked with the step) on rank ", rank_, " is on ", device_name(e.grad.device), ", expected ",
                device_name(ops_.device()));
  DMUON_CHECK(static_cast<int>(tensors.size()) == table_.num_params(), "StepEngine::step: ", tensors.size(),
              " parameters' tensors for ", table_.num_params(), " parameters");
  for (const GroupRule& rule : rules) rule.validate();
  const Device device = ops_.device();
  for (int p = 0; p < table_.num_params(); ++p) {
    const ParamSpec& spec = table_.param(p);
    const ParamTensors& t = tensors[static_cast<size_t>(p)];
    const int64_t numel = table_.local_numel(p, rank_);
    const layout::RowBlock rows = table_.local_rows(p, rank_), cols = table_.local_cols(p, rank_);
    DMUON_CHECK(spec.group >= 0 && static_cast<size_t>(spec.group) < rules.size(), "parameter '", spec.name,
                "': group index ", spec.group, " but ", rules.size(), " group rules");
    std::string why;
    DMUON_CHECK(ops_.supports(spec.dtype, &why), "parameter '", spec.name, "': ", why);
    // NOTE: a rank that holds none of a parameter (an empty shard, a matrix whole on
    // another rank) may pass any empty view: there is nothing of it to read or write.
    auto check = [&](const Buffer& b, const char* what) {
      DMUON_CHECK(numel == 0 ? b.numel == 0
                             : b.dtype == spec.dtype && b.numel == numel && b.data != nullptr && b.device == device,
                  "parameter '", spec.name, "' on rank ", rank_, ": its ", what, " holds ", b.numel, " elements of ",
                  dtype_name(b.dtype), " on ", device_name(b.device), ", but its layout gives this rank ", rows.count,
                  " flat rows from ", rows.begin, " × columns [", cols.begin, ", ", cols.begin + cols.count, ") of ",
                  spec.layout.cols(), " = ", numel, " elements of ", dtype_name(spec.dtype), " on ",
                  device_name(device));
    };
    check(t.param, "local parameter");
    if (t.has_grad) {
      check(t.grad, "gradient");
      check(t.momentum, "momentum buffer");
    }
    if (rules[static_cast<size_t>(spec.group)].normuon.enabled) validate_normuon(p, t);
  }
}

// NOTE: NorMuon needs every row's v on the rank that computes a matrix
// (engine_normuon.cpp moves it there and back); gather mode (every rank computes every
// matrix) would need every v everywhere and is refused by name.
void StepEngine::validate_normuon(int param_idx, const ParamTensors& t) const {
  const ParamSpec& spec = table_.param(param_idx);
  // NOTE: v holds one value per parameter row; every column block holds every row again.
  DMUON_CHECK(!spec.layout.splits_cols(), "parameter '", spec.name, "': normuon=True with ", spec.layout.col_blocks,
              " column blocks is not supported (NorMuon's state is one value per parameter row)");
  DMUON_CHECK(world_ == 1 || options_.mode == Mode::kOwner, "parameter '", spec.name,
              "': normuon=True is not supported in gather mode (every rank orthogonalizing every matrix)");
  const int64_t numel = table_.local_numel(param_idx, rank_);
  const int64_t cols = table_.local_cols(param_idx, rank_).count;
  const int64_t rows = numel == 0 ? 0 : numel / cols;
  DMUON_CHECK(!t.has_grad || (t.row_state.dtype == DType::kFloat32 && t.row_state.numel == rows &&
                              (rows == 0 || (t.row_state.data != nullptr && t.row_state.device == ops_.device()))),
              "parameter '", spec.name, "' on rank ", rank_, ": its NorMuon state (normuon_v) holds ",
              t.row_state.numel, " elements of ", dtype_name(t.row_state.dtype), " on ",
              device_name(t.row_state.device), "; expected float32 [", rows, "] (one per local row) on ",
              device_name(ops_.device()));
}

StepEngine::Flight StepEngine::issue_forward(size_t s, StepState& st) {
  const auto start = Clock::now();
  const StagePlan& plan = st.plan->stages[s];
  const std::vector<ParamTensors>& tensors = *st.tensors;
  StageTimeline& line = stats_.stages[s];
  Flight f;
  f.send = ops_.allocate(wire_dtype_, plan.forward_send_numel);
  f.recv = ops_.allocate(wire_dtype_, plan.forward.recv_numel);
  stats_.pack_s += seconds_since(start);

  // Momentum of every piece the plan prepares; U into its first place in the send buffer
  // (the others, in gather mode, are copies).
  const PhaseClock::Mark prepare_start = clock_.start();
  std::vector<PreparePiece> prepare;
  std::vector<CopyPiece> copies;
  for (const PreparePlan& piece : plan.prepare) {
    const Item& it = table_.item(piece.item);
    const ParamTensors& t = tensors[static_cast<size_t>(it.param_idx)];
    const GroupRule& rule = (*st.rules)[static_cast<size_t>(it.group)];
    const int64_t numel = piece.piece.numel();
    const Buffer first = piece.targets.empty() ? Buffer{} : f.send.get().slice(piece.targets.front(), numel);
    prepare.push_back({piece_view(t.grad, piece.piece), piece_view(t.momentum, piece.piece),
                       {rule.momentum, rule.nesterov}, first});
    for (size_t k = 1; k < piece.targets.size(); ++k)
      copies.push_back({first, f.send.get().slice(piece.targets[k], numel)});
  }
  if (!prepare.empty()) ops_.prepare_pieces(prepare, st.gate.get());
  ops_.copy(copies);
  clock_.stop(prepare_start, {{PhaseField::kMomentum}, {PhaseField::kStagePrepare, s}});

  exit_if_asked("exchange", st.step_idx);
  issue_exchange(f, f.send.get().slice(0, plan.forward.send_numel), plan.forward,
                 "all_to_all of stage " + std::to_string(s) + "'s pieces to their owners (" + step_name(st.step_idx) +
                     ")",
                 line.forward_sent_to, line.forward_received_from,
                 // NOTE: never 0 (0 asks for zeros); a seed per step and stage.
                 (static_cast<uint64_t>(st.step_idx) << 32) + s + 1);
  return f;
}

void StepEngine::issue_exchange(Flight& f, const Buffer& send, const ExchangeCounts& counts, const std::string& what,
                                std::vector<int64_t>& sent_to, std::vector<int64_t>& received_from,
                                uint64_t synthetic_seed) {
  // NOTE: a transport that moves nothing leaves the receive buffer as it was. The fake
  // world's model (layout/world_model.h) says what arrived: synthetic full-rank updates for an owner's NS (an
  // assembled matrix of zeros would draw less power and time its GEMMs too short),
  // zeros for returned results (the apply's time does not depend on values). Not real
  // work: outside every phase, its time in model_fill_s (timed as EngineOptions::timing says).
  if (!transport_.moves_data() && !f.recv.get().empty()) {
    const PhaseClock::Mark fill_start = clock_.start();
    if (synthetic_seed != 0) ops_.fill_synthetic(f.recv.get(), synthetic_seed);
    else ops_.fill_zero(f.recv.get());
    clock_.stop(fill_start, {{PhaseField::kModelFill}});
  }
  const auto start = Clock::now();
  if (counts.issued) f.pending = transport_.all_to_all(send, counts.send_counts, f.recv.get(), counts.recv_counts, what);
  // NOTE: added, not set: a stage exchanged early keeps its bytes when commit()'s
  // pipeline passes it again with nothing left to move.
  const int64_t wire_size = dtype_size(wire_dtype_);
  for (int r = 0; r < world_; ++r) {
    const int64_t sent = counts.send_counts[static_cast<size_t>(r)] * wire_size;
    const int64_t received = counts.recv_counts[static_cast<size_t>(r)] * wire_size;
    sent_to[static_cast<size_t>(r)] += sent;
    received_from[static_cast<size_t>(r)] += received;
    stats_.bytes_sent += sent;
    stats_.bytes_received += received;
  }
  stats_.pack_s += seconds_since(start);
}

std::vector<int> StepEngine::stream_assignment(const std::vector<const NsBatch*>& batches,
                                               const std::vector<GroupRule>& rules) {
  std::vector<int> zeros(batches.size(), 0);
  if (options_.num_streams <= 1 || batches.size() <= 1) return zeros;
  // NOTE: the same batches under the same schedules get the same streams: their bounds are
  // computed once (they were 60% of a one-process step's host time, 168 matrices in 4 batches).
  std::vector<double> key;
  for (const NsBatch* b : batches) {
    const ns::Schedule& schedule = rules[static_cast<size_t>(b->group)].schedule;
    key.insert(key.end(), {static_cast<double>(b->group), static_cast<double>(b->dtype), static_cast<double>(b->rows),
                           static_cast<double>(b->cols), static_cast<double>(b->items.size()),
                           static_cast<double>(schedule.algorithm), schedule.eps,
                           static_cast<double>(schedule.steps.size()),
                           static_cast<double>(schedule.restart_after.size())});
    for (const ns::Coefficients& c : schedule.steps) key.insert(key.end(), {c.a, c.b, c.c});
    key.insert(key.end(), schedule.restart_after.begin(), schedule.restart_after.end());
  }
  const auto known = stream_plans_.find(key);
  if (known != stream_plans_.end()) return known->second;
  // NOTE: the floor at nominal H200 rates: only the costs' ratios matter here.
  constexpr double kFlopsPerSecond = 775e12, kBytesPerSecond = 4.0e12;
  std::map<std::tuple<int, int, int64_t, int64_t>, int64_t> kind_of;
  std::vector<ns::StreamJob> jobs;
  for (const NsBatch* b : batches) {
    const auto kind = kind_of.emplace(std::make_tuple(b->group, static_cast<int>(b->dtype), b->rows, b->cols),
                                      static_cast<int64_t>(kind_of.size()))
                          .first->second;
    const std::vector<std::pair<int64_t, int64_t>> shapes(b->items.size(), {b->rows, b->cols});
    const ns::StepBound bound = ns::fused_step_bound(shapes, rules[static_cast<size_t>(b->group)].schedule,
                                                     kFlopsPerSecond, kBytesPerSecond);
    jobs.push_back({kind, bound.seconds()});
  }
  if (stream_plans_.size() >= kMaxStreamPlans) stream_plans_.clear();
  return stream_plans_.emplace(std::move(key), ns::assign_streams(jobs, options_.num_streams)).first->second;
}

StepEngine::Flight StepEngine::run_stage(size_t s, StepState& st, Flight& forward) {
  const StagePlan& plan = st.plan->stages[s];
  const std::vector<ParamTensors>& tensors = *st.tensors;
  const std::vector<GroupRule>& rules = *st.rules;
  StageTimeline& line = stats_.stages[s];

  auto start = Clock::now();
  if (forward.pending) forward.pending->wait();
  double waited = seconds_since(start);
  stats_.comm_wait_s += waited;
  line.forward_wait_s += waited;

  const PhaseClock::Mark ns_start = clock_.start();
  // The return's buffers (mode owner).
  Flight back;
  if (options_.mode == Mode::kOwner) {
    back.send = ops_.allocate(wire_dtype_, plan.back.send_numel);
    back.recv = ops_.allocate(wire_dtype_, plan.back.recv_numel);
  }

  // This rank's NS batches of the stage, on the streams the assignment gives them.
  std::vector<const NsBatch*> order;
  for (const BatchPlan& batch : plan.batches) order.push_back(&batch.batch);
  bool warm = true;
  for (const NsBatch* b : order)
    warm = warm && warm_batches_.count({b->group, static_cast<int>(b->dtype), b->rows, b->cols,
                                        static_cast<int64_t>(b->items.size())}) > 0;
  const std::vector<int> stream_of = warm ? stream_assignment(order, rules) : std::vector<int>(order.size(), 0);
  const Buffer gate = st.gate.get();
  const Buffer flags = st.result_flags.get();
  if (!order.empty()) exit_if_asked("ns", st.step_idx);
  // Held own rows (st.hold), per batch: written by its result pass, applied by commit().
  std::vector<std::vector<std::tuple<OwnedBuffer, ApplyPiece, int>>> held(order.size());
  const int num_streams = ops_.run_on_streams(stream_of, [&](size_t k) {
    const BatchPlan& batch_plan = plan.batches[k];
    const NsBatch& batch = batch_plan.batch;
    const GroupRule& rule = rules[static_cast<size_t>(batch.group)];
    const NsBatchDesc desc{batch.rows, batch.cols, static_cast<int64_t>(batch.items.size()), batch.dtype,
                           &rule.schedule, options_.graphs};
    const double decay = rule.decay();
    std::vector<LocalMatrix> local_update, local_read;
    std::vector<WirePiece> pieces, returns;
    std::vector<ApplyPiece> own;
    std::vector<NormuonMatrix> normuon;
    for (size_t j = 0; j < batch_plan.items.size(); ++j) {
      const ComputePlan& c = batch_plan.items[j];
      const Item& it = table_.item(c.item);
      const ParamTensors& t = tensors[static_cast<size_t>(it.param_idx)];
      const int64_t idx = static_cast<int64_t>(j);
      // A whole item from its local tensors; else one wire piece per block.
      if (c.whole) {
        LocalMatrix m{piece_view(t.grad, c.piece), piece_view(t.momentum, c.piece),
                      {rule.momentum, rule.nesterov}, st.partial_of[static_cast<size_t>(c.item)], idx};
        (c.momentum_prepared ? local_read : local_update).push_back(m);
      }
      for (const WirePlace& b : c.blocks)
        pieces.push_back({(b.in_send ? forward.send : forward.recv).get().slice(b.offset, b.block.numel()), idx,
                          b.block.row_begin, b.block.row_count, b.block.col_begin, b.block.col_count});
      // NorMuon's whole v of this matrix (engine_normuon.cpp).
      if (rule.normuon.enabled && !st.normuon_v[static_cast<size_t>(c.item)].empty())
        normuon.push_back({st.normuon_v[static_cast<size_t>(c.item)], idx, it.param_idx});
      for (const WirePlace& r : c.returns)
        returns.push_back({back.send.get().slice(r.offset, r.block.numel()), idx, r.block.row_begin, r.block.row_count,
                           r.block.col_begin, r.block.col_count});
      if (c.applies) {
        ApplyPiece a{piece_view(t.param, c.piece), Buffer{}, idx, c.piece.row_begin, c.piece.row_count,
                     item_scale(rule, c.item), decay, it.param_idx};
        // NOTE: replicas apply what the wire brings them; so does the owner, bit for bit.
        a.round_through_wire = c.round_through_wire;
        a.wire_dtype = wire_dtype_;
        a.col_begin = c.piece.col_begin;
        a.col_count = c.piece.col_count;
        own.push_back(a);
      }
    }
    ops_.orthogonalize(
        desc,
        [&](const NsView& iterate, bool first) {
          if (!local_update.empty()) ops_.prepare_to_iterate(local_update, st.partials, desc, iterate, first, gate);
          if (!local_read.empty()) ops_.prepare_to_iterate(local_read, st.partials, desc, iterate, false, gate);
          if (!pieces.empty()) ops_.iterate_from_pieces(pieces, desc, iterate, gate);
        },
        [&](const NsView& ns_result) {
          // NOTE: NorMuon's row factors may ride on the view to its consumers (scale_memory
          // holds them until they are enqueued below).
          NsView result = ns_result;
          const OwnedBuffer scale_memory =
              normuon.empty() ? OwnedBuffer{} : ops_.normuon(result, desc, normuon, rule.normuon, gate, flags);
          if (!returns.empty()) ops_.result_to_pieces(result, desc, returns);
          if (own.empty()) return;
          if (!st.hold) {
            ops_.apply_result(result, desc, own, gate, flags);
            return;
          }
          // NOTE: held in the element type apply_result would read (the result's, or the
          // wire's for rows replicas also hold), so that the later apply is bit for bit its.
          std::vector<WirePiece> rows_of;
          for (ApplyPiece a : own) {
            OwnedBuffer h = ops_.allocate(a.round_through_wire ? a.wire_dtype : result.dtype, a.param.numel);
            rows_of.push_back({h.get(), a.matrix_idx, a.row_begin, a.row_count, a.col_begin, a.col_count});
            a.wire = h.get();
            held[k].emplace_back(std::move(h), a, batch.items[static_cast<size_t>(a.matrix_idx)]);
          }
          ops_.result_to_pieces(result, desc, rows_of);
        });
  });
  for (const NsBatch* b : order) {
    warm_batches_.insert({b->group, static_cast<int>(b->dtype), b->rows, b->cols, static_cast<int64_t>(b->items.size())});
    stats_.ns_batches.emplace_back(static_cast<int64_t>(b->items.size()), b->rows, b->cols);
    stats_.num_orthogonalized += static_cast<int64_t>(b->items.size());
    line.num_items += static_cast<int64_t>(b->items.size());
  }
  stats_.num_ns_batches += static_cast<int64_t>(order.size());
  line.num_batches += static_cast<int64_t>(order.size());
  if (!order.empty()) stats_.num_streams = std::max<int64_t>(stats_.num_streams, num_streams);
  forward = Flight{};  // NOTE: the stage's forward buffers are read; free them before the next stage's
  clock_.stop(ns_start, {{PhaseField::kNs}, {PhaseField::kStageNs, s}});

  for (auto& batch_held : held)
    for (auto& [h, a, item] : batch_held) {
      back.own_held.push_back(std::move(h));
      back.own_apply.push_back(a);
      back.own_items.push_back(item);
    }
  // NOTE: held or not, the return leaves now: nothing is written until it lands (commit()).
  issue_exchange(back, back.send.get(), plan.back,
                 "all_to_all of stage " + std::to_string(s) + "'s results back from their owners (" +
                     step_name(st.step_idx) + (st.hold ? ", exchanged early)" : ")"),
                 line.return_sent_to, line.return_received_from, 0);
  return back;
}

void StepEngine::land(size_t s, StepState& st, Flight& back) {
  const StagePlan& plan = st.plan->stages[s];
  StageTimeline& line = stats_.stages[s];
  auto start = Clock::now();
  if (back.pending) back.pending->wait();
  const double waited = seconds_since(start);
  stats_.comm_wait_s += waited;
  line.return_wait_s += waited;

  // The rows other owners returned to this rank, from the places the plan gives them.
  const PhaseClock::Mark apply_start = clock_.start();
  std::vector<ApplyPiece> apply;
  for (const LandPlan& rows : plan.land) {
    const Item& it = table_.item(rows.item);
    const GroupRule& rule = (*st.rules)[static_cast<size_t>(it.group)];
    const Piece& p = rows.place.block;
    apply.push_back({piece_view((*st.tensors)[static_cast<size_t>(it.param_idx)].param, p),
                     back.recv.get().slice(rows.place.offset, p.numel()), 0, p.row_begin, p.row_count,
                     item_scale(rule, rows.item), rule.decay(), it.param_idx});
  }
  if (!apply.empty()) ops_.apply_pieces(apply, st.gate.get(), st.result_flags.get());
  back = Flight{};
  clock_.stop(apply_start, {{PhaseField::kApply}, {PhaseField::kStageApply, s}});
}

StepOutcome StepEngine::nonfinite_gradient(const std::vector<int>& flagged, std::vector<bool> active, int64_t step_idx,
                                           const std::vector<CheckOnly>& extra) const {
  StepOutcome out;
  out.status = StepOutcome::Status::kNonFiniteGradient;
  const int num_params = table_.num_params();
  for (int f : flagged) (f < num_params ? out.nonfinite_params : out.nonfinite_extra).push_back(f < num_params ? f : f - num_params);
  out.active = std::move(active);
  const int first = flagged.front();
  std::ostringstream message;
  message << "non-finite gradient (NaN or Inf) in parameter '"
          << (first < num_params ? table_.param(first).name : extra[static_cast<size_t>(first - num_params)].name)
          << "' at " << step_name(step_idx);
  if (flagged.size() > 1) message << " (and " << flagged.size() - 1 << " more)";
  message << "; nothing was updated";
  out.message = message.str();
  return out;
}

}  // namespace dmuon::step

// dmuon/step/engine.cpp — the pipelined step (the plan: engine_plan.cpp).
#include "step/engine.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <sstream>
#include <utility>

#include "common/check.h"
#include "ns/batch_streams.h"
#include "ns/ns_bound.h"
#include "step/route.h"

namespace dmuon::step {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

Buffer piece_view(const Buffer& local, const Piece& piece, int64_t cols) {
  return local.slice(piece.local_offset, piece.row_count * cols, "piece of a local tensor");
}

std::string step_name(int64_t step_idx) { return "step " + std::to_string(step_idx); }

}  // namespace

// What one step carries from phase to phase.
struct StepEngine::StepState {
  const std::vector<ParamTensors>* tensors = nullptr;
  const std::vector<GroupRule>* rules = nullptr;
  int64_t step_idx = 0;
  std::vector<bool> active;         // [item] its parameter has a gradient on every rank
  std::vector<int> partial_of;      // [item] index of its check() partials, −1 when none
  std::vector<bool> momentum_done;  // [item] prepare_pieces updated this rank's momentum rows
  Partials partials;
  OwnedBuffer gate;                 // one process only (empty view otherwise)
  OwnedBuffer result_flags;         // int32 [num_params]
};

// One exchange of a stage: its buffers, where each piece lies in them, its collective.
struct StepEngine::Flight {
  OwnedBuffer send, recv;
  std::unique_ptr<Pending> pending;
  std::map<std::pair<int, int>, int64_t> send_at;  // (item, destination) → offset in send
  std::map<std::pair<int, int>, int64_t> recv_at;  // (item, source) → offset in recv
  std::map<int, int64_t> self_at;                  // item → offset of this rank's own piece in send
};

StepEngine::StepEngine(Transport& transport, DeviceOps& ops, std::vector<ParamSpec> params, EngineOptions options)
    : transport_(transport),
      ops_(ops),
      table_(std::move(params), transport.world_size()),
      options_(std::move(options)),
      rank_(transport.rank()),
      world_(transport.world_size()) {
  options_.validate();
  DMUON_CHECK(rank_ >= 0 && rank_ < world_, "StepEngine: rank ", rank_, " outside a world of ", world_);
  wire_dtype_ = resolve_wire_dtype(options_.wire_dtype, ops_.device().kind);
  depth_ = options_.depth_for(world_);
  make_plan();
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
    const dist::RowBlock rows = table_.local_rows(p, rank_);
    DMUON_CHECK(spec.group >= 0 && static_cast<size_t>(spec.group) < rules.size(), "parameter '", spec.name,
                "': group index ", spec.group, " but ", rules.size(), " group rules");
    std::string why;
    DMUON_CHECK(ops_support(device.kind, spec.dtype, &why), "parameter '", spec.name, "': ", why);
    auto check = [&](const Buffer& b, const char* what) {
      DMUON_CHECK(b.dtype == spec.dtype && b.numel == numel && (numel == 0 || b.data != nullptr) &&
                      (numel == 0 || b.device == device),
                  "parameter '", spec.name, "' on rank ", rank_, ": its ", what, " holds ", b.numel, " elements of ",
                  dtype_name(b.dtype), " on ", device_name(b.device), ", but its layout gives this rank flat rows [",
                  rows.begin, ", ", rows.begin + rows.count, ") × ", spec.layout.cols(), " = ", numel,
                  " elements of ", dtype_name(spec.dtype), " on ", device_name(device));
    };
    check(t.param, "local parameter");
    if (t.has_grad) {
      check(t.grad, "gradient");
      check(t.momentum, "momentum buffer");
    }
  }
}

StepEngine::Flight StepEngine::issue_forward(size_t s, StepState& st) {
  const auto start = Clock::now();
  const Stage& stage = stages_[s];
  const std::vector<ParamTensors>& tensors = *st.tensors;
  StageTimeline& line = stats_.stages[s];
  Flight f;
  // Send layout: per destination, the batches it computes, the items it does not hold
  // whole, this rank's piece; then this rank's own pieces of the items it computes (read
  // in place by its iterate, never sent).
  std::vector<int64_t> send_counts(static_cast<size_t>(world_), 0), recv_counts(static_cast<size_t>(world_), 0);
  int64_t offset = 0;
  for (int d = 0; d < world_; ++d) {
    if (d == rank_) continue;
    const int64_t begin = offset;
    for (const NsBatch& batch : stage.batches) {
      if (!batch.computed_by(d)) continue;
      for (int item : batch.items) {
        const Piece& p = table_.piece(item, rank_);
        if (!st.active[static_cast<size_t>(item)] || p.empty() || table_.whole_on(item, d)) continue;
        f.send_at[{item, d}] = offset;
        offset += p.row_count * batch.cols;
      }
    }
    send_counts[static_cast<size_t>(d)] = offset - begin;
  }
  const int64_t to_others = offset;
  // Receive layout: per source, the batches this rank computes, the items it does not
  // hold whole, the source's piece. Whether anyone exchanges is decided from what every
  // rank knows alike (the all_to_all is collective).
  int64_t received = 0;
  bool exchange = false;
  for (const NsBatch& batch : stage.batches)
    for (int item : batch.items) {
      if (!st.active[static_cast<size_t>(item)]) continue;
      for (int c = 0; c < world_ && !exchange; ++c) exchange = batch.computed_by(c) && !table_.whole_on(item, c);
      if (batch.computed_by(rank_) && !table_.whole_on(item, rank_) && !table_.piece(item, rank_).empty()) {
        f.self_at[item] = offset;
        offset += table_.piece(item, rank_).row_count * batch.cols;
      }
    }
  for (int src = 0; src < world_; ++src) {
    if (src == rank_) continue;
    const int64_t begin = received;
    for (const NsBatch& batch : stage.batches) {
      if (!batch.computed_by(rank_)) continue;
      for (int item : batch.items) {
        const Piece& p = table_.piece(item, src);
        if (!st.active[static_cast<size_t>(item)] || table_.whole_on(item, rank_) || p.empty()) continue;
        f.recv_at[{item, src}] = received;
        received += p.row_count * batch.cols;
      }
    }
    recv_counts[static_cast<size_t>(src)] = received - begin;
  }
  f.send = ops_.allocate(wire_dtype_, offset);
  f.recv = ops_.allocate(wire_dtype_, received);
  stats_.pack_s += seconds_since(start);

  // Momentum of every piece of this rank in the stage; U into its first wire region (the
  // others, in gather mode, are copies). Whole items this rank computes wait for the iterate.
  const auto prepare_start = Clock::now();
  std::vector<PreparePiece> prepare;
  std::vector<std::pair<Buffer, Buffer>> copies;
  for (const NsBatch& batch : stage.batches)
    for (int item : batch.items) {
      const Piece& p = table_.piece(item, rank_);
      if (!st.active[static_cast<size_t>(item)] || p.empty()) continue;
      std::vector<Buffer> targets;
      for (int d = 0; d < world_; ++d) {
        auto at = f.send_at.find({item, d});
        if (at != f.send_at.end()) targets.push_back(f.send.get().slice(at->second, p.row_count * batch.cols));
      }
      auto self = f.self_at.find(item);
      if (self != f.self_at.end()) targets.push_back(f.send.get().slice(self->second, p.row_count * batch.cols));
      if (targets.empty() && computes(item, rank_)) continue;
      const Item& it = table_.item(item);
      const ParamTensors& t = tensors[static_cast<size_t>(it.param_idx)];
      const GroupRule& rule = (*st.rules)[static_cast<size_t>(it.group)];
      prepare.push_back({piece_view(t.grad, p, it.cols), piece_view(t.momentum, p, it.cols),
                         {rule.momentum, rule.nesterov}, targets.empty() ? Buffer{} : targets.front()});
      for (size_t k = 1; k < targets.size(); ++k) copies.emplace_back(targets.front(), targets[k]);
      st.momentum_done[static_cast<size_t>(item)] = true;
    }
  if (!prepare.empty()) ops_.prepare_pieces(prepare, st.gate.get());
  for (const auto& [from, to] : copies) ops_.copy(from, to);
  if (options_.profile) ops_.synchronize();
  const double prepare_s = seconds_since(prepare_start);
  stats_.momentum_s += prepare_s;
  line.prepare_s += prepare_s;

  issue_exchange(f, f.send.get().slice(0, to_others), send_counts, recv_counts, exchange,
                 "all_to_all of stage " + std::to_string(s) + "'s pieces to their owners (" + step_name(st.step_idx) +
                     ")",
                 line.forward_sent_to, line.forward_received_from);
  return f;
}

void StepEngine::issue_exchange(Flight& f, const Buffer& send, const std::vector<int64_t>& send_counts,
                                const std::vector<int64_t>& recv_counts, bool collective, const std::string& what,
                                std::vector<int64_t>& sent_to, std::vector<int64_t>& received_from) {
  const auto start = Clock::now();
  // NOTE: a transport that moves nothing leaves the receive buffer as it was; zeros keep
  // the owner's NS on defined data.
  if (!transport_.moves_data()) ops_.fill_zero(f.recv.get());
  if (collective) f.pending = transport_.all_to_all(send, send_counts, f.recv.get(), recv_counts, what);
  const int64_t wire_size = dtype_size(wire_dtype_);
  for (int r = 0; r < world_; ++r) {
    sent_to[static_cast<size_t>(r)] = send_counts[static_cast<size_t>(r)] * wire_size;
    received_from[static_cast<size_t>(r)] = recv_counts[static_cast<size_t>(r)] * wire_size;
    stats_.bytes_sent += sent_to[static_cast<size_t>(r)];
    stats_.bytes_received += received_from[static_cast<size_t>(r)];
  }
  stats_.pack_s += seconds_since(start);
}

std::vector<int> StepEngine::stream_assignment(const std::vector<const NsBatch*>& batches,
                                               const std::vector<GroupRule>& rules) {
  std::vector<int> zeros(batches.size(), 0);
  if (options_.num_streams <= 1 || batches.size() <= 1) return zeros;
  // NOTE: the floor at nominal H200 rates: only the costs' ratios matter here.
  constexpr double kFlopsPerSecond = 775e12, kBytesPerSecond = 4.0e12;
  std::map<std::tuple<int, int, int64_t, int64_t>, int64_t> key_of;
  std::vector<ns::StreamJob> jobs;
  for (const NsBatch* b : batches) {
    const auto key = key_of.emplace(std::make_tuple(b->group, static_cast<int>(b->dtype), b->rows, b->cols),
                                    static_cast<int64_t>(key_of.size()))
                         .first->second;
    const std::vector<std::pair<int64_t, int64_t>> shapes(b->items.size(), {b->rows, b->cols});
    const ns::StepBound bound = ns::fused_step_bound(shapes, rules[static_cast<size_t>(b->group)].schedule,
                                                     kFlopsPerSecond, kBytesPerSecond);
    jobs.push_back({key, bound.seconds()});
  }
  return ns::assign_streams(jobs, options_.num_streams);
}

StepEngine::Flight StepEngine::run_stage(size_t s, StepState& st, Flight& forward) {
  const Stage& stage = stages_[s];
  const std::vector<ParamTensors>& tensors = *st.tensors;
  const std::vector<GroupRule>& rules = *st.rules;
  StageTimeline& line = stats_.stages[s];
  const bool owner_mode = options_.mode == Mode::kOwner;

  auto start = Clock::now();
  if (forward.pending) forward.pending->wait();
  double waited = seconds_since(start);
  stats_.comm_wait_s += waited;
  line.forward_wait_s += waited;

  start = Clock::now();
  // This rank's NS batches of the stage, restricted to the items with gradients.
  std::vector<NsBatch> mine;
  for (const NsBatch& batch : stage.batches) {
    if (!batch.computed_by(rank_)) continue;
    NsBatch active = batch;
    active.items.clear();
    for (int item : batch.items)
      if (st.active[static_cast<size_t>(item)]) active.items.push_back(item);
    if (!active.items.empty()) mine.push_back(std::move(active));
  }

  // Return layouts (owner mode): per destination, this rank's batches, the destination's
  // piece; per source, the source's batches, this rank's piece.
  Flight back;
  std::vector<int64_t> send_counts(static_cast<size_t>(world_), 0), recv_counts(static_cast<size_t>(world_), 0);
  bool exchange_back = false;
  int64_t sent = 0, received = 0;
  if (owner_mode) {
    for (int d = 0; d < world_; ++d) {
      if (d == rank_) continue;
      const int64_t begin = sent;
      for (const NsBatch& batch : mine)
        for (int item : batch.items) {
          const Piece& p = table_.piece(item, d);
          if (p.empty()) continue;
          back.send_at[{item, d}] = sent;
          sent += p.row_count * batch.cols;
        }
      send_counts[static_cast<size_t>(d)] = sent - begin;
    }
    for (int src = 0; src < world_; ++src) {
      if (src == rank_) continue;
      const int64_t begin = received;
      for (const NsBatch& batch : stage.batches) {
        if (batch.owner != src) continue;
        for (int item : batch.items) {
          const Piece& p = table_.piece(item, rank_);
          if (!st.active[static_cast<size_t>(item)] || p.empty()) continue;
          back.recv_at[{item, src}] = received;
          received += p.row_count * batch.cols;
        }
      }
      recv_counts[static_cast<size_t>(src)] = received - begin;
    }
    for (const NsBatch& batch : stage.batches)
      for (int item : batch.items) {
        if (!st.active[static_cast<size_t>(item)]) continue;
        for (int d = 0; d < world_ && !exchange_back; ++d)
          exchange_back = d != batch.owner && !table_.piece(item, d).empty();
      }
    back.send = ops_.allocate(wire_dtype_, sent);
    back.recv = ops_.allocate(wire_dtype_, received);
  }

  // The NS batches, on the streams the assignment gives them.
  std::vector<const NsBatch*> order;
  for (const NsBatch& batch : mine) order.push_back(&batch);
  bool warm = true;
  for (const NsBatch* b : order)
    warm = warm && warm_batches_.count({b->group, static_cast<int>(b->dtype), b->rows, b->cols,
                                        static_cast<int64_t>(b->items.size())}) > 0;
  const std::vector<int> stream_of = warm ? stream_assignment(order, rules) : std::vector<int>(order.size(), 0);
  const Buffer gate = st.gate.get();
  const Buffer flags = st.result_flags.get();
  const int num_streams = ops_.run_on_streams(stream_of, [&](size_t k) {
    const NsBatch& batch = *order[k];
    const GroupRule& rule = rules[static_cast<size_t>(batch.group)];
    const NsBatchDesc desc{batch.rows, batch.cols, static_cast<int64_t>(batch.items.size()), batch.dtype,
                           &rule.schedule, options_.graphs};
    const double scale = rule.update_scale(batch.rows, batch.cols), decay = rule.decay();
    std::vector<LocalMatrix> local_update, local_read;
    std::vector<WirePiece> pieces, returns;
    std::vector<ApplyPiece> own;
    for (size_t j = 0; j < batch.items.size(); ++j) {
      const int item = batch.items[j];
      const Item& it = table_.item(item);
      const ParamTensors& t = tensors[static_cast<size_t>(it.param_idx)];
      const Piece& me = table_.piece(item, rank_);
      const int64_t idx = static_cast<int64_t>(j);
      if (table_.whole_on(item, rank_)) {
        LocalMatrix m{piece_view(t.grad, me, it.cols), piece_view(t.momentum, me, it.cols),
                      {rule.momentum, rule.nesterov}, st.partial_of[static_cast<size_t>(item)], idx};
        (st.momentum_done[static_cast<size_t>(item)] ? local_read : local_update).push_back(m);
      } else {
        for (int src = 0; src < world_; ++src) {
          const Piece& p = table_.piece(item, src);
          if (p.empty()) continue;
          const int64_t numel = p.row_count * it.cols;
          const Buffer wire = src == rank_ ? forward.send.get().slice(forward.self_at.at(item), numel)
                                           : forward.recv.get().slice(forward.recv_at.at({item, src}), numel);
          pieces.push_back({wire, idx, p.row_begin, p.row_count});
        }
      }
      if (owner_mode)
        for (int d = 0; d < world_; ++d) {
          const Piece& p = table_.piece(item, d);
          if (d == rank_ || p.empty()) continue;
          returns.push_back({back.send.get().slice(back.send_at.at({item, d}), p.row_count * it.cols), idx, p.row_begin,
                             p.row_count});
        }
      if (!me.empty()) {
        ApplyPiece a{piece_view(t.param, me, it.cols), Buffer{}, idx, me.row_begin, me.row_count, scale, decay,
                     it.param_idx};
        // NOTE: replicas apply what the wire brings them; so does the owner, bit for bit.
        a.round_through_wire = owner_mode && !table_.param(it.param_idx).layout.sharded && world_ > 1;
        a.wire_dtype = wire_dtype_;
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
        [&](const NsView& result) {
          if (!returns.empty()) ops_.result_to_pieces(result, desc, returns);
          if (!own.empty()) ops_.apply_result(result, desc, own, gate, flags);
        });
    for (int item : batch.items) st.momentum_done[static_cast<size_t>(item)] = true;
  });
  for (const NsBatch* b : order) {
    warm_batches_.insert({b->group, static_cast<int>(b->dtype), b->rows, b->cols, static_cast<int64_t>(b->items.size())});
    stats_.ns_batches.emplace_back(static_cast<int64_t>(b->items.size()), b->rows, b->cols);
    stats_.num_orthogonalized += static_cast<int64_t>(b->items.size());
    line.num_items += static_cast<int64_t>(b->items.size());
  }
  stats_.num_ns_batches += static_cast<int64_t>(order.size());
  line.num_batches = static_cast<int64_t>(order.size());
  if (!order.empty()) stats_.num_streams = std::max<int64_t>(stats_.num_streams, num_streams);
  forward = Flight{};  // NOTE: the stage's forward buffers are read; free them before the next stage's
  if (options_.profile) ops_.synchronize();
  const double ns_s = seconds_since(start);
  stats_.ns_s += ns_s;
  line.ns_s += ns_s;

  issue_exchange(back, back.send.get(), send_counts, recv_counts, exchange_back,
                 "all_to_all of stage " + std::to_string(s) + "'s results back from their owners (" +
                     step_name(st.step_idx) + ")",
                 line.return_sent_to, line.return_received_from);
  return back;
}

void StepEngine::land(size_t s, StepState& st, Flight& back) {
  const Stage& stage = stages_[s];
  StageTimeline& line = stats_.stages[s];
  auto start = Clock::now();
  if (back.pending) back.pending->wait();
  const double waited = seconds_since(start);
  stats_.comm_wait_s += waited;
  line.return_wait_s += waited;

  start = Clock::now();
  std::vector<ApplyPiece> apply;
  for (const NsBatch& batch : stage.batches) {
    if (batch.owner == kEveryRank || batch.owner == rank_) continue;
    const GroupRule& rule = (*st.rules)[static_cast<size_t>(batch.group)];
    const double scale = rule.update_scale(batch.rows, batch.cols), decay = rule.decay();
    for (int item : batch.items) {
      const Piece& p = table_.piece(item, rank_);
      if (!st.active[static_cast<size_t>(item)] || p.empty()) continue;
      const Item& it = table_.item(item);
      const int64_t numel = p.row_count * it.cols;
      apply.push_back({piece_view((*st.tensors)[static_cast<size_t>(it.param_idx)].param, p, it.cols),
                       back.recv.get().slice(back.recv_at.at({item, batch.owner}), numel), 0, p.row_begin,
                       p.row_count, scale, decay, it.param_idx});
    }
  }
  if (!apply.empty()) ops_.apply_pieces(apply, st.gate.get(), st.result_flags.get());
  back = Flight{};
  if (options_.profile) ops_.synchronize();
  const double apply_s = seconds_since(start);
  stats_.apply_s += apply_s;
  line.apply_s += apply_s;
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

StepOutcome StepEngine::step(const std::vector<ParamTensors>& tensors, const std::vector<GroupRule>& rules,
                             int64_t step_idx, const std::vector<CheckOnly>& extra) {
  const auto step_start = Clock::now();
  stats_ = StepStats{};
  stats_.pipeline_depth = depth_;
  const int num_params = table_.num_params();
  const int num_checked = num_params + static_cast<int>(extra.size());  // flag slots: parameters, then extra
  const std::string at_step = " at " + step_name(step_idx);

  // Input checks. NOTE: with several ranks, one rank's bad input is agreed like a flag,
  // so that the others raise too instead of waiting in a collective it never joins.
  std::string invalid;
  try {
    validate(tensors, rules, extra);
    make_stages_for(rules);
  } catch (const std::exception& e) {
    if (world_ == 1) throw;
    invalid = e.what();
  }

  StepState st;
  st.tensors = &tensors;
  st.rules = &rules;
  st.step_idx = step_idx;
  st.active.assign(static_cast<size_t>(table_.num_items()), false);
  st.partial_of.assign(static_cast<size_t>(table_.num_items()), -1);
  st.momentum_done.assign(static_cast<size_t>(table_.num_items()), false);

  // Check: NaN/Inf flags of every local gradient and momentum buffer (reads only).
  auto start = Clock::now();
  OwnedBuffer flags = ops_.allocate(DType::kInt32, std::max(1, 2 * num_checked));
  ops_.fill_zero(flags.get());
  if (invalid.empty()) {
    std::vector<CheckPiece> pieces;
    for (int p = 0; p < num_params; ++p) {
      const ParamTensors& t = tensors[static_cast<size_t>(p)];
      if (!t.has_grad) continue;
      const GroupRule& rule = rules[static_cast<size_t>(table_.param(p).group)];
      const auto [first, count] = table_.items_of(p);
      for (int item = first; item < first + count; ++item) {
        const Piece& piece = table_.piece(item, rank_);
        if (piece.empty()) continue;
        const bool sum = computes(item, rank_) && table_.whole_on(item, rank_);
        if (sum) st.partial_of[static_cast<size_t>(item)] = static_cast<int>(pieces.size());
        const int64_t cols = table_.item(item).cols;
        pieces.push_back({piece_view(t.grad, piece, cols), piece_view(t.momentum, piece, cols),
                          {rule.momentum, rule.nesterov}, p, sum});
      }
    }
    // NOTE: a checked-only gradient stands in for its own momentum (bit 1 is ignored).
    for (size_t k = 0; k < extra.size(); ++k)
      if (extra[k].grad.numel > 0)
        pieces.push_back({extra[k].grad, extra[k].grad, {}, num_params + static_cast<int>(k), false});
    // partial_of holds positions among all pieces; make them indices among the summed ones.
    int next = 0;
    std::vector<int> summed_index(pieces.size(), -1);
    for (size_t k = 0; k < pieces.size(); ++k)
      if (pieces[k].sum_update) summed_index[k] = next++;
    for (int& idx : st.partial_of)
      if (idx >= 0) idx = summed_index[static_cast<size_t>(idx)];
    if (!pieces.empty()) st.partials = ops_.check(pieces, flags.get());
  }

  // Agreement. Several ranks: on the host, before any exchange. One rank: a device-side
  // gate (non-zero when any flag is) that every writing pass honours; read at the end.
  auto name = [&](int p) { return "'" + table_.param(p).name + "'"; };
  std::vector<bool> active(static_cast<size_t>(num_params), false);
  if (world_ > 1) {
    std::vector<int32_t> host(static_cast<size_t>(2 * num_checked), 0);
    if (invalid.empty() && num_checked > 0) host = ops_.read_flags({flags.get()});
    std::vector<int64_t> local;
    for (int p = 0; p < num_params; ++p) local.push_back(tensors.size() > static_cast<size_t>(p) && tensors[static_cast<size_t>(p)].has_grad ? 1 : 0);
    for (int p = 0; p < num_params; ++p) local.push_back(host[static_cast<size_t>(2 * p)] != 0 ? 1 : 0);
    for (int p = 0; p < num_params; ++p) local.push_back(host[static_cast<size_t>(2 * p + 1)] != 0 ? 1 : 0);
    for (int k = num_params; k < num_checked; ++k) local.push_back(host[static_cast<size_t>(2 * k)] != 0 ? 1 : 0);
    local.push_back(invalid.empty() ? 0 : 1);
    const std::vector<int64_t> agreed =
        transport_.all_reduce(local, ReduceOp::kSum, "all_reduce of the gradient checks (" + step_name(step_idx) + ")");
    DMUON_CHECK(invalid.empty(), invalid);
    DMUON_CHECK(agreed.back() == 0, "dmuon ", step_name(step_idx),
                ": the input of another rank is invalid (its error names it); nothing was updated");
    for (int p = 0; p < num_params; ++p) {
      const int64_t count = agreed[static_cast<size_t>(p)];
      DMUON_CHECK(count == 0 || count == world_, "parameter ", name(p), " has a gradient on ", count, " of ", world_,
                  " ranks", at_step, "; every rank must have it or none");
      active[static_cast<size_t>(p)] = count == world_;
    }
    for (int p = 0; p < num_params; ++p)
      DMUON_CHECK(agreed[static_cast<size_t>(2 * num_params + p)] == 0, "the momentum buffer of parameter ", name(p),
                  " holds NaN or Inf", at_step, " (corrupt optimizer state); nothing was updated");
    std::vector<int> bad;
    for (int p = 0; p < num_params; ++p)
      if (agreed[static_cast<size_t>(num_params + p)] != 0) bad.push_back(p);
    for (int k = num_params; k < num_checked; ++k)
      if (agreed[static_cast<size_t>(2 * num_params + k)] != 0) bad.push_back(k);
    if (!bad.empty()) {
      stats_.check_s = seconds_since(start);
      stats_.total_s = seconds_since(step_start);
      return nonfinite_gradient(bad, active, step_idx, extra);
    }
  } else {
    for (int p = 0; p < num_params; ++p) active[static_cast<size_t>(p)] = tensors[static_cast<size_t>(p)].has_grad;
    st.gate = ops_.make_gate(flags.get());
  }
  for (int i = 0; i < table_.num_items(); ++i)
    st.active[static_cast<size_t>(i)] = active[static_cast<size_t>(table_.item(i).param_idx)];
  st.result_flags = ops_.allocate(DType::kInt32, std::max(1, num_params));
  ops_.fill_zero(st.result_flags.get());
  stats_.check_s = seconds_since(start);

  // The pipeline: the forwards of the next `depth` stages in flight during stage k's NS,
  // and the returns of the `depth` stages before it; a stage is applied once its return
  // has had `depth` stages' time to arrive.
  // NOTE: why `depth` both ways (csrc/torch/dist_runtime.cpp, measured there): on GPUs
  // every wait for a collective is a wait of the compute stream, and a collective
  // completes only when every rank reached it; with less slack each owner's NS chains to
  // another owner's (world 4, Qwen2.5-7B: a 327 ms step against 153 ms of NS on the
  // slowest rank). The price is `depth` stages of buffers each way.
  const size_t num_stages = stages_.size();
  stats_.num_stages = static_cast<int64_t>(num_stages);
  stats_.stages.resize(num_stages);
  for (size_t s = 0; s < num_stages; ++s) {
    StageTimeline& line = stats_.stages[s];
    line.stage_idx = static_cast<int64_t>(s);
    for (auto* v : {&line.forward_sent_to, &line.forward_received_from, &line.return_sent_to,
                    &line.return_received_from})
      v->assign(static_cast<size_t>(world_), 0);
  }
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

  // The end: one host read of the flags; several ranks agree on the first bad result.
  StepOutcome outcome;
  outcome.active = active;
  int first_bad = -1;
  if (world_ == 1) {
    const std::vector<int32_t> host = ops_.read_flags({flags.get(), st.result_flags.get()});
    for (int p = 0; p < num_params; ++p)
      DMUON_CHECK(host[static_cast<size_t>(2 * p + 1)] == 0, "the momentum buffer of parameter ", name(p),
                  " holds NaN or Inf", at_step, " (corrupt optimizer state); nothing was updated");
    std::vector<int> bad;
    for (int k = 0; k < num_checked; ++k)
      if (host[static_cast<size_t>(2 * k)] != 0) bad.push_back(k);
    if (!bad.empty()) {
      // NOTE: the gate was closed: nothing was written, whatever ran.
      stats_.total_s = seconds_since(step_start);
      return nonfinite_gradient(bad, active, step_idx, extra);
    }
    for (int p = 0; p < num_params && first_bad < 0; ++p)
      if (host[static_cast<size_t>(2 * num_checked + p)] != 0) first_bad = p;
  } else {
    const std::vector<int32_t> host = ops_.read_flags({st.result_flags.get()});
    int local_bad = -1;
    for (int p = 0; p < num_params && local_bad < 0; ++p)
      if (host[static_cast<size_t>(p)] != 0) local_bad = p;
    // NOTE: max over ranks of (num_params − first bad index) finds the smallest bad index.
    const int64_t encoded = local_bad < 0 ? 0 : num_params - local_bad;
    const int64_t agreed = transport_.all_reduce({encoded}, ReduceOp::kMax,
                                                 "all_reduce of the result flags (" + step_name(step_idx) + ")")[0];
    if (agreed != 0) first_bad = static_cast<int>(num_params - agreed);
  }
  stats_.total_s = seconds_since(step_start);
  DMUON_CHECK(first_bad < 0, "dmuon ", step_name(step_idx), ": the orthogonalized update of parameter ", name(first_bad),
              " is not finite; its non-finite entries were not applied (the rest of the step was)");
  return outcome;
}

}  // namespace dmuon::step

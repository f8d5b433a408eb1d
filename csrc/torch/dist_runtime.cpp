// dmuon/torch/dist_runtime.cpp — plan, buckets and the pipelined owner-centric step.
#include "dist_runtime.h"

#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <tuple>

#include "common/check.h"
#include "common/env.h"
#include "flag_reduce.h"
#include "foreach_ops.h"
#include "orthogonalize.h"
#include "owner_planning.h"
#include "phase_recorder.h"
#include "plan/hash.h"
#include "world_detect.h"


namespace dmuon::torch_adapter {
namespace {

using Clock = std::chrono::steady_clock;

// Buckets of pipeline slack (options.pipeline_depth, else DMUON_PIPELINE_DEPTH; 0: twice
// the world size, so that every owner has work queued): forwards issued that far ahead,
// returns applied that far behind.
size_t resolve_pipeline_depth(const std::optional<int64_t>& requested, int world_size) {
  const int64_t depth = env::resolve(requested, env::kPipelineDepth);
  DMUON_CHECK(depth >= 0, requested ? "pipeline_depth" : "DMUON_PIPELINE_DEPTH",
              " must be >= 0 (0: twice the world size), got ", depth);
  return static_cast<size_t>(depth > 0 ? depth : std::max(1, 2 * world_size));
}

// Bytes of one fused NS batch's workspace (options.ns_batch_mb, else DMUON_NS_BATCH_MB).
int64_t resolve_ns_batch_bytes(const std::optional<int64_t>& requested) {
  const int64_t mb = env::resolve(requested, env::kNsBatchMb);
  DMUON_CHECK(mb >= 1, requested ? "ns_batch_mb" : "DMUON_NS_BATCH_MB", " must be at least 1, got ", mb);
  return mb << 20;
}

// NOTE: any fixed seed: the fake world's synthetic updates only need to be full-rank data.
constexpr uint64_t kSyntheticSeed = 0x5eed;

// The end-of-step error when an orthogonalized update is not finite.
std::string nonfinite_result_message(int64_t step_idx, int64_t param, const std::string& name) {
  std::ostringstream message;
  message << "dmuon step " << step_idx << ": the orthogonalized update of the batch of parameter " << param << " ("
          << name << ") is not finite; its non-finite entries were not applied (the rest of the step was)";
  return message.str();
}

// Each param group's NS schedule, in group order.
std::vector<ns::Schedule> schedules_of(const std::vector<MuonGroupOptions>& groups) {
  std::vector<ns::Schedule> schedules;
  for (const auto& g : groups) schedules.push_back(g.schedule);
  return schedules;
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

at::ScalarType parse_wire_dtype(const std::string& name, const std::string& device_type) {
  if (name == "auto") return device_type == "cuda" ? at::kBFloat16 : at::kFloat;
  if (name == "float32") return at::kFloat;
  if (name == "bfloat16") return at::kBFloat16;
  if (name == "float16") return at::kHalf;
  DMUON_FAIL("wire_dtype must be auto, float32, bfloat16 or float16, got '", name, "'");
}

// One all_to_all in flight: its buffers, split sizes and completion handle.
struct InFlight {
  at::Tensor send;                     // [Σ input splits] wire dtype
  at::Tensor recv;                     // [Σ output splits] wire dtype
  std::vector<int64_t> recv_offsets;   // [world + 1] element offsets of each source
  std::vector<int64_t> send_offsets;   // [world + 1] element offsets of each destination
  c10::intrusive_ptr<c10d::Work> work; // null when nothing was exchanged
};

// One compute phase of a bucket on the phase recorder, for the scope's duration.
class ScopedPhase {
 public:
  ScopedPhase(PhaseRecorder& recorder, size_t bucket, sim::Phase phase) : recorder_(recorder) {
    recorder_.begin(bucket, phase);
  }
  ~ScopedPhase() { recorder_.end(); }
  ScopedPhase(const ScopedPhase&) = delete;
  ScopedPhase& operator=(const ScopedPhase&) = delete;

 private:
  PhaseRecorder& recorder_;
};

// Concatenate flattened pieces (or an empty buffer) in the wire dtype.
at::Tensor pack(const std::vector<at::Tensor>& pieces, at::ScalarType dtype, const at::Device& device) {
  std::vector<at::Tensor> flat;
  for (const at::Tensor& piece : pieces)
    if (piece.numel() > 0) flat.push_back(piece.reshape({-1}).to(dtype));
  if (flat.empty()) return at::empty({0}, at::TensorOptions().dtype(dtype).device(device));
  return at::cat(flat, 0);
}

// Consecutive matrices of equal rows of one parameter, as one view [count, rows, cols]: a
// stack or one matrix is one run; row blocks of different rows are several.
struct MatrixRun {
  int64_t row_begin = 0;    // first flat row
  int64_t num_rows = 0;     // flat rows of the run
  int64_t matrix_rows = 0;  // rows of each of its matrices
};
std::vector<MatrixRun> matrix_runs(const dist::ParamLayout& layout) {
  std::vector<MatrixRun> runs;
  for (const dist::RowBlock& block : layout.matrix_blocks()) {
    if (!runs.empty() && runs.back().matrix_rows == block.count)
      runs.back().num_rows += block.count;
    else
      runs.push_back({block.begin, block.count, block.count});
  }
  return runs;
}

std::vector<int64_t> offsets_of(const std::vector<int64_t>& splits) {
  std::vector<int64_t> offsets(splits.size() + 1, 0);
  for (size_t i = 0; i < splits.size(); ++i) offsets[i + 1] = offsets[i] + splits[i];
  return offsets;
}

}  // namespace

MuonRuntime::MuonRuntime(const std::string& group_name, std::vector<std::string> names,
                         std::vector<dist::ParamLayout> layouts, RuntimeOptions options)
    : names_(std::move(names)), layouts_(std::move(layouts)), options_(std::move(options)) {
  DMUON_CHECK(names_.size() == layouts_.size(), "MuonRuntime: ", names_.size(), " names for ",
              layouts_.size(), " layouts");
  DMUON_CHECK(options_.mode == "owner" || options_.mode == "gather",
              "mode must be 'owner' or 'gather', got '", options_.mode, "'");
  DMUON_CHECK(options_.device_type == "cpu" || options_.device_type == "cuda",
              "device_type must be 'cpu' or 'cuda', got '", options_.device_type, "'");
  DMUON_CHECK(options_.fused_streams >= 0 && options_.fused_streams <= 8,
              "fused_streams must be between 1 and 8 (0: DMUON_FUSED_STREAMS), got ", options_.fused_streams);
  for (size_t i = 0; i < layouts_.size(); ++i) layouts_[i].validate(names_[i].c_str());
  // NOTE: read per runtime (not once per process) so that one process can compare both.
  ns_batch_bytes_ = resolve_ns_batch_bytes(options_.ns_batch_mb);
  cuda_graphs_ = env::resolve(options_.cuda_graphs, env::kCudaGraphs);
  if (!group_name.empty()) group_ = c10d::resolve_process_group(group_name);
  // NOTE: detected once: a fake group is played by the model from here on (world_model.h).
  model_ = detect_world_model(group_, options_.device_type);
  rank_ = model_.rank();
  world_size_ = model_.world_size();
  wire_dtype_ = parse_wire_dtype(options_.wire_dtype, options_.device_type);
  // NOTE: DMUON_PROFILE=1 synchronizes the device between phases so that the step's
  // time split is real on GPUs (it costs the overlap it measures).
  options_.profile = options_.profile || env::kProfile.get();
  depth_ = resolve_pipeline_depth(options_.pipeline_depth, world_size_);
  for (const auto& layout : layouts_) rows_.push_back(layout.rank_rows(world_size_));
  make_plan();
}

// Owners and buckets: rank 0 plans and every other rank receives the plan's text, or every
// rank plans alone (a fake world); real ranks then agree on a hash of the whole layout.
void MuonRuntime::make_plan() {
  const int64_t wire_size = at::elementSize(wire_dtype_);
  std::vector<int64_t> wire_bytes;
  for (const auto& layout : layouts_) wire_bytes.push_back(layout.numel() * wire_size);
  const size_t num_params = layouts_.size();
  DMUON_CHECK(options_.plan_source == "auto" || options_.plan_source == "broadcast" ||
                  options_.plan_source == "local",
              "plan_source must be 'auto', 'broadcast' or 'local', got '", options_.plan_source, "'");
  DMUON_CHECK(!(model_.is_fake() && options_.plan_source == "broadcast"),
              "plan_source 'broadcast' needs a process group that moves data; rank ", rank_, " of a fake world of ",
              world_size_, " can only plan locally ('auto' or 'local')");
  const PlanSource source = options_.plan_source == "local" || (options_.plan_source == "auto" && model_.is_fake())
                                ? PlanSource::kLocal
                                : PlanSource::kBroadcast;

  if (num_params == 0) {
    // Nothing to plan (e.g. every Muon matrix is owned by the weight-ownership runtime).
    order_by_rank_.assign(static_cast<size_t>(world_size_), {});
  } else if (options_.mode == "gather") {
    // Everyone computes everything; buckets follow parameter order.
    owners_.assign(num_params, -1);
    order_by_rank_.assign(1, {});
    for (size_t i = 0; i < num_params; ++i) order_by_rank_[0].push_back(static_cast<int>(i));
  } else {
    OwnerPlanInput input{names_, layouts_, wire_bytes, world_size_, options_.solver,
                         options_.device_type, options_.cost_entries};
    const OwnerPlan planned = plan_owners(input, group_, rank_, collective_device(options_.device_type), {}, source,
                                          /*agree_on_problem=*/model_.moves_data());
    plan_text_ = planned.text;
    predicted_makespan_s_ = planned.plan.makespan;
    owners_ = planned.plan.owner;
    predicted_rank_s_.clear();
    for (const auto& rank_plan : planned.plan.ranks) predicted_rank_s_.push_back(rank_plan.compute_seconds);
    order_by_rank_.assign(static_cast<size_t>(world_size_), {});
    for (int r = 0; r < world_size_; ++r)
      for (const auto& batch : planned.plan.ranks[static_cast<size_t>(r)].batches)
        for (int idx : batch.matrix_idx) order_by_rank_[static_cast<size_t>(r)].push_back(idx);
  }
  buckets_ = dist::make_buckets(order_by_rank_, wire_bytes, options_.bucket_bytes);
  // NOTE: every rank derived its buckets (and, planning locally, its owners) itself; a rank
  // that decided otherwise would exchange mismatched buffers: agree before the first step.
  if (model_.moves_data())
    agree_on_hash(group_, rank_, layout_hash(), collective_device(options_.device_type),
                  "MuonRuntime: the step's owners and buckets");
}

// Everything a step's exchange depends on: mode, wire, layouts, owners, order, buckets.
uint64_t MuonRuntime::layout_hash() const {
  plan::Hasher hasher;
  hasher.str(options_.mode);
  hasher.i64(at::elementSize(wire_dtype_));
  hasher.i64(static_cast<int64_t>(layouts_.size()));
  for (const auto& layout : layouts_) {
    for (int64_t d : layout.global_shape) hasher.i64(d);
    hasher.i64(layout.batch_dims * 2 + (layout.sharded ? 1 : 0));
  }
  for (int owner : owners_) hasher.i64(owner);
  for (const auto& order : order_by_rank_) {
    hasher.i64(static_cast<int64_t>(order.size()));
    for (int idx : order) hasher.i64(idx);
  }
  for (const auto& bucket : buckets_) {
    hasher.i64(static_cast<int64_t>(bucket.param_idx.size()));
    for (int idx : bucket.param_idx) hasher.i64(idx);
  }
  return hasher.digest();
}

sim::StepLayout MuonRuntime::step_layout() const {
  sim::StepLayout layout;
  layout.gather = options_.mode == "gather";
  layout.world_size = world_size_;
  layout.layouts = layouts_;
  layout.owners = owners_;
  layout.buckets = buckets_;
  layout.wire_element_size = static_cast<int64_t>(at::elementSize(wire_dtype_));
  return layout;
}

void MuonRuntime::fill_modelled_receive(const at::Tensor& recv, const std::vector<int64_t>& recv_offsets,
                                        const at::Tensor& send, const std::vector<int64_t>& send_offsets,
                                        dist::ExchangeKind kind) {
  const dist::ReceivedData data = model_.received_data(kind);
  if (data == dist::ReceivedData::kDelivered || !recv.defined() || recv.numel() == 0) return;
  if (data == dist::ReceivedData::kSynthetic && !fill_generator_) {
    // NOTE: a private copy of the device's default generator, seeded, so that the fills do
    // not move the caller's random stream and every rank draws the same.
    fill_generator_ = at::globalContext().defaultGenerator(recv.device()).clone();
    std::lock_guard<std::mutex> lock(fill_generator_->mutex());
    fill_generator_->set_current_seed(kSyntheticSeed);
  }
  for (int src = 0; src < world_size_; ++src) {
    const int64_t begin = recv_offsets[static_cast<size_t>(src)];
    const int64_t count = recv_offsets[static_cast<size_t>(src) + 1] - begin;
    if (count == 0) continue;
    at::Tensor piece = recv.narrow(0, begin, count);
    if (src == rank_) {
      // What the real all_to_all copies locally: this rank's piece for itself.
      DMUON_CHECK(send_offsets[static_cast<size_t>(src) + 1] - send_offsets[static_cast<size_t>(src)] == count,
                  "internal: this rank's own piece differs in size between send and receive");
      piece.copy_(send.narrow(0, send_offsets[static_cast<size_t>(src)], count));
    } else if (data == dist::ReceivedData::kSynthetic) {
      piece.normal_(0.0, 1.0, *fill_generator_);  // NOTE: normal_ locks the generator itself
    } else {
      piece.zero_();
    }
  }
}

c10::intrusive_ptr<c10d::Work> MuonRuntime::all_to_all(at::Tensor& output, at::Tensor& input,
                                                       std::vector<int64_t> output_splits,
                                                       std::vector<int64_t> input_splits) {
  return group_->alltoall_base(output, input, output_splits, input_splits);
}

at::Tensor MuonRuntime::wait_and_check(const c10::intrusive_ptr<c10d::Work>& work,
                                       const at::Tensor& output, const std::string& what) {
  if (!work) return output;
  try {
    work->wait();
  } catch (const std::exception& error) {
    DMUON_FAIL("dmuon step ", step_idx_, ": ", what, " failed on rank ", rank_, " of ",
               world_size_, ": ", error.what());
  }
  return output;
}

void MuonRuntime::sync_for_profile() const {
  if (options_.profile && options_.device_type == "cuda") {
    const auto* impl = c10::impl::getDeviceGuardImpl(at::kCUDA);
    impl->synchronizeDevice(impl->getDevice().index());
  }
}

std::vector<int64_t> MuonRuntime::all_reduce_flags(const std::vector<int64_t>& local,
                                                   const std::string& op, const std::string& what,
                                                   int64_t step_idx) {
  step_idx_ = step_idx;
  return torch_adapter::all_reduce_flags({{group_, what, model_.transport()}}, local, op,
                                         collective_device(options_.device_type),
                                         [&](const c10::intrusive_ptr<c10d::Work>& work, const std::string& name) {
                                           wait_and_check(work, at::Tensor(), name);
                                         });
}


MuonRuntime::~MuonRuntime() = default;

void MuonRuntime::step(at::TensorList params, const std::vector<at::Tensor>& grads,
                       const std::vector<at::Tensor>& momentum_buffers, const std::vector<int64_t>& group_idx,
                       const std::vector<MuonGroupOptions>& groups, int64_t step_idx) {
  const size_t num_params = layouts_.size();
  DMUON_CHECK(params.size() == num_params && grads.size() == num_params &&
                  momentum_buffers.size() == num_params && group_idx.size() == num_params,
              "MuonRuntime::step: expected ", num_params, " params, grads, buffers and group indices");
  step_idx_ = step_idx;
  stats_ = StepStats{};
  const auto step_start = Clock::now();
  const bool gather = options_.mode == "gather";
  const bool communicate = group_ && world_size_ > 1;
  const std::vector<ns::Schedule> schedules = schedules_of(groups);

  // NaN/Inf flags of the orthogonalized batches (one per batch) and their first parameter.
  std::vector<at::Tensor> finite_flags;
  std::vector<size_t> flag_owner;

  // Which parameters take part, with their local shapes checked.
  std::vector<bool> active(num_params, false);
  std::vector<at::Tensor> updates(num_params);
  for (size_t i = 0; i < num_params; ++i) {
    const auto& layout = layouts_[i];
    const dist::RowBlock mine = rows_[i][static_cast<size_t>(rank_)];
    const at::Tensor& p = params[i];
    DMUON_CHECK(p.dim() == static_cast<int64_t>(layout.global_shape.size()) &&
                    p.size(0) * layout.rows_per_dim0() == mine.count &&
                    (p.dim() < 2 || p.numel() == mine.count * layout.cols()),
                "parameter ", i, " (", names_[i], ") has local shape ", p.sizes(), " on rank ", rank_,
                ", but its layout expects ", mine.count / std::max<int64_t>(1, layout.rows_per_dim0()),
                " rows of dim 0 (global shape ", c10::IntArrayRef(layout.global_shape), ")");
    DMUON_CHECK(group_idx[i] >= 0 && static_cast<size_t>(group_idx[i]) < groups.size(),
                "parameter ", i, ": group index ", group_idx[i], " out of range");
    if (!grads[i].defined() || layout.numel() == 0) continue;
    DMUON_CHECK(grads[i].sizes() == p.sizes(), "parameter ", i, " (", names_[i], "): its gradient's shape ",
                grads[i].sizes(), " does not match its local shape ", p.sizes());
    DMUON_CHECK(momentum_buffers[i].defined(), "parameter ", i, " (", names_[i],
                ") has a gradient but no momentum buffer");
    DMUON_CHECK(momentum_buffers[i].sizes() == p.sizes(), "parameter ", i, " (", names_[i],
                "): its momentum buffer's shape ", momentum_buffers[i].sizes(), " does not match its local shape ",
                p.sizes());
    active[i] = true;
  }


  // Momentum of one bucket's parameters, in place on the local rows, and the update viewed
  // as [local_rows, cols]. NOTE: done bucket by bucket so that updates never exist for the
  // whole model at once; the caller has checked gradients and buffers for NaN/Inf.
  auto prepare_updates = [&](const dist::Bucket& bucket) {
    const auto start = Clock::now();
    // One multi-tensor lerp per group (and one more for Nesterov).
    std::map<int64_t, std::vector<int>> by_group;
    for (int idx : bucket.param_idx)
      if (active[idx]) by_group[group_idx[idx]].push_back(idx);
    for (const auto& [g, members] : by_group) {
      const auto& options = groups[static_cast<size_t>(g)];
      std::vector<at::Tensor> buffers, grad_list;
      for (int idx : members) {
        buffers.push_back(momentum_buffers[idx]);
        grad_list.push_back(grads[idx]);
      }
      at::_foreach_lerp_(buffers, grad_list, 1.0 - options.momentum);
      std::vector<at::Tensor> outs = buffers;
      if (options.nesterov) outs = at::_foreach_lerp(grad_list, buffers, options.momentum);
      for (size_t k = 0; k < members.size(); ++k)
        updates[members[k]] = outs[k].reshape({rows_[members[k]][rank_].count, layouts_[members[k]].cols()});
    }
    sync_for_profile();
    stats_.momentum_s += seconds_since(start);
  };

  const at::Device device = params.empty() ? at::Device(at::kCPU) : params[0].device();
  auto computes = [&](int idx) { return gather || owners_[static_cast<size_t>(idx)] == rank_; };
  auto sharded = [&](int idx) { return layouts_[static_cast<size_t>(idx)].sharded; };
  // Each bucket's compute phases, for the projection (RuntimeOptions::record_timeline).
  PhaseRecorder recorder(options_.record_timeline, device);

  // A finished all_to_all: waited for, then (a fake world) its receive buffer filled as the
  // model says; that fill is no real work and lies outside every phase.
  auto finish_exchange = [&](InFlight& flight, const std::string& what, dist::ExchangeKind kind) {
    const auto start = Clock::now();
    wait_and_check(flight.work, flight.recv, what);
    stats_.comm_wait_s += seconds_since(start);
    if (!flight.work || !model_.is_fake()) return;
    recorder.begin_outside();
    const auto fill_start = Clock::now();
    fill_modelled_receive(flight.recv, flight.recv_offsets, flight.send, flight.send_offsets, kind);
    sync_for_profile();
    stats_.model_fill_s += seconds_since(fill_start);
    recorder.end();
  };

  // Forward: every rank sends its rows of each sharded matrix to the ranks that compute it.
  auto issue_forward = [&](size_t k) {
    const dist::Bucket& bucket = buckets_[k];
    ScopedPhase phase(recorder, k, sim::Phase::kPrepare);
    prepare_updates(bucket);
    const auto start = Clock::now();
    InFlight flight;
    std::vector<int64_t> send_splits(static_cast<size_t>(world_size_), 0);
    std::vector<int64_t> recv_splits(static_cast<size_t>(world_size_), 0);
    std::vector<at::Tensor> pieces;
    for (int dest = 0; dest < world_size_; ++dest) {
      for (int idx : bucket.param_idx) {
        if (!active[idx] || !sharded(idx) || !(gather || owners_[idx] == dest)) continue;
        pieces.push_back(updates[idx]);
        send_splits[dest] += updates[idx].numel();
      }
    }
    for (int src = 0; src < world_size_; ++src)
      for (int idx : bucket.param_idx)
        if (active[idx] && sharded(idx) && computes(idx))
          recv_splits[src] += rows_[idx][src].count * layouts_[idx].cols();
    flight.recv_offsets = offsets_of(recv_splits);
    flight.send_offsets = offsets_of(send_splits);
    // NOTE: the all_to_all is collective: whether to call it must depend only on what every
    // rank knows alike (which parameters are active and sharded), never on local sizes.
    bool any_sharded = false;
    for (int idx : bucket.param_idx) any_sharded = any_sharded || (active[idx] && sharded(idx));
    if (communicate && any_sharded) {
      flight.send = pack(pieces, wire_dtype_, device);
      flight.recv = at::empty({flight.recv_offsets.back()}, flight.send.options());
      flight.work = all_to_all(flight.recv, flight.send, recv_splits, send_splits);
      stats_.bytes_sent += (flight.send.numel() - send_splits[rank_]) * flight.send.element_size();
      stats_.bytes_received += (flight.recv.numel() - recv_splits[rank_]) * flight.recv.element_size();
    } else if (!communicate) {
      flight.recv = pack(pieces, wire_dtype_, device);  // one rank: its own pieces, in order
    }
    stats_.pack_s += seconds_since(start);
    return flight;
  };

  // Assemble full matrices on the ranks that compute them; batched Newton–Schulz.
  auto orthogonalize_bucket = [&](size_t k, InFlight& flight) {
    const dist::Bucket& bucket = buckets_[k];
    finish_exchange(flight, "all_to_all of updates to owners", dist::ExchangeKind::kUpdatesToOwners);
    ScopedPhase phase(recorder, k, sim::Phase::kNs);
    const auto start = Clock::now();
    std::map<int, at::Tensor> full;  // param → [flat_rows, cols]
    std::vector<int64_t> cursor(flight.recv_offsets.begin(), flight.recv_offsets.end() - 1);
    for (int idx : bucket.param_idx) {
      if (!active[idx] || !computes(idx)) continue;
      const auto& layout = layouts_[idx];
      if (!sharded(idx)) {
        full[idx] = updates[idx];
        continue;
      }
      at::Tensor matrix = at::empty({layout.flat_rows(), layout.cols()}, flight.recv.options());
      for (int src = 0; src < world_size_; ++src) {
        const dist::RowBlock block = rows_[idx][src];
        const int64_t count = block.count * layout.cols();
        if (count == 0) continue;
        matrix.narrow(0, block.begin, block.count)
            .copy_(flight.recv.narrow(0, cursor[src], count).view({block.count, layout.cols()}));
        cursor[src] += count;
      }
      full[idx] = matrix;
    }
    flight = InFlight{};  // NOTE: free the receive buffer before the NS workspace is allocated

    // One batched call per (group, m, n, float64 or not) over every run of equal matrices.
    // NOTE: float64 parameters iterate in float64 (the single-process precision), all others
    // in float32.
    std::map<std::tuple<int64_t, int64_t, int64_t, bool>, std::vector<std::pair<int, MatrixRun>>> batches;
    for (const auto& [idx, matrix] : full)
      for (const MatrixRun& run : matrix_runs(layouts_[idx]))
        batches[{group_idx[idx], run.matrix_rows, layouts_[idx].cols(), params[idx].scalar_type() == at::kDouble}]
            .emplace_back(idx, run);
    std::map<int, std::vector<std::pair<int64_t, at::Tensor>>> pieces;  // param → (first row, result rows)
    for (const auto& [key, runs] : batches) {
      const auto [g, m, n, wide] = key;
      std::vector<at::Tensor> stack;
      const at::ScalarType ns_dtype = wide ? at::kDouble : at::kFloat;
      for (const auto& [idx, run] : runs)
        stack.push_back(full[idx].narrow(0, run.row_begin, run.num_rows).to(ns_dtype).view({-1, m, n}));
      at::Tensor out = orthogonalize(at::cat(stack, 0), schedules[static_cast<size_t>(g)], "auto", "auto", cuda_graphs_);
      // NOTE: checked and sanitized where computed, once per batch: inputs were finite, so
      // NaN/Inf here is rare; such entries are zeroed (never applied) and the step raises
      // at its end on every rank, naming the batch's first parameter.
      finite_flags.push_back(at::logical_not(at::isfinite(out).all()));
      flag_owner.push_back(static_cast<size_t>(runs.front().first));
      out.nan_to_num_(0.0, 0.0, 0.0);
      int64_t offset = 0;
      for (const auto& [idx, run] : runs) {
        const int64_t count = run.num_rows / m;
        pieces[idx].emplace_back(run.row_begin, out.narrow(0, offset, count).reshape({run.num_rows, n}));
        offset += count;
      }
    }
    // Each parameter's result [flat_rows, cols] (its runs in row order when several).
    std::map<int, at::Tensor> results;
    for (auto& [idx, parts] : pieces) {
      ++stats_.num_orthogonalized;
      stats_.orthogonalized.push_back(idx);
      if (parts.size() == 1) {
        results[idx] = parts.front().second;
        continue;
      }
      std::sort(parts.begin(), parts.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
      std::vector<at::Tensor> ordered;
      for (const auto& part : parts) ordered.push_back(part.second);
      results[idx] = at::cat(ordered, 0);
    }
    sync_for_profile();
    stats_.ns_s += seconds_since(start);
    return results;
  };

  // Return: owners send each rank its rows of the result (all rows when replicated).
  std::vector<at::Tensor> local_results(num_params);
  auto issue_return = [&](size_t k, std::map<int, at::Tensor>& results) {
    const dist::Bucket& bucket = buckets_[k];
    ScopedPhase phase(recorder, k, sim::Phase::kReturnPack);
    const auto start = Clock::now();
    InFlight flight;
    if (gather || !communicate) {
      for (auto& [idx, result] : results) {
        const dist::RowBlock mine = rows_[idx][rank_];
        local_results[idx] = result.narrow(0, mine.begin, mine.count);
      }
      return flight;
    }
    bool any_active = false;
    for (int idx : bucket.param_idx) any_active = any_active || active[idx];
    if (!any_active) return flight;
    std::vector<int64_t> send_splits(static_cast<size_t>(world_size_), 0);
    std::vector<int64_t> recv_splits(static_cast<size_t>(world_size_), 0);
    std::vector<at::Tensor> pieces;
    for (int dest = 0; dest < world_size_; ++dest) {
      for (int idx : bucket.param_idx) {
        if (!active[idx] || owners_[idx] != rank_) continue;
        const dist::RowBlock block = rows_[idx][dest];
        pieces.push_back(results[idx].narrow(0, block.begin, block.count));
        send_splits[dest] += block.count * layouts_[idx].cols();
      }
    }
    for (int src = 0; src < world_size_; ++src)
      for (int idx : bucket.param_idx)
        if (active[idx] && owners_[idx] == src)
          recv_splits[src] += rows_[idx][rank_].count * layouts_[idx].cols();
    flight.recv_offsets = offsets_of(recv_splits);
    flight.send_offsets = offsets_of(send_splits);
    flight.send = pack(pieces, wire_dtype_, device);
    flight.recv = at::empty({flight.recv_offsets.back()}, flight.send.options());
    flight.work = all_to_all(flight.recv, flight.send, recv_splits, send_splits);
    stats_.bytes_sent += (flight.send.numel() - send_splits[rank_]) * flight.send.element_size();
    stats_.bytes_received += (flight.recv.numel() - recv_splits[rank_]) * flight.recv.element_size();
    stats_.pack_s += seconds_since(start);
    return flight;
  };

  auto unpack_return = [&](const dist::Bucket& bucket, InFlight& flight) {
    if (!flight.work) return;
    std::vector<int64_t> cursor(flight.recv_offsets.begin(), flight.recv_offsets.end() - 1);
    for (int src = 0; src < world_size_; ++src) {
      for (int idx : bucket.param_idx) {
        if (!active[idx] || owners_[idx] != src) continue;
        const dist::RowBlock mine = rows_[idx][rank_];
        const int64_t count = mine.count * layouts_[idx].cols();
        local_results[idx] = flight.recv.narrow(0, cursor[src], count).view({mine.count, layouts_[idx].cols()});
        cursor[src] += count;
      }
    }
    flight = InFlight{};
  };

  // Apply one bucket's results: p ← p·(1 − lr·wd) − lr·ratio(m, n)·O, then free them,
  // with multi-tensor kernels per group. Results were checked and sanitized by the rank
  // that computed them (orthogonalize_bucket).
  auto apply_bucket = [&](const dist::Bucket& bucket) {
    const auto start = Clock::now();
    std::vector<at::Tensor> param_list, result_list;
    std::vector<double> scales, decays;
    for (int idx : bucket.param_idx) {
      if (!active[idx]) continue;
      DMUON_CHECK(local_results[idx].defined(), "internal: no result for parameter ", idx, " (", names_[idx], ")");
      const auto& options = groups[static_cast<size_t>(group_idx[idx])];
      const auto& layout = layouts_[static_cast<size_t>(idx)];
      if (layout.uniform()) {
        const auto [m, n] = layout.update_shape(layout.matrix_rows());
        param_list.push_back(params[idx]);
        result_list.push_back(local_results[idx]);
        scales.push_back(options.update_scale(m, n));
        decays.push_back(options.decay());
      } else {
        // Row blocks of different rows: this rank's rows of each block, with its own scale.
        const dist::RowBlock mine = rows_[idx][rank_];
        DMUON_CHECK(params[idx].is_contiguous(), "parameter ", idx, " (", names_[idx],
                    ") has row blocks of different sizes and must be contiguous");
        const at::Tensor local_param = params[idx].view({mine.count, layout.cols()});
        const at::Tensor local_result = local_results[idx].reshape({mine.count, layout.cols()});
        for (const dist::RowBlock& block : layout.matrix_blocks()) {
          const int64_t begin = std::max(block.begin, mine.begin);
          const int64_t end = std::min(block.begin + block.count, mine.begin + mine.count);
          if (end <= begin) continue;
          const auto [m, n] = layout.update_shape(block.count);
          param_list.push_back(local_param.narrow(0, begin - mine.begin, end - begin));
          result_list.push_back(local_result.narrow(0, begin - mine.begin, end - begin));
          scales.push_back(options.update_scale(m, n));
          decays.push_back(options.decay());
        }
      }
      local_results[idx] = at::Tensor();
      updates[idx] = at::Tensor();
    }
    apply_updates_(param_list, result_list, scales, decays);
    sync_for_profile();
    stats_.apply_s += seconds_since(start);
  };

  // The pipeline: the forwards of the next `depth` buckets in flight during NS of bucket k,
  // and the returns of the `depth` buckets before it; a bucket is applied once its return
  // has had `depth` buckets' time to arrive. (sim::stage_pipeline_program models this order.)
  // NOTE: why `depth` both ways: on GPUs every wait for a collective is a wait of the
  // compute stream, and a collective completes only when every rank reached it. Waiting for
  // the return of bucket k−1 before NS of bucket k+1 (or sending bucket k+2's momentum,
  // queued behind NS of bucket k) chains each NS to the NS two buckets earlier on another
  // owner: at most two owners computed at once (world 4, Qwen2.5-7B: step 327 ms against
  // 153 ms of NS on the slowest rank). With `depth` buckets of slack both ways, that many
  // owners overlap; the price is `depth` buckets of buffers.
  const size_t num_buckets = buckets_.size();
  stats_.num_buckets = static_cast<int64_t>(num_buckets);
  const size_t depth = depth_;
  stats_.pipeline_depth = static_cast<int64_t>(depth);
  std::vector<InFlight> forward(num_buckets), back(num_buckets);
  size_t num_issued = 0;
  auto issue_forwards_before = [&](size_t end) {  // forwards of buckets [num_issued, end)
    for (; num_issued < std::min(end, num_buckets); ++num_issued) forward[num_issued] = issue_forward(num_issued);
  };
  auto land = [&](size_t j) {  // bucket j's results back and applied
    finish_exchange(back[j], "all_to_all of results back from owners", dist::ExchangeKind::kResultsFromOwners);
    ScopedPhase phase(recorder, j, sim::Phase::kApply);
    unpack_return(buckets_[j], back[j]);
    apply_bucket(buckets_[j]);
  };
  issue_forwards_before(depth + 1);
  for (size_t k = 0; k < num_buckets; ++k) {
    auto results = orthogonalize_bucket(k, forward[k]);
    back[k] = issue_return(k, results);
    issue_forwards_before(k + depth + 2);
    if (k >= depth) land(k - depth);
  }
  for (size_t j = num_buckets > depth ? num_buckets - depth : 0; j < num_buckets; ++j) land(j);

  // Agree that every result was finite (one host sync and one tiny all_reduce).
  int64_t first_bad = -1;
  if (!finite_flags.empty()) {
    at::Tensor bad = at::stack(finite_flags).to(at::kCPU);  // the step's one host sync
    for (size_t k = 0; k < flag_owner.size(); ++k)
      if (bad.data_ptr<bool>()[k]) { first_bad = static_cast<int64_t>(flag_owner[k]); break; }
  }
  {
    PhaseRecorder::Result timeline = recorder.finish(num_buckets);
    stats_.bucket_times = std::move(timeline.buckets);
    if (options_.record_timeline) stats_.model_fill_s = timeline.outside_s;  // NOTE: device time
  }
  // NOTE: max over ranks of (num_params − first bad index) finds the smallest bad index.
  const int64_t encoded = first_bad < 0 ? 0 : static_cast<int64_t>(num_params) - first_bad;
  const int64_t agreed = all_reduce_flags({encoded}, "max", "all_reduce of the finite check", step_idx)[0];
  if (agreed != 0) {
    const int64_t first = static_cast<int64_t>(num_params) - agreed;
    DMUON_FAIL(nonfinite_result_message(step_idx_, first, names_[static_cast<size_t>(first)]));
  }
  stats_.total_s += seconds_since(step_start);
}

}  // namespace dmuon::torch_adapter

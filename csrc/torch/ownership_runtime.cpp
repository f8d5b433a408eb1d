// dmuon/torch/ownership_runtime.cpp — publish, reduce-to-owner, early Newton–Schulz, commit.
#include "ownership_runtime.h"

#include <c10/core/DeviceGuard.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>

#include <algorithm>
#include <map>

#include "common/check.h"
#include "foreach_ops.h"
#include "flag_reduce.h"
#include "orthogonalize.h"
#include "owner_planning.h"
#include "plan/layer_spread.h"
#include "plan/planner.h"
#include "storage_control.h"
#include "world_detect.h"

namespace dmuon::torch_adapter {
namespace {

at::ScalarType parse_reduce_dtype(const std::string& name) {
  if (name == "float32") return at::kFloat;
  if (name == "bfloat16") return at::kBFloat16;
  if (name == "float16") return at::kHalf;
  DMUON_FAIL("reduce_dtype must be float32, bfloat16 or float16, got '", name, "'");
}

c10::intrusive_ptr<c10d::ProcessGroup> resolve(const std::string& name) {
  return name.empty() ? nullptr : c10d::resolve_process_group(name);
}

// NOTE: a tensor made on the worker's side stream and last used on the caller's stream
// must be marked as used there, or the caching allocator could hand its block to the side
// stream again while the caller's kernels still read it.
void hand_over(const at::Tensor& tensor) {
  if (!tensor.defined() || !tensor.is_cuda() || tensor.storage().data() == nullptr) return;
  c10::impl::VirtualGuardImpl impl(tensor.device().type());
  impl.recordDataPtrOnStream(tensor.storage().data_ptr(), impl.getStream(tensor.device()));
}

}  // namespace

// One bucket between its reduction and the end of the step.
struct OwnershipRuntime::Issued {
  size_t k = 0;
  at::Tensor buffer;                          // this rank's gradients (reduce dtype)
  at::Tensor recv;                            // level-0 pieces of this rank's shard chunk
  c10::intrusive_ptr<c10d::Work> work;        // level-0 all_to_all (null: none)
  std::optional<c10::Event> produced;         // GPU: the buffer is written on the caller's stream
  std::vector<at::Tensor> keep;               // side-stream tensors handed over at the end
};

OwnershipRuntime::OwnershipRuntime(const std::string& shard_group, const std::string& replicate_group,
                                   const std::string& replicate_reduce_group, std::vector<std::string> names, std::vector<dist::ParamLayout> layouts,
                                   std::vector<int> layer_of, OwnershipOptions options)
    : names_(std::move(names)), layouts_(std::move(layouts)), layer_of_(std::move(layer_of)),
      options_(std::move(options)), start_(std::chrono::steady_clock::now()) {
  const size_t n = names_.size();
  DMUON_CHECK(layouts_.size() == n && layer_of_.size() == n, "OwnershipRuntime: ", n, " names, ",
              layouts_.size(), " layouts and ", layer_of_.size(), " layer ids (layer_of)");
  DMUON_CHECK(options_.device_type == "cpu" || options_.device_type == "cuda",
              "device_type must be 'cpu' or 'cuda', got '", options_.device_type, "'");
  for (size_t i = 0; i < n; ++i) {
    layouts_[i].validate(names_[i].c_str());
    DMUON_CHECK(!layouts_[i].sharded, "OwnershipRuntime: matrix ", names_[i],
                " is marked sharded; owned matrices are whole on their owner");
    // NOTE: its batches view each update as equal matrices [count, rows, cols].
    DMUON_CHECK(layouts_[i].uniform(), "OwnershipRuntime: matrix ", names_[i],
                " has row blocks of different sizes; the weight-ownership mode orthogonalizes equal blocks only");
  }
  reduce_dtype_ = parse_reduce_dtype(options_.reduce_dtype);
  shard_group_ = resolve(shard_group);
  replicate_group_ = resolve(replicate_group);
  replicate_reduce_group_ = resolve(replicate_reduce_group);
  DMUON_CHECK(shard_group_ || !replicate_group_, "OwnershipRuntime: a replicate group needs a shard group");
  // NOTE: owners publish whole weights that every rank computes with; over the fake
  // backend they would never arrive (the sharded mode runs there, dist/world_model.h).
  for (const auto* group : {&shard_group_, &replicate_group_, &replicate_reduce_group_})
    if (*group)
      detect_world_model(*group, options_.device_type)
          .require_data_movement("the weight-ownership mode (dmuon.own_matrices; use FSDP2's sharding with DMuon)");
  DMUON_CHECK(!replicate_group_ == !replicate_reduce_group_ &&
                  (!replicate_group_ || replicate_group_->getSize() == replicate_reduce_group_->getSize()),
              "OwnershipRuntime: replicate_group and replicate_reduce_group must both be given, over the same ranks");
  if (shard_group_) {
    grid_.shards = shard_group_->getSize();
    grid_.replicas = replicate_group_ ? replicate_group_->getSize() : 1;
    rank_ = (replicate_group_ ? replicate_group_->getRank() : 0) * grid_.shards + shard_group_->getRank();
  }
  make_plan();

  // Per-matrix state.
  publish_work_.resize(n);
  bucket_buffer_.resize(buckets_.size());
  contributed_.assign(n, false);
  arrived_.assign(n, false);
  issued_.assign(buckets_.size(), false);
  new_momentum_.resize(n);
  update_.resize(n);
  group_idx_.assign(n, 0);
  momentum_buffers_.resize(n);

  // The worker: a thread, with its own stream on GPUs.
  if (options_.device_type == "cuda") {
    c10::impl::VirtualGuardImpl impl(at::kCUDA);
    side_stream_ = impl.getStreamFromGlobalPool(device(), /*isHighPriority=*/false);
  }
  worker_ = std::thread([this] { worker_loop(); });
}

OwnershipRuntime::~OwnershipRuntime() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  work_cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

at::Device OwnershipRuntime::device() const { return collective_device(options_.device_type); }

// Owners (balanced NS time, layers spread) and gradient buckets in backward order.
void OwnershipRuntime::make_plan() {
  const size_t n = layouts_.size();
  std::vector<int64_t> wire_bytes;
  for (const auto& layout : layouts_) wire_bytes.push_back(layout.numel() * at::elementSize(reduce_dtype_));
  if (grid_.world() == 1) {
    owners_.assign(n, 0);
  } else {
    OwnerPlanInput input{names_, layouts_, wire_bytes, grid_.world(), options_.solver,
                         options_.device_type, options_.cost_entries};
    auto adjust = [&](const plan::Problem& problem, plan::Plan& plan) {
      if (options_.spread_layers) plan::spread_layers(problem, layer_of_, plan);
    };
    if (!replicate_group_) {
      const OwnerPlan planned = plan_owners(input, shard_group_, rank_, device(), adjust);
      plan_text_ = planned.text;
      predicted_makespan_s_ = planned.plan.makespan;
      owners_ = planned.plan.owner;
    } else {
      // Grid rank 0 solves; its text goes across replicas (shard coordinate 0), then
      // inside every shard group.
      const plan::Problem problem = build_owner_problem(input);
      std::string text = rank_ == 0 ? solve_owner_plan(problem, options_.solver, adjust) : std::string();
      if (grid_.shard_of(rank_) == 0)
        text = broadcast_text(replicate_group_, grid_.replica_of(rank_), text, device(), "planning owners");
      text = broadcast_text(shard_group_, grid_.shard_of(rank_), text, device(), "planning owners");
      const plan::Plan plan = plan::deserialize_plan(problem, text);
      plan_text_ = text;
      predicted_makespan_s_ = plan.makespan;
      owners_ = plan.owner;
    }
  }
  // NOTE: gradients arrive in roughly reverse registration order (backward runs the
  // last layer first), so buckets are cut from the reversed matrix list.
  std::vector<int> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = static_cast<int>(n - 1 - i);
  std::vector<int64_t> numel;
  for (const auto& layout : layouts_) numel.push_back(layout.numel());
  buckets_ = dist::make_owned_buckets(order, numel, owners_, grid_, options_.bucket_bytes,
                                      at::elementSize(reduce_dtype_));
  bucket_of_.assign(n, 0);
  slot_of_.assign(n, 0);
  for (size_t k = 0; k < buckets_.size(); ++k)
    for (size_t s = 0; s < buckets_[k].param_idx.size(); ++s) {
      bucket_of_[static_cast<size_t>(buckets_[k].param_idx[s])] = k;
      slot_of_[static_cast<size_t>(buckets_[k].param_idx[s])] = s;
    }
}

std::vector<std::vector<int>> OwnershipRuntime::buckets() const {
  std::vector<std::vector<int>> out;
  for (const auto& b : buckets_) out.push_back(b.param_idx);
  return out;
}

void OwnershipRuntime::record(const std::string& what, int64_t index) {
  const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  timeline_.push_back({what, index, t});
}

std::vector<TimelineEvent> OwnershipRuntime::timeline() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return timeline_;
}

void OwnershipRuntime::clear_timeline() {
  std::lock_guard<std::mutex> lock(mutex_);
  timeline_.clear();
}

void OwnershipRuntime::wait_work(const c10::intrusive_ptr<c10d::Work>& work, const std::string& what) {
  if (!work) return;
  try {
    work->wait();
  } catch (const std::exception& error) {
    DMUON_FAIL("dmuon step ", step_idx_ + 1, ": ", what, " failed on rank ", rank_, " of ",
               grid_.world(), ": ", error.what());
  }
}

c10::intrusive_ptr<c10d::Work> OwnershipRuntime::broadcast(const c10::intrusive_ptr<c10d::ProcessGroup>& group,
                                                           at::Tensor& tensor, int root) {
  std::vector<at::Tensor> tensors{tensor};
  c10d::BroadcastOptions opts;
  opts.rootRank = root;
  return group->broadcast(tensors, opts);
}

// ----------------------------------------------------------------------------- options
void OwnershipRuntime::configure(std::vector<int64_t> group_idx, std::vector<MuonGroupOptions> groups,
                                 std::vector<at::Tensor> momentum_buffers) {
  const size_t n = names_.size();
  DMUON_CHECK(group_idx.size() == n && momentum_buffers.size() == n, "OwnershipRuntime::configure: expected ",
              n, " group indices and momentum buffers, got ", group_idx.size(), " and ", momentum_buffers.size());
  for (size_t i = 0; i < n; ++i) {
    DMUON_CHECK(group_idx[i] >= 0 && static_cast<size_t>(group_idx[i]) < groups.size(), "matrix ", names_[i],
                ": group index ", group_idx[i], " out of range");
    if (owners_[i] == rank_ && momentum_buffers[i].defined()) {
      DMUON_CHECK(momentum_buffers[i].numel() == layouts_[i].numel() && momentum_buffers[i].is_contiguous(),
                  "matrix ", names_[i], ": its owner's momentum buffer must be contiguous with ",
                  layouts_[i].numel(), " elements");
    }
  }
  std::lock_guard<std::mutex> lock(mutex_);
  group_idx_ = std::move(group_idx);
  groups_ = std::move(groups);
  momentum_buffers_ = std::move(momentum_buffers);
}

// ----------------------------------------------------------------------------- publish
void OwnershipRuntime::publish(int64_t i, const at::Tensor& compute, const at::Tensor& master) {
  DMUON_CHECK(i >= 0 && static_cast<size_t>(i) < names_.size(), "publish: matrix index ", i, " out of range");
  DMUON_CHECK(compute.numel() == layouts_[i].numel(), "publish: the compute tensor of ", names_[i], " has ",
              compute.numel(), " elements, expected ", layouts_[i].numel());
  if (publish_work_[i] || storage_is_allocated(compute)) return;  // in flight or present
  allocate_storage(compute);
  at::Tensor alias = storage_alias(compute);
  const int owner = owners_[i];
  if (owner == rank_) {
    DMUON_CHECK(storage_is_allocated(master), "publish: the owner's master weight of ", names_[i], " has no storage");
    alias.copy_(master.reshape(alias.sizes()));
  }
  publish_work_[i] = broadcast_from_owner(i, alias);
}

void OwnershipRuntime::wait_published(int64_t i) {
  DMUON_CHECK(i >= 0 && static_cast<size_t>(i) < names_.size(), "wait_published: matrix index ", i, " out of range");
  auto work = std::move(publish_work_[i]);
  publish_work_[i] = nullptr;
  wait_work(work, "broadcast of " + names_[i] + " from its owner");
}

void OwnershipRuntime::release(int64_t i, const at::Tensor& compute) {
  wait_published(i);
  free_storage(compute);
}

void OwnershipRuntime::materialize(int64_t i, const at::Tensor& tensor) {
  DMUON_CHECK(i >= 0 && static_cast<size_t>(i) < names_.size(), "materialize: matrix index ", i, " out of range");
  DMUON_CHECK(tensor.numel() == layouts_[i].numel(), "materialize: tensor of ", names_[i], " has ",
              tensor.numel(), " elements, expected ", layouts_[i].numel());
  const int owner = owners_[i];
  DMUON_CHECK(owner != rank_ || storage_is_allocated(tensor), "materialize: the owner's copy of ", names_[i],
              " has no storage");
  allocate_storage(tensor);
  at::Tensor alias = storage_alias(tensor);
  wait_work(broadcast_from_owner(i, alias), "broadcast of " + names_[i] + " from its owner");
}

// Two levels: across replicas among the owner's shard coordinate (waited), then inside
// shard groups (returned in flight; null with one rank).
c10::intrusive_ptr<c10d::Work> OwnershipRuntime::broadcast_from_owner(int64_t i, at::Tensor& tensor) {
  if (grid_.world() == 1) return nullptr;
  const int owner = owners_[i];
  if (replicate_group_ && grid_.shard_of(rank_) == grid_.shard_of(owner))
    wait_work(broadcast(replicate_group_, tensor, grid_.replica_of(owner)), "broadcast of " + names_[i] + " across replicas");
  return broadcast(shard_group_, tensor, grid_.shard_of(owner));
}

// ----------------------------------------------------------------------------- backward
void OwnershipRuntime::grad_ready(int64_t i, const at::Tensor& grad, bool sync) {
  DMUON_CHECK(i >= 0 && static_cast<size_t>(i) < names_.size(), "grad_ready: matrix index ", i, " out of range");
  DMUON_CHECK(grad.numel() == layouts_[i].numel(), "grad_ready: gradient of ", names_[i], " has ", grad.numel(),
              " elements, expected ", layouts_[i].numel());
  std::lock_guard<std::mutex> lock(mutex_);
  // NOTE: the timeline holds the current step only (from its first gradient to finish).
  if (!window_open_) {
    timeline_.clear();
    window_open_ = true;
  }
  record("grad_ready", i);
  const size_t k = bucket_of_[i];
  DMUON_CHECK(!issued_[k], "the gradient of ", names_[i], " arrived after its bucket was reduced in this step: "
              "call optimizer.step() after the backward that synchronizes gradients, and mark gradient "
              "accumulation micro-batches with set_requires_gradient_sync(False)");
  const auto& bucket = buckets_[k];
  if (layouts_[i].numel() > 0) {
    if (!bucket_buffer_[k].defined())
      bucket_buffer_[k] = at::zeros({bucket.numel}, grad.options().dtype(reduce_dtype_));
    at::Tensor slot = bucket_buffer_[k].narrow(0, bucket.offset[slot_of_[i]], layouts_[i].numel());
    if (contributed_[i]) slot.add_(grad.reshape({-1}));
    else slot.copy_(grad.reshape({-1}));
  }
  contributed_[i] = true;
  arrived_[i] = true;
  if (!sync) return;
  // Reduce complete buckets, strictly in bucket order (the same on every rank).
  while (next_to_issue_ < buckets_.size()) {
    const auto& next = buckets_[next_to_issue_].param_idx;
    if (!std::all_of(next.begin(), next.end(), [&](int j) { return arrived_[static_cast<size_t>(j)]; })) break;
    issue_bucket(next_to_issue_++);
  }
}

void OwnershipRuntime::flush(bool sync) {
  std::lock_guard<std::mutex> lock(mutex_);
  record("flush", -1);
  if (sync)
    while (next_to_issue_ < buckets_.size()) issue_bucket(next_to_issue_++);
  std::fill(arrived_.begin(), arrived_.end(), false);
}

// Level 0: all_to_all of this rank's whole buffer inside its shard group. Called with
// mutex_ held, on the thread that runs backward (collectives in one order everywhere).
void OwnershipRuntime::issue_bucket(size_t k) {
  auto issued = std::make_unique<Issued>();
  issued->k = k;
  const auto& bucket = buckets_[k];
  at::Tensor buffer = bucket_buffer_[k];
  if (!buffer.defined()) buffer = at::zeros({bucket.numel}, at::TensorOptions().dtype(reduce_dtype_).device(device()));
  bucket_buffer_[k] = at::Tensor();
  issued->buffer = buffer;
  if (buffer.is_cuda()) {
    issued->produced.emplace(buffer.device().type());
    c10::impl::VirtualGuardImpl impl(buffer.device().type());
    issued->produced->record(impl.getStream(buffer.device()));
  }
  if (grid_.shards > 1 && bucket.numel > 0) {
    const int s = grid_.shard_of(rank_);
    const int64_t chunk = bucket.shard_split[static_cast<size_t>(s)];
    issued->recv = at::empty({chunk * grid_.shards}, buffer.options());
    std::vector<int64_t> output_splits(static_cast<size_t>(grid_.shards), chunk);
    std::vector<int64_t> input_splits = bucket.shard_split;
    issued->work = shard_group_->alltoall_base(issued->recv, buffer, output_splits, input_splits);
  }
  issued_[k] = true;
  record("reduce_issued", static_cast<int64_t>(k));
  queue_.push_back(std::move(issued));
  ++num_issued_;
  work_cv_.notify_one();
}

// ----------------------------------------------------------------------------- worker
void OwnershipRuntime::worker_loop() {
  std::optional<c10::DeviceGuard> device_guard;
  std::optional<c10::StreamGuard> stream_guard;
  if (side_stream_) {
    device_guard.emplace(side_stream_->device());
    stream_guard.emplace(*side_stream_);
  }
  while (true) {
    std::unique_ptr<Issued> issued;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      work_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping
      issued = std::move(queue_.front());
      queue_.pop_front();
    }
    try {
      if (!worker_error_) process(*issued);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      worker_error_ = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      finished_.push_back(std::move(issued));
      ++num_processed_;
    }
    done_cv_.notify_all();
  }
}

// Sum the pieces of this rank's matrices, then momentum and batched Newton–Schulz.
void OwnershipRuntime::process(Issued& issued) {
  const auto& bucket = buckets_[issued.k];
  if (issued.produced && side_stream_) issued.produced->block(*side_stream_);
  // Level 0: the pieces of this shard coordinate's chunk, summed.
  const int s = grid_.shard_of(rank_);
  at::Tensor partial;
  if (issued.work) {
    wait_work(issued.work, "all_to_all of gradients to owners (bucket " + std::to_string(issued.k) + ")");
    partial = issued.recv.view({grid_.shards, -1}).sum(0);
  } else {
    partial = grid_.shards > 1 ? issued.buffer.narrow(0, bucket.shard_begin(s), bucket.shard_split[s])
                               : issued.buffer;
  }
  // Level 1: across replicas, to the owner. NOTE: this group is used by this thread only,
  // so its collectives are issued in bucket order on every rank.
  at::Tensor mine = partial;
  const int r = grid_.replica_of(rank_);
  const auto& splits = bucket.replica_split[static_cast<size_t>(s)];
  if (grid_.replicas > 1 && bucket.numel > 0) {
    at::Tensor recv = at::empty({splits[static_cast<size_t>(r)] * grid_.replicas}, partial.options());
    std::vector<int64_t> output_splits(static_cast<size_t>(grid_.replicas), splits[static_cast<size_t>(r)]);
    at::Tensor send = partial.contiguous();
    std::vector<int64_t> input_splits = splits;
    wait_work(replicate_reduce_group_->alltoall_base(recv, send, output_splits, input_splits),
              "all_to_all of gradients across replicas (bucket " + std::to_string(issued.k) + ")");
    mine = recv.view({grid_.replicas, -1}).sum(0);
  }

  // Snapshot of the options for this bucket's matrices.
  std::vector<int64_t> group_idx;
  std::vector<MuonGroupOptions> groups;
  std::vector<at::Tensor> buffers;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    group_idx = group_idx_;
    groups = groups_;
    buffers = momentum_buffers_;
    record("ns_begin", static_cast<int64_t>(issued.k));
  }
  DMUON_CHECK(!groups.empty(), "the ownership runtime has no optimizer options: build dmuon.DMuon over the "
              "owned parameters before the first backward");
  std::map<std::tuple<int64_t, int64_t, int64_t, bool>, std::vector<int>> batches;  // + float64?
  std::map<int, at::Tensor> updates;
  std::vector<at::Tensor> grad_list, buffer_list;
  std::vector<size_t> grad_slots, buffer_slots;  // where their flags go in finish()'s result
  for (size_t k = 0; k < bucket.param_idx.size(); ++k) {
    const int i = bucket.param_idx[k];
    if (owners_[static_cast<size_t>(i)] != rank_ || layouts_[i].numel() == 0) continue;
    const auto& layout = layouts_[i];
    const auto& options = groups[static_cast<size_t>(group_idx[i])];
    at::Tensor grad = mine.narrow(0, bucket.final_offset(k, grid_, owners_), layout.numel())
                          .div(static_cast<double>(grid_.world()));
    // NOTE: no buffer yet (before the first step): momentum starts from zeros.
    at::Tensor buffer = buffers[i].defined() ? buffers[i].reshape({-1}) : at::zeros({layout.numel()}, grad.options());
    grad_list.push_back(grad);
    buffer_list.push_back(buffer);
    grad_slots.push_back(names_.size() + static_cast<size_t>(i));
    buffer_slots.push_back(2 * names_.size() + static_cast<size_t>(i));
    at::Tensor momentum = buffer.lerp(grad.to(buffer.scalar_type()), 1.0 - options.momentum);
    at::Tensor update = options.nesterov ? grad.to(buffer.scalar_type()).lerp(momentum, options.momentum) : momentum;
    new_momentum_[i] = momentum;
    updates[i] = update;
    batches[{group_idx[i], layout.matrix_rows(), layout.cols(), update.scalar_type() == at::kDouble}].push_back(i);
    issued.keep.push_back(momentum);
  }
  // NaN/Inf of the reduced gradients and of the buffers: two multi-tensor checks per bucket.
  if (!grad_list.empty()) {
    input_flags_.push_back({nonfinite_flags(grad_list), grad_slots});
    input_flags_.push_back({nonfinite_flags(buffer_list), buffer_slots});
    issued.keep.push_back(input_flags_[input_flags_.size() - 2].flags);
    issued.keep.push_back(input_flags_.back().flags);
  }
  for (const auto& [key, members] : batches) {
    const auto [g, m, n, wide] = key;
    const auto& options = groups[static_cast<size_t>(g)];
    const ns::Schedule& schedule = options.schedule;
    std::vector<at::Tensor> stack;
    const at::ScalarType ns_dtype = wide ? at::kDouble : at::kFloat;
    for (int i : members) stack.push_back(updates[i].to(ns_dtype).view({-1, m, n}));
    // NOTE: a NaN/Inf gradient or buffer (flagged above) reaches the update before the ranks
    // agree on it: iterate on zeros in its place, so that the owner's Newton–Schulz (which
    // refuses non-finite input on the CPU) neither throws on one rank, leaving the others in
    // the agreement, nor hides the flag; finish() reports it and the step raises or skips.
    at::Tensor input = at::cat(stack, 0).nan_to_num_(0.0, 0.0, 0.0);
    at::Tensor out = orthogonalize(input, schedule);
    // NOTE: as in the sharded runtime, checked and sanitized once per batch where computed;
    // commit() applies the rest and raises, naming the first applied matrix of the batch.
    result_flags_.push_back({at::logical_not(at::isfinite(out).all()).expand({static_cast<int64_t>(members.size())}),
                             std::vector<size_t>(members.begin(), members.end())});
    issued.keep.push_back(result_flags_.back().flags);
    out.nan_to_num_(0.0, 0.0, 0.0);
    int64_t offset = 0;
    for (int i : members) {
      const int64_t count = layouts_[i].num_matrices();
      update_[i] = out.narrow(0, offset, count);
      offset += count;
    }
    issued.keep.push_back(out);
  }
  if (side_stream_) {
    worker_done_event_.emplace(side_stream_->device_type());
    worker_done_event_->record(*side_stream_);
  }
  std::lock_guard<std::mutex> lock(mutex_);
  record("ns_end", static_cast<int64_t>(issued.k));
}

// ----------------------------------------------------------------------------- step
void OwnershipRuntime::wait_worker() {
  std::unique_lock<std::mutex> lock(mutex_);
  done_cv_.wait(lock, [&] { return num_processed_ == num_issued_; });
}

std::vector<int64_t> OwnershipRuntime::finish(int64_t step_idx) {
  step_idx_ = step_idx - 1;
  flush(true);
  wait_worker();
  {
    std::unique_lock<std::mutex> lock(mutex_);
    record("finish", step_idx);
    window_open_ = false;
    if (worker_error_) {
      std::exception_ptr error = worker_error_;
      worker_error_ = nullptr;
      reset_window();
      lock.unlock();
      discard();
      std::rethrow_exception(error);
    }
  }
  if (worker_done_event_ && side_stream_) {
    c10::impl::VirtualGuardImpl impl(side_stream_->device_type());
    worker_done_event_->block(impl.getStream(side_stream_->device()));
  }
  const size_t n = names_.size();
  std::vector<int64_t> flags(3 * n, 0);
  for (size_t i = 0; i < n; ++i) flags[i] = contributed_[i] ? 1 : 0;
  for (const auto& [i, bad] : read_flags(input_flags_)) flags[i] = bad ? 1 : 0;
  std::lock_guard<std::mutex> lock(mutex_);
  reset_window();
  // NOTE: what runs from now on (the next forward and backward) belongs to the next step,
  // whether this one commits (commit() names its own collectives) or is skipped.
  step_idx_ = step_idx;
  return flags;
}

void OwnershipRuntime::reset_window() {
  std::fill(contributed_.begin(), contributed_.end(), false);
  std::fill(issued_.begin(), issued_.end(), false);
  next_to_issue_ = 0;
}

// Every (slot, flag) of a list of flag tensors, read with one host sync.
std::vector<std::pair<size_t, bool>> OwnershipRuntime::read_flags(const std::vector<FlagSet>& sets) {
  std::vector<std::pair<size_t, bool>> out;
  if (sets.empty()) return out;
  std::vector<at::Tensor> all;
  for (const auto& set : sets) all.push_back(set.flags.to(sets.front().flags.device()));
  at::Tensor host = at::cat(all).to(at::kCPU).contiguous();
  const bool* bad = host.data_ptr<bool>();
  for (const auto& set : sets)
    for (size_t slot : set.slots) out.emplace_back(slot, *bad++);
  return out;
}

void OwnershipRuntime::commit(const std::vector<at::Tensor>& masters, const std::vector<bool>& active,
                              const std::vector<MuonGroupOptions>& groups, int64_t step_idx) {
  const size_t n = names_.size();
  DMUON_CHECK(masters.size() == n && active.size() == n, "OwnershipRuntime::commit: expected ", n,
              " masters and activity flags");
  step_idx_ = step_idx - 1;
  // NOTE: afterwards (also when this throws) the work is the next step's.
  struct NextStep {
    int64_t& idx;
    int64_t value;
    ~NextStep() { idx = value; }
  } next_step{step_idx_, step_idx};
  std::vector<at::Tensor> param_list, update_list, buffer_list, momentum_list;
  std::vector<double> scales, decays;
  std::vector<bool> applied(n, false);
  for (size_t i = 0; i < n; ++i) {
    if (owners_[i] != rank_ || !active[i] || !update_[i].defined()) continue;
    DMUON_CHECK(momentum_buffers_[i].defined(), "commit: no momentum buffer configured for ", names_[i]);
    const auto& options = groups[static_cast<size_t>(group_idx_[i])];
    buffer_list.push_back(momentum_buffers_[i]);
    momentum_list.push_back(new_momentum_[i].view(momentum_buffers_[i].sizes()));
    param_list.push_back(masters[i]);
    update_list.push_back(update_[i]);
    const auto [m, n_cols] = layouts_[i].update_shape(layouts_[i].matrix_rows());
    scales.push_back(options.update_scale(m, n_cols));
    decays.push_back(options.decay());
    applied[i] = true;
  }
  if (!buffer_list.empty()) at::_foreach_copy_(buffer_list, momentum_list);
  apply_updates_(param_list, update_list, scales, decays);
  // Agree that every applied result was finite (one host sync, one tiny all_reduce).
  int64_t first_bad = -1;
  for (const auto& [i, bad] : read_flags(result_flags_))
    if (bad && applied[i] && (first_bad < 0 || static_cast<int64_t>(i) < first_bad)) first_bad = static_cast<int64_t>(i);
  discard();
  const int64_t encoded = first_bad < 0 ? 0 : static_cast<int64_t>(n) - first_bad;
  const int64_t agreed = all_reduce_flags({encoded}, "max", "all_reduce of the finite check")[0];
  DMUON_CHECK(agreed == 0, "dmuon step ", step_idx, ": the orthogonalized update of ",
              names_[static_cast<size_t>(static_cast<int64_t>(n) - agreed)],
              " is not finite; its non-finite entries were not applied (the rest of the step was)");
}

void OwnershipRuntime::discard() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (size_t i = 0; i < names_.size(); ++i) {
    hand_over(update_[i]);
    update_[i] = at::Tensor();
    new_momentum_[i] = at::Tensor();
  }
  input_flags_.clear();
  result_flags_.clear();
  for (auto& issued : finished_)
    for (auto& t : issued->keep) hand_over(t);
  finished_.clear();
  worker_done_event_.reset();
}

std::vector<int64_t> OwnershipRuntime::all_reduce_flags(const std::vector<int64_t>& local, const std::string& op,
                                                        const std::string& what) {
  return torch_adapter::all_reduce_flags(
      {{shard_group_, what + " (shard group)"}, {replicate_group_, what + " (replicas)"}}, local, op, device(),
      [&](const c10::intrusive_ptr<c10d::Work>& work, const std::string& name) { wait_work(work, name); });
}

}  // namespace dmuon::torch_adapter

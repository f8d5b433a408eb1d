// dmuon/torch/ownership_runtime.cpp — publish, reduce-to-owner, and the step engine's early
// work, finish and commit over the owned matrices.
#include "ownership_runtime.h"

#include <c10/core/DeviceGuard.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>

#include <algorithm>

#include "all_to_all.h"
#include "common/check.h"
#include "engine/torch_ops.h"
#include "flag_reduce.h"
#include "owner_planning.h"
#include "plan/layer_spread.h"
#include "plan/planner.h"
#include "step/device_ops.h"
#include "step_tensors.h"
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

}  // namespace

// One bucket between its reduction and the end of the step.
struct OwnershipRuntime::Issued {
  size_t k = 0;
  at::Tensor buffer;                          // this rank's gradients (reduce dtype)
  at::Tensor recv;                            // level-0 pieces of this rank's shard chunk
  c10::intrusive_ptr<c10d::Work> work;        // level-0 all_to_all (null: none)
  std::optional<c10::Event> produced;         // GPU: the buffer is written on the caller's stream
  std::vector<at::Tensor> keep;               // side-stream tensors the step's work reads
};

OwnershipRuntime::OwnershipRuntime(const std::string& shard_group, const std::string& replicate_group,
                                   const std::string& replicate_reduce_group, std::vector<std::string> names, std::vector<dist::ParamLayout> layouts,
                                   std::vector<int> layer_of, std::vector<std::string> dtypes, OwnershipOptions options)
    : names_(std::move(names)), layouts_(std::move(layouts)), layer_of_(std::move(layer_of)),
      options_(std::move(options)), start_(std::chrono::steady_clock::now()) {
  const size_t n = names_.size();
  DMUON_CHECK(layouts_.size() == n && layer_of_.size() == n && dtypes.size() == n, "OwnershipRuntime: ", n,
              " names, ", layouts_.size(), " layouts, ", layer_of_.size(), " layer ids (layer_of) and ", dtypes.size(),
              " dtypes");
  for (size_t i = 0; i < n; ++i) {
    dtypes_.push_back(parse_step_dtype(dtypes[i], "matrix " + names_[i]));
    // NOTE: refused here, not at the first step: the engine's ops of the device step it or not.
    std::string why;
    DMUON_CHECK(options_.device_type != "cuda" || step::ops_support(step::DeviceKind::kCuda, dtypes_.back(), &why),
                "the weight-ownership mode cannot own matrix ", names_[i], " on CUDA (", why,
                "): own it in float32, or leave it out of own_matrices for the sharded step");
  }
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
  step_grad_.resize(n);
  step_momentum_.resize(n);
  fresh_momentum_.assign(n, false);
  group_idx_.assign(n, 0);
  momentum_buffers_.resize(n);

  // The worker: a thread, with its own stream on GPUs, which the engine's ops enqueue on.
  if (options_.device_type == "cuda") {
    c10::impl::VirtualGuardImpl impl(at::kCUDA);
    side_stream_ = impl.getStreamFromGlobalPool(device(), /*isHighPriority=*/false);
  }
  transport_ = std::make_unique<OwnershipAgreement>(
      std::vector<FlagGroup>{{shard_group_, "shard group"}, {replicate_group_, "replicas"}}, rank_, grid_.world(),
      device(), [this](const c10::intrusive_ptr<c10d::Work>& work, const std::string& what) { wait_work(work, what); });
  // NOTE: the device ops' own float64 (CPU): the engine's commit runs on the caller's
  // thread, where torch's current stream is not the side stream (TorchOpsOptions).
  TorchOpsOptions ops_options;
  ops_options.stream = side_stream_;
  ops_options.aten_float64 = false;
  ops_ = make_torch_ops(side_stream_ ? step::Device{step::DeviceKind::kCuda, side_stream_->device_index()}
                                     : step::Device{},
                        ops_options);
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
    issued->work = all_to_all_single(*shard_group_, issued->recv, buffer, output_splits, input_splits);
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
    wait_work(all_to_all_single(*replicate_reduce_group_, recv, send, output_splits, input_splits),
              "all_to_all of gradients across replicas (bucket " + std::to_string(issued.k) + ")");
    mine = recv.view({grid_.replicas, -1}).sum(0);
  }

  // The owner's matrices of the bucket that this rank contributed to: their reduced
  // gradient (in the matrix's dtype) and momentum go to the engine's early work.
  std::vector<step::GroupRule> rules;
  std::vector<at::Tensor> buffers;
  std::vector<bool> contributed;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    rules = rules_;
    buffers = momentum_buffers_;
    contributed = contributed_;
    record("ns_begin", static_cast<int64_t>(issued.k));
  }
  DMUON_CHECK(engine_ && !rules.empty(), "the ownership runtime has no optimizer options: build dmuon.DMuon over "
              "the owned parameters before the first backward");
  std::vector<step::ParamTensors> tensors(names_.size());
  std::vector<int> ready;
  for (size_t k = 0; k < bucket.param_idx.size(); ++k) {
    const int i = bucket.param_idx[k];
    const size_t m = static_cast<size_t>(i);
    if (owners_[m] != rank_ || layouts_[m].numel() == 0 || !contributed[m]) continue;
    at::Tensor grad = mine.narrow(0, bucket.final_offset(k, grid_, owners_), layouts_[m].numel())
                          .div(static_cast<double>(grid_.world()))
                          .to(scalar_type(dtypes_[m]))
                          .contiguous();
    // NOTE: no buffer yet (before the first step): momentum starts from zeros, copied
    // into the buffer the optimizer makes at commit.
    const bool fresh = !buffers[m].defined();
    at::Tensor momentum = fresh ? at::zeros({layouts_[m].numel()}, grad.options()) : buffers[m];
    step_grad_[m] = grad;
    step_momentum_[m] = momentum;
    fresh_momentum_[m] = fresh;
    tensors[m] = {step::Buffer{}, to_buffer(grad, "the reduced gradient of " + names_[m]),
                  to_buffer(momentum, "the momentum buffer of " + names_[m]), true};
    const auto [first, count] = engine_->items().items_of(i);
    for (int item = first; item < first + count; ++item) ready.push_back(item);
  }
  if (!ready.empty()) {
    if (!engine_->step_open()) engine_->begin_step(rules, step_idx_ + 1);
    engine_->items_ready(ready, tensors);
  }
  std::lock_guard<std::mutex> lock(mutex_);
  record("ns_end", static_cast<int64_t>(issued.k));
}

// The step's tensors, once the engine's work on them is done (commit, discard).
void OwnershipRuntime::drop_step() {
  // NOTE: the engine's work on these tensors may still be enqueued (a discarded step).
  if (ops_) ops_->synchronize();
  std::lock_guard<std::mutex> lock(mutex_);
  for (size_t i = 0; i < names_.size(); ++i) {
    step_grad_[i] = at::Tensor();
    step_momentum_[i] = at::Tensor();
    fresh_momentum_[i] = false;
  }
  finished_.clear();
}

}  // namespace dmuon::torch_adapter

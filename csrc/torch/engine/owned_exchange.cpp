// dmuon/torch/engine/owned_exchange.cpp — groups, plan, tensors and streams of the
// weight-ownership mode's exchange (see owned_exchange.h).
#include "engine/owned_exchange.h"

#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>

#include <algorithm>

#include "common/check.h"
#include "engine/torch_ops.h"
#include "plan/planner.h"
#include "step/engine.h"
#include "step_tensors.h"
#include "storage_control.h"

namespace dmuon::torch_adapter {
namespace {

c10::intrusive_ptr<c10d::ProcessGroup> resolve(const std::string& name) {
  return name.empty() ? nullptr : c10d::resolve_process_group(name);
}

}  // namespace

OwnedExchange::OwnedExchange(const OwnershipGroups& groups, std::vector<std::string> names,
                             std::vector<layout::ParamLayout> layouts, std::vector<int> layer_of,
                             const std::vector<std::string>& dtypes, OwnershipOptions options)
    : world_group_(groups.world), names_(std::move(names)), layouts_(std::move(layouts)), dtype_names_(dtypes) {
  const size_t n = names_.size();
  DMUON_CHECK(layouts_.size() == n && layer_of.size() == n && dtypes.size() == n, "OwnedExchange: ", n, " names, ",
              layouts_.size(), " layouts, ", layer_of.size(), " layer ids (layer_of) and ", dtypes.size(), " dtypes");
  const step::Device device = torch_step_device(options.device);
  const step::DType reduce_dtype = options.reduce_dtype;
  world_ = std::make_unique<C10dTransport>(resolve(groups.world), device);
  // NOTE: owners publish whole weights that every rank computes with; over the fake
  // backend they would never arrive (the sharded mode runs there, layout/world_model.h).
  world_->world_model().require_data_movement("the weight-ownership mode (dmuon.own_matrices; use FSDP2's sharding "
                                              "with DMuon)");
  auto axis = [&](const std::string& name, int size) -> std::unique_ptr<C10dTransport> {
    if (name.empty() || size == 1) return nullptr;
    return std::make_unique<C10dTransport>(resolve(name), device);
  };
  row_ = axis(groups.row, groups.shards);
  column_ = axis(groups.column, groups.replicas);
  column_reduce_ = axis(groups.column_reduce, groups.replicas);

  // The parameters, and their owners from the engine's planner driver.
  std::vector<step::ParamSpec> specs;
  std::vector<step::OwnedParam> params;
  for (size_t i = 0; i < n; ++i) {
    layouts_[i].validate(names_[i].c_str());
    DMUON_CHECK(!layouts_[i].sharded, "OwnedExchange: parameter '", names_[i],
                "' is marked sharded; owned matrices are whole on their owner");
    const step::DType dtype = parse_step_dtype(dtypes[i], "parameter '" + names_[i] + "'");
    specs.push_back({names_[i], layouts_[i], dtype, 0, -1});
    params.push_back({names_[i], layouts_[i].numel(), dtype, 0});
  }
  step::EngineOptions plan_options;
  plan_options.solver = options.solver;
  plan_options.milp = plan::MilpOptions::from_env();
  const step::OwnerPlan plan = step::plan_whole_owners(*world_, specs, layer_of, plan_options, device.kind,
                                                       step::dtype_size(reduce_dtype), options.spread_layers);
  owners_ = plan.owners;
  plan_text_ = plan.text;
  predicted_makespan_s_ = plan.makespan_s;
  for (size_t i = 0; i < n; ++i) params[i].owner = owners_[i];

  // Ops: the gradients' on the current stream; the reductions' and the engine's on a side
  // stream of their own (GPU).
  // NOTE: DMUON_* knobs are read when the runtime is made (these ops are the engine's).
  TorchOpsOptions ops_options;
  grad_ops_ = make_torch_ops(device, ops_options);
  side_stream_ = ops_options.stream = stream_of_its_own(device);
  ops_ = make_torch_ops(device, ops_options);
  step::OwnershipMesh mesh =
      groups.shard_of.empty() ? step::OwnershipMesh::flat(world_->world_size())
                              : step::OwnershipMesh{groups.shards, groups.replicas, groups.shard_of, groups.replica_of};
  DMUON_CHECK(mesh.world_size() == world_->world_size(), "OwnedExchange: a ", mesh.replicas, "×", mesh.shards,
              " mesh over a world group of ", world_->world_size(), " ranks");
  exchange_ = std::make_unique<step::OwnershipExchange>(
      std::move(params), std::move(mesh), world_->rank(),
      step::ExchangeTransports{row_.get(), column_.get(), column_reduce_.get()}, *grad_ops_, *ops_,
      step::ExchangeOptions{options.bucket_bytes, reduce_dtype});
  published_.resize(n);
}

OwnedExchange::~OwnedExchange() = default;

size_t OwnedExchange::param_at(int64_t i, const char* call) const {
  DMUON_CHECK(i >= 0 && static_cast<size_t>(i) < names_.size(), call, ": parameter index ", i, " out of range");
  return static_cast<size_t>(i);
}

std::string OwnedExchange::at_step(const std::string& what) const {
  return what + " (" + step::step_name(exchange_->step_idx()) + ")";
}

std::vector<std::vector<int>> OwnedExchange::buckets() const {
  std::vector<std::vector<int>> out;
  for (const step::OwnedBucket& b : exchange_->buckets()) out.push_back(b.params);
  return out;
}

// ----------------------------------------------------------------------------- publish
void OwnedExchange::publish(int64_t i, const at::Tensor& compute, const at::Tensor& master) {
  const size_t p = param_at(i, "publish");
  DMUON_CHECK(compute.numel() == layouts_[p].numel(), "publish: the compute tensor of ", names_[p], " has ",
              compute.numel(), " elements, expected ", layouts_[p].numel());
  if (published_[p] || storage_is_allocated(compute)) return;  // in flight or present
  allocate_storage(compute);
  at::Tensor alias = storage_alias(compute);
  if (owners_[p] == rank()) {
    DMUON_CHECK(storage_is_allocated(master), "publish: the owner's master weight of ", names_[p], " has no storage");
    alias.copy_(master.reshape(alias.sizes()));
  }
  published_[p] = exchange_->publish(static_cast<int>(i), to_buffer(alias, "the compute copy of " + names_[p]),
                                     at_step("broadcast of " + names_[p] + " from its owner"));
}

void OwnedExchange::wait_published(int64_t i) {
  std::unique_ptr<step::Pending> pending = std::move(published_[param_at(i, "wait_published")]);
  if (pending) pending->wait();
}

void OwnedExchange::release(int64_t i, const at::Tensor& compute) {
  wait_published(i);
  free_storage(compute);
}

void OwnedExchange::materialize(int64_t i, const at::Tensor& tensor) {
  const size_t p = param_at(i, "materialize");
  DMUON_CHECK(tensor.numel() == layouts_[p].numel(), "materialize: tensor of ", names_[p], " has ", tensor.numel(),
              " elements, expected ", layouts_[p].numel());
  DMUON_CHECK(owners_[p] != rank() || storage_is_allocated(tensor), "materialize: the owner's copy of ", names_[p],
              " has no storage");
  allocate_storage(tensor);
  const at::Tensor alias = storage_alias(tensor);
  std::unique_ptr<step::Pending> pending = exchange_->publish(
      static_cast<int>(i), to_buffer(alias, "the copy of " + names_[p]), at_step("broadcast of " + names_[p] +
                                                                                 " from its owner"));
  if (pending) pending->wait();
}

// ----------------------------------------------------------------------------- backward
void OwnedExchange::grad_ready(int64_t i, const at::Tensor& grad, const at::Tensor& momentum, bool sync) {
  const std::string& name = names_[param_at(i, "grad_ready")];
  // NOTE: the gradient is read on backward's stream (the gradients' ops' stream, ordered
  // both ways with the current one where they differ), where Python drops it.
  const at::Tensor g = grad.contiguous();
  const step::Buffer m = momentum.defined() ? to_buffer(momentum, "the momentum buffer of " + name) : step::Buffer{};
  {
    OpsStreamScope scope(*grad_ops_);
    exchange_->grad_ready(static_cast<int>(i), to_buffer(g, "the gradient of " + name), m, sync);
  }
  if (sync) progress(false);
}

void OwnedExchange::end_backward(bool sync) {
  {
    OpsStreamScope scope(*grad_ops_);
    exchange_->end_backward(sync);
  }
  if (sync) progress(false);
}

void OwnedExchange::attach(std::function<void(const std::vector<int>&)> hand_over, const void* owner) {
  hand_over_ = std::move(hand_over);
  attached_ = owner;
}

void OwnedExchange::detach(const void* owner) {
  if (attached_ != owner) return;
  hand_over_ = nullptr;
  attached_ = nullptr;
}

// NOTE: on the side stream, after what backward enqueued so far (the buckets' gradients,
// momentum buffers made there); backward never waits for it, so Newton–Schulz overlaps.
void OwnedExchange::progress(bool wait) {
  run_after_current_stream(ops_->device(), side_stream_, [&] {
    exchange_->progress(wait, [&](int, const std::vector<int>& params) {
      if (hand_over_ && !params.empty()) hand_over_(params);
    });
  });
}

void OwnedExchange::end_window(int64_t step_idx) {
  // NOTE: every rank issued the same buckets: finished (level 1 issued and waited) before
  // they are dropped, so that the next window's collectives meet their peers'.
  progress(true);
  exchange_->end_window(step_idx);
}

}  // namespace dmuon::torch_adapter

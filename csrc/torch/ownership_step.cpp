// dmuon/torch/ownership_step.cpp — the weight-ownership runtime's side of the step engine:
// its options (configure, the engine over the owned matrices) and the step (finish, commit,
// discard). The engine's early work is fed by the worker (ownership_runtime.cpp).
#include <c10/core/impl/VirtualGuardImpl.h>

#include <algorithm>

#include "common/check.h"
#include "ownership_runtime.h"
#include "step_tensors.h"

namespace dmuon::torch_adapter {

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
  // NOTE: the schedules are built here, once per configure, not per bucket.
  std::vector<step::GroupRule> rules;
  for (const MuonGroupOptions& g : groups) rules.push_back(group_rule(g));
  {
    std::lock_guard<std::mutex> lock(mutex_);
    group_idx_ = std::move(group_idx);
    groups_ = std::move(groups);
    rules_ = std::move(rules);
    momentum_buffers_ = std::move(momentum_buffers);
  }
  if (!engine_ || engine_group_idx_ != group_idx_) make_engine();
}

// The engine over every owned matrix, "whole on rank owner", in its Muon group.
// Collective (every rank calls configure alike): the engine agrees on the plan's hash.
void OwnershipRuntime::make_engine() {
  DMUON_CHECK(!engine_ || !engine_->step_open(), "OwnershipRuntime::configure: the param groups of the owned "
              "matrices changed while a step is open (change them between steps)");
  std::vector<step::ParamSpec> specs;
  for (size_t i = 0; i < names_.size(); ++i)
    specs.push_back({names_[i], layouts_[i], dtypes_[i], static_cast<int>(group_idx_[i]), owners_[i]});
  step::EngineOptions options;
  options.graphs = true;
  engine_.reset();
  engine_ = std::make_unique<step::StepEngine>(*transport_, *ops_, std::move(specs), options);
  engine_group_idx_ = group_idx_;
}

// ----------------------------------------------------------------------------- step
void OwnershipRuntime::wait_worker() {
  std::unique_lock<std::mutex> lock(mutex_);
  done_cv_.wait(lock, [&] { return num_processed_ == num_issued_; });
}

OwnershipRuntime::Finished OwnershipRuntime::finish(int64_t step_idx, const std::vector<at::Tensor>& masters,
                                                   const std::vector<MuonGroupOptions>& groups) {
  const size_t n = names_.size();
  DMUON_CHECK(masters.size() == n, "OwnershipRuntime::finish: expected ", n, " masters, got ", masters.size());
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
  // NOTE: afterwards (also when this throws) the window is closed and what runs from now
  // on (the next forward and backward) belongs to the next step.
  struct CloseWindow {
    OwnershipRuntime& r;
    int64_t step_idx;
    ~CloseWindow() {
      std::lock_guard<std::mutex> lock(r.mutex_);
      r.reset_window();
      r.step_idx_ = step_idx;
    }
  } close{*this, step_idx};
  DMUON_CHECK(engine_, "the ownership runtime has no optimizer options: build dmuon.DMuon over the owned parameters");
  std::vector<step::GroupRule> rules;
  for (const MuonGroupOptions& g : groups) rules.push_back(group_rule(g));
  std::vector<step::ParamTensors> tensors(n);
  for (size_t i = 0; i < n; ++i) {
    step::ParamTensors& t = tensors[i];
    t.has_grad = contributed_[i];
    if (owners_[i] != rank_ || layouts_[i].numel() == 0) continue;
    t.param = to_buffer(masters[i], "the master weight of " + names_[i]);
    t.grad = to_buffer(step_grad_[i], "the reduced gradient of " + names_[i]);
    t.momentum = to_buffer(step_momentum_[i], "the momentum buffer of " + names_[i]);
  }
  step::StepOutcome outcome;
  try {
    outcome = engine_->finish(tensors, rules, step_idx);
  } catch (...) {
    drop_step();
    throw;
  }
  Finished out;
  out.active = outcome.active;
  out.nonfinite.assign(outcome.nonfinite_params.begin(), outcome.nonfinite_params.end());
  out.corrupt.assign(outcome.corrupt_params.begin(), outcome.corrupt_params.end());
  if (outcome.status != step::StepOutcome::Status::kAgreed) drop_step();
  return out;
}

void OwnershipRuntime::reset_window() {
  std::fill(contributed_.begin(), contributed_.end(), false);
  std::fill(issued_.begin(), issued_.end(), false);
  next_to_issue_ = 0;
}

void OwnershipRuntime::commit(int64_t step_idx) {
  step_idx_ = step_idx - 1;
  // NOTE: afterwards (also when this throws) the work is the next step's.
  struct NextStep {
    int64_t& idx;
    int64_t value;
    ~NextStep() { idx = value; }
  } next_step{step_idx_, step_idx};
  DMUON_CHECK(engine_, "OwnershipRuntime::commit: no step was finished");
  // GPU: the engine writes on the side stream what the caller's stream made (new buffers).
  if (side_stream_) {
    c10::Event made(side_stream_->device_type());
    c10::impl::VirtualGuardImpl impl(side_stream_->device_type());
    made.record(impl.getStream(side_stream_->device()));
    made.block(*side_stream_);
  }
  // Buffers made by the optimizer at this commit take the momentum computed from zeros.
  // NOTE: the engine's commit ends in a host read of its stream: its writes are done here.
  auto adopt_fresh = [&] {
    for (size_t i = 0; i < names_.size(); ++i)
      if (fresh_momentum_[i] && step_momentum_[i].defined() && momentum_buffers_[i].defined())
        momentum_buffers_[i].view({-1}).copy_(step_momentum_[i].view({-1}));
  };
  try {
    engine_->commit();
  } catch (...) {
    adopt_fresh();
    drop_step();
    throw;
  }
  adopt_fresh();
  drop_step();
}

void OwnershipRuntime::discard() {
  if (engine_) engine_->discard();
  drop_step();
}

}  // namespace dmuon::torch_adapter

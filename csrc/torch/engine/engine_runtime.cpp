// dmuon/torch/engine/engine_runtime.cpp — tensors to descriptors, the engine's outcome and
// statistics back to the runtime's (see engine_runtime.h).
#include "engine/engine_runtime.h"

#include <ATen/record_function.h>
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>

#include <algorithm>
#include <utility>

#include "common/check.h"
#include "engine/torch_ops.h"
#include "step/stage_layout.h"
#include "step_tensors.h"

namespace dmuon::torch_adapter {
namespace {

at::ScalarType parse_dtype(const std::string& name, const std::string& param) {
  return scalar_type(parse_step_dtype(name, "parameter '" + param + "'"));
}

// A tensor the engine may write in place: `t` itself when contiguous, else a contiguous
// copy that is written back after the step (kept in `write_back`).
at::Tensor writable(const at::Tensor& t, std::vector<std::pair<at::Tensor, at::Tensor>>& write_back) {
  if (t.is_contiguous()) return t;
  at::Tensor copy = t.contiguous();
  write_back.emplace_back(t, copy);
  return copy;
}

}  // namespace

void EngineRuntime::agree_start(const std::string& group_name, step::DeviceKind device,
                                const step::StartChecks& checks, int64_t step_idx) {
  C10dTransport transport(group_name.empty() ? nullptr : c10d::resolve_process_group(group_name),
                          torch_step_device(device));
  step::agree_start(transport, checks, {}, step_idx, [](int) { return std::string(); });
}

EngineRuntime::EngineRuntime(const std::string& group_name, std::vector<std::string> names,
                             std::vector<layout::ParamLayout> layouts, const std::vector<std::string>& dtypes,
                             std::vector<int64_t> group_slot, step::RuntimeOptions options,
                             std::shared_ptr<OwnedExchange> owned, std::vector<int64_t> owned_group_slot)
    : options_(std::move(options)), layouts_(std::move(layouts)), owned_(std::move(owned)) {
  DMUON_CHECK(names.size() == layouts_.size() && dtypes.size() == layouts_.size() &&
                  group_slot.size() == layouts_.size(),
              "EngineRuntime: ", names.size(), " names, ", layouts_.size(), " layouts, ", dtypes.size(), " dtypes and ",
              group_slot.size(), " group slots");
  const step::Device device = torch_step_device(options_.device);
  c10::intrusive_ptr<c10d::ProcessGroup> group;
  if (!group_name.empty()) group = c10d::resolve_process_group(group_name);
  transport_ = std::make_unique<C10dTransport>(group, device);

  if (owned_) {
    // NOTE: the engine's ops are the exchange's (a GPU's side stream), so that the owned
    // matrices' early work and the step run on one stream.
    DMUON_CHECK(group_name == owned_->world_group(), "EngineRuntime: the owned matrices' world group is '",
                owned_->world_group(), "' but the runtime's group is '", group_name, "'");
    DMUON_CHECK(owned_group_slot.size() == owned_->names().size(), "EngineRuntime: ", owned_group_slot.size(),
                " group slots for ", owned_->names().size(), " owned parameters");
    ops_ = owned_->ops();
  } else {
    // NOTE: DMUON_* knobs are read when the runtime is made. A step begun from backward runs
    // on a stream of its own (GPU), which waits for each hand-over's gradients and which the
    // caller's stream waits for at step(): backward never waits for its work.
    TorchOpsOptions ops_options;
    if (options_.engine.backward_order) ops_stream_ = ops_options.stream = stream_of_its_own(device);
    ops_ = make_torch_ops(device, ops_options);
  }

  for (int64_t slot : group_slot) {
    DMUON_CHECK(slot >= 0, "EngineRuntime: group slot ", slot, " is negative");
    num_base_groups_ = std::max(num_base_groups_, slot + 1);
  }
  std::vector<step::ParamSpec> specs;
  for (size_t i = 0; i < names.size(); ++i) {
    dtypes_.push_back(parse_dtype(dtypes[i], names[i]));
    // NOTE: a transposed (Conv1D) matrix's lr ratio is the engine's (item_scale: the
    // model's shape), so it steps under its own group's rule.
    const int64_t group = group_slot[i];
    specs.push_back({names[i], layouts_[i], step_dtype(dtypes_.back(), "parameter '" + names[i] + "'"), static_cast<int>(group)});
  }
  // The owned parameters, whole on their owners, after the others.
  first_owned_ = static_cast<int>(specs.size());
  for (size_t i = 0; owned_ && i < owned_->names().size(); ++i) {
    const std::string& name = owned_->names()[i];
    DMUON_CHECK(owned_group_slot[i] >= 0, "EngineRuntime: group slot ", owned_group_slot[i], " is negative");
    num_base_groups_ = std::max(num_base_groups_, owned_group_slot[i] + 1);
    layouts_.push_back(owned_->layouts()[i]);
    dtypes_.push_back(parse_dtype(owned_->dtypes()[i], name));
    specs.push_back({name, layouts_.back(), step_dtype(dtypes_.back(), "parameter '" + name + "'"),
                     static_cast<int>(owned_group_slot[i]), owned_->owners()[i]});
  }
  // The engine's options as given, the rest resolved now. NOTE: DMUON_* knobs are read when
  // the runtime is made.
  engine_ = std::make_unique<step::StepEngine>(*transport_, *ops_, std::move(specs), options_.resolve());

  const step::ItemTable& table = engine_->items();
  for (int p = 0; p < table.num_params(); ++p) {
    const auto [first, count] = table.items_of(p);
    param_owners_.push_back(count > 0 ? engine_->owners()[static_cast<size_t>(first)] : 0);
  }
  // NOTE: buckets that finish while a step is begun (backward's hooks) go to its early work.
  if (owned_)
    owned_->attach(
        [this](const std::vector<int>& params) {
          if (engine_->step_open()) owned_->exchange().hand_to(*engine_, first_owned_, params);
        },
        this);
}

EngineRuntime::~EngineRuntime() {
  if (owned_) owned_->detach(this);
}

void EngineRuntime::update_rules(const std::vector<step::GroupRule>& groups) {
  if (groups == rule_source_) return;
  DMUON_CHECK(static_cast<int64_t>(groups.size()) >= num_base_groups_, "EngineRuntime::step: ", groups.size(),
              " Muon groups' rules for group slots up to ", num_base_groups_ - 1);
  std::vector<step::GroupRule> rules(groups.begin(), groups.begin() + num_base_groups_);
  for (const step::GroupRule& rule : rules) rule.validate();
  rules_ = std::move(rules);
  rule_source_ = groups;
}

step::StepOutcome EngineRuntime::step(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
                                      const std::vector<at::Tensor>& momentum,
                                      const std::vector<step::GroupRule>& groups, int64_t step_idx,
                                      const std::vector<std::string>& extra_names,
                                      const std::vector<at::Tensor>& extra_grads,
                                      const std::vector<at::Tensor>& row_state, bool defer_result_agreement,
                                      const step::StartChecks& checks) {
  // NOTE: host ranges for torch.profiler (`bench e2e --profile` sums them): what the begun
  // step adds to step() before the engine's own work.
  {
    RECORD_FUNCTION("dmuon.step.handover_drain", std::vector<c10::IValue>());
    finish_handovers();
  }
  writes_began_ = false;
  const step::ItemTable& table = engine_->items();
  const size_t n = static_cast<size_t>(table.num_params());
  DMUON_CHECK(params.size() == n && grads.size() == n && momentum.size() == n, "EngineRuntime::step: ",
              params.size(), " parameters, ", grads.size(), " gradients and ", momentum.size(),
              " momentum buffers for ", n, " Muon parameters");
  DMUON_CHECK(extra_names.size() == extra_grads.size(), "EngineRuntime::step: ", extra_names.size(), " names for ",
              extra_grads.size(), " checked gradients");
  // NOTE: options, tensors that do not fit: this rank's failed checks, agreed like the
  // caller's (raised here, they would leave the other ranks waiting in the agreement).
  step::StartChecks mine = checks;
  if (!handover_error_.empty())
    mine.error = "the step begun from backward failed: " + std::exchange(handover_error_, std::string());
  try {
    update_rules(groups);
  } catch (const std::exception& error) {
    if (mine.error.empty()) mine.error = error.what();
  }
  // NOTE: the owned matrices' window closes with the step, whatever its outcome, once the
  // caller's stream has waited for the ops' (the scope below ends first). Its buckets are
  // finished below, before anything can fail; a failed collective has broken the world.
  struct CloseWindow {
    OwnedExchange* owned;
    int64_t step_idx;
    ~CloseWindow() {
      try {
        if (owned) owned->end_window(step_idx);
      } catch (...) {
      }
    }
  } close_window{owned_.get(), step_idx};
  OpsStreamScope scope(*ops_);
  const at::Device device = torch_device(ops_->device());
  // The owned matrices: every bucket reduced (and handed to the begun step's early work).
  if (owned_) {
    owned_->exchange().record("finish", -1);
    owned_->exchange().issue_rest();
    owned_->progress(true);
  }

  // Tensors → descriptors. NOTE: gradients are only read: a copy in the parameter's dtype
  // and layout where they differ; parameters and buffers are written in place (through a
  // contiguous copy, written back, where they are not contiguous).
  std::vector<at::Tensor> keep;
  std::vector<std::pair<at::Tensor, at::Tensor>> write_back;
  std::vector<step::ParamTensors> tensors(n);
  std::vector<step::CheckOnly> extra;
  try {
    for (size_t i = 0; i < n; ++i) {
      const std::string& name = table.param(static_cast<int>(i)).name;
      const at::Tensor& p = params[i];
      if (static_cast<int>(i) >= first_owned_) {
        // An owned matrix: its owner steps it from the exchange's reduced gradient.
        const int k = static_cast<int>(i) - first_owned_;
        tensors[i].has_grad = owned_->exchange().contributed(k);
        if (owned_->owners()[static_cast<size_t>(k)] != rank()) continue;
        tensors[i].param = to_buffer(p, "parameter '" + name + "'");
        if (!tensors[i].has_grad) continue;
        tensors[i].grad = owned_->exchange().reduced_grad(k);
        tensors[i].momentum = to_buffer(momentum[i], "the momentum buffer of parameter '" + name + "'");
        continue;
      }
      tensors[i].param = to_buffer(writable(p, write_back), "parameter '" + name + "'");
      if (!grads[i].defined()) continue;
      keep.push_back(grads[i].to(device, dtypes_[i]).contiguous());
      tensors[i].grad = to_buffer(keep.back(), "the gradient of parameter '" + name + "'");
      tensors[i].momentum = to_buffer(writable(momentum[i], write_back), "the momentum buffer of parameter '" + name + "'");
      tensors[i].has_grad = true;
      // NOTE: NorMuon's v (float32, one per local row) is written in place.
      if (i < row_state.size() && row_state[i].defined())
        tensors[i].row_state = to_buffer(writable(row_state[i], write_back), "the NorMuon state of parameter '" + name + "'");
    }
    for (size_t k = 0; k < extra_grads.size(); ++k) {
      // NOTE: an undefined tensor: no gradient on this rank (agreed like a Muon parameter's).
      if (!extra_grads[k].defined()) {
        extra.push_back({extra_names[k], step::Buffer{nullptr, step::DType::kFloat32, 0, ops_->device()}, false});
        continue;
      }
      at::Tensor g = extra_grads[k].to(device).contiguous();
      if (g.scalar_type() != at::kFloat && g.scalar_type() != at::kDouble && g.scalar_type() != at::kBFloat16 &&
          g.scalar_type() != at::kHalf)
        g = g.to(at::kFloat);
      keep.push_back(g);
      extra.push_back({extra_names[k], to_buffer(g, "the gradient of '" + extra_names[k] + "'")});
    }
  } catch (const std::exception& error) {
    if (mine.error.empty()) mine.error = error.what();
    extra.resize(extra_names.size());
    for (size_t k = 0; k < extra.size(); ++k) extra[k].name = extra_names[k];
  }
  for (const auto& [_, copy] : write_back) keep.push_back(copy);
  // NOTE: the stats are recorded once the step's results are agreed (its device-timed
  // phases are read then).
  auto finish = [&] {
    writes_began_ = engine_->writes_began();
    for (auto& [target, copy] : write_back) target.copy_(copy);
    forget_handovers();
    if (!engine_->results_pending()) record_stats();
  };
  step::StepOutcome outcome;
  try {
    outcome = engine_->step(tensors, rules_, step_idx, extra, !defer_result_agreement, mine);
  } catch (...) {
    finish();
    throw;
  }
  // NOTE: before finish(): a step whose results are not deferred records its stats there,
  // and they name the matrices of this step's active parameters, not the last step's.
  last_active_ = outcome.active;
  finish();
  return outcome;
}

std::vector<int64_t> EngineRuntime::agree_results(const std::vector<int64_t>& extra_max) {
  if (!engine_->results_pending()) return extra_max;
  struct Record {
    EngineRuntime& runtime;
    ~Record() {
      runtime.writes_began_ = runtime.engine_->writes_began();
      runtime.record_stats();
    }
  } record{*this};
  return engine_->agree_committed(extra_max);
}

void EngineRuntime::begin_step(const std::vector<step::GroupRule>& groups, int64_t step_idx) {
  finish_handovers();
  handover_error_.clear();  // NOTE: the step it belonged to was discarded
  writes_began_ = false;
  update_rules(groups);
  forget_handovers();
  engine_->begin_step(rules_, step_idx);
}

void EngineRuntime::params_ready(const std::vector<int64_t>& ready, at::TensorList params,
                                 const std::vector<at::Tensor>& grads, const std::vector<at::Tensor>& momentum) {
  DMUON_CHECK(!owned_, "EngineRuntime::params_ready: the weight-ownership mode hands its matrices over itself");
  const step::ItemTable& table = engine_->items();
  const size_t n = static_cast<size_t>(table.num_params());
  DMUON_CHECK(params.size() == ready.size() && grads.size() == ready.size() && momentum.size() == ready.size(),
              "EngineRuntime::params_ready: ", params.size(), " parameters, ", grads.size(), " gradients and ",
              momentum.size(), " momentum buffers for ", ready.size(), " ready parameter indices");
  // NOTE: the indices and presence are checked here, so a refused call changes nothing; the
  // tensors' dtype, size and device by the engine's items_ready on the worker, whose error
  // step() raises on every rank (one listed twice is named there too).
  for (size_t j = 0; j < ready.size(); ++j) {
    const int64_t i = ready[j];
    DMUON_CHECK(i >= 0 && static_cast<size_t>(i) < n, "EngineRuntime::params_ready: parameter index ", i,
                " outside [0, ", n, ")");
    DMUON_CHECK(grads[j].defined() && momentum[j].defined(), "EngineRuntime::params_ready: parameter '",
                table.param(static_cast<int>(i)).name, "' has no gradient or no momentum buffer");
  }
  std::vector<Handover> handed;
  for (size_t j = 0; j < ready.size(); ++j) handed.push_back({ready[j], params[j], grads[j], momentum[j]});
  // NOTE: the hand-overs are held until they start work (a stage complete, or an item worked
  // on at once): with a stage of a matrix per rank most FSDP2 groups complete none.
  handovers_.post(with_this_threads_state(ops_->device(), ops_stream_, [this, handed = std::move(handed)] {
    held_.insert(held_.end(), handed.begin(), handed.end());
    if (engine_->items_start_work(held_items())) give_held();
  }));
}

void EngineRuntime::finish_handovers() {
  try {
    handovers_.drain();
  } catch (const std::exception& error) {
    handover_error_ = error.what();
    drop_begun();
  }
}

void EngineRuntime::drop_begun() {
  // NOTE: the caller's stream waits for the ops' before the gradients they read are let go.
  OpsStreamScope scope(*ops_);
  engine_->discard();
  forget_handovers();
}

std::vector<int> EngineRuntime::held_items() const {
  std::vector<int> items;
  for (const Handover& h : held_) {
    const auto [first, count] = engine_->items().items_of(static_cast<int>(h.index));
    for (int item = first; item < first + count; ++item) items.push_back(item);
  }
  return items;
}

void EngineRuntime::give_held() {
  RECORD_FUNCTION("dmuon.backward_step.engine", std::vector<c10::IValue>());
  OpsStreamScope scope(*ops_);
  const step::ItemTable& table = engine_->items();
  const at::Device device = torch_device(ops_->device());
  std::vector<step::ParamTensors> tensors(static_cast<size_t>(table.num_params()));
  // NOTE: taken out first: a refused hand-over (items_ready throws) leaves none held.
  const std::vector<int> items = held_items();
  std::vector<Handover> held = std::move(held_);
  held_.clear();
  for (const Handover& h : held) {
    const size_t k = static_cast<size_t>(h.index);
    const std::string& name = table.param(static_cast<int>(h.index)).name;
    early_keep_.insert(early_keep_.end(), {h.param, h.momentum, h.grad.to(device, dtypes_[k]).contiguous()});
    tensors[k].param = to_buffer(h.param, "parameter '" + name + "'");
    tensors[k].grad = to_buffer(early_keep_.back(), "the gradient of parameter '" + name + "'");
    // NOTE: the engine writes the momentum buffer itself at commit: a copy would be lost.
    tensors[k].momentum = to_buffer(h.momentum, "the momentum buffer of parameter '" + name + "'");
    tensors[k].has_grad = true;
  }
  // NOTE: watched: a clip between backward and step() scales the gradients in place; the
  // engine compares their bits at step() and the begun work is redone where they changed.
  // Measured on torch 2.11: clip_grad_norm_ on FSDP2's DTensor gradients moves neither
  // version counter, so the values themselves are compared.
  engine_->items_ready(items, tensors, /*watch=*/true);
}

void EngineRuntime::forget_handovers() {
  early_keep_.clear();
  held_.clear();
}

void EngineRuntime::discard() {
  finish_handovers();
  handover_error_.clear();
  drop_begun();
}

std::vector<int> EngineRuntime::item_params() const {
  std::vector<int> out;
  for (const step::Item& it : engine_->items().items()) out.push_back(it.param_idx);
  return out;
}

std::vector<std::vector<int>> EngineRuntime::stage_items() const {
  std::vector<std::vector<int>> out;
  for (const step::Stage& stage : engine_->stages()) {
    std::vector<int> items;
    for (const step::NsBatch& batch : stage.batches) items.insert(items.end(), batch.items.begin(), batch.items.end());
    out.push_back(std::move(items));
  }
  return out;
}

void EngineRuntime::record_stats() {
  stats_ = step::runtime_stats(*engine_, transport_->rank(), transport_->world_size(), ops_->device().kind, last_active_,
                               options_.record_timeline);
}

sim::StageLayout EngineRuntime::stage_layout() const {
  sim::StageLayout layout = step::stage_layout(engine_->items(), engine_->stages(), engine_->options().mode,
                                               step::dtype_size(engine_->wire_dtype()), last_active_);
  layout.agreement_bytes = engine_->last_stats().agreement_bytes;
  return layout;
}

}  // namespace dmuon::torch_adapter

// dmuon/torch/engine/engine_runtime.h — the torch adapter of the step engine: c10d behind
// step::Transport (C10dTransport), c10's allocators behind the device ops, torch tensors
// turned into descriptors every step, and the engine's statistics as the runtime's
// RuntimeStats (step/runtime_options.h) that the benches and tests read. DMuon's one step runtime,
// in every mode: the weight-ownership mode's owned matrices are its parameters too ("whole
// on rank owner", after the others), their gradients reduced by its OwnedExchange.
//
// One runtime per set of Muon parameters (names, layouts, dtypes and group slots identical
// on every rank); made collectively (the plan is made and agreed when it is made). A step
// waits for two collectives: the start agreement (with the caller's checks,
// step::StartChecks: a rank whose checks failed, or whose structure differs, refuses the
// step on every rank) and the result agreement (agree_results, with the caller's maxima).
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "layout/shard_layout.h"
#include "engine/c10d_transport.h"
#include "engine/owned_exchange.h"
#include "sim/stage_layout.h"
#include "step/engine.h"
#include "step/serial_worker.h"
#include "step/runtime_options.h"

namespace dmuon::torch_adapter {

class EngineRuntime {
 public:
  /// group_name: a c10d group's name, or "" for one process. dtypes: "float32" |
  /// "bfloat16" | "float16" | "float64" per parameter; group_slot: its Muon group's index
  /// into step()'s `groups`. device: "cpu" or "cuda" (the current CUDA device).
  /// `owned` (may be null): the weight-ownership mode's parameters, stepped after these
  /// (their Muon groups' slots in owned_group_slot); group_name must then be its world group.
  EngineRuntime(const std::string& group_name, std::vector<std::string> names, std::vector<layout::ParamLayout> layouts,
                const std::vector<std::string>& dtypes, std::vector<int64_t> group_slot, step::RuntimeOptions options,
                std::shared_ptr<OwnedExchange> owned = nullptr, std::vector<int64_t> owned_group_slot = {});
  ~EngineRuntime();
  EngineRuntime(const EngineRuntime&) = delete;
  EngineRuntime& operator=(const EngineRuntime&) = delete;

  /// The start agreement alone, before a runtime is made (collective over `group_name`):
  /// throws as a step does when `checks` fail on some rank (a runtime made again on some
  /// ranks only then meets the others' step in the same collective).
  static void agree_start(const std::string& group_name, step::DeviceKind device, const step::StartChecks& checks,
                          int64_t step_idx);

  /// One step: params[i], grads[i] (undefined: no gradient this step), momentum[i] (the
  /// optimizer state's buffer, zeros the caller has not stored yet on a first step) of the
  /// local rows; `extra` gradients (AdamW's; undefined: none on this rank) are checked with
  /// the step and agreed with it (a gradient on some ranks only is an error naming it).
  /// Owned parameters (the last ones): their masters (undefined where not the owner), grads
  /// undefined (the exchange's reduced ones), the owner's momentum buffers.
  /// Throws dmuon::Error on every rank when the ranks disagree on which parameters have
  /// gradients, a momentum buffer holds NaN/Inf or an input is invalid (nothing changed),
  /// and after the rest was applied when an orthogonalized update was not finite.
  step::StepOutcome step(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
                         const std::vector<at::Tensor>& momentum, const std::vector<step::GroupRule>& groups,
                         int64_t step_idx, const std::vector<std::string>& extra_names,
                         const std::vector<at::Tensor>& extra_grads,
                         const std::vector<at::Tensor>& row_state = {}, bool defer_result_agreement = false,
                         const step::StartChecks& checks = {});
  /// With several ranks and `defer_result_agreement`, an applied step returns before its
  /// result agreement (step::StepEngine::commit(false)): the caller enqueues its own work
  /// (DMuon: the AdamW part) while the device finishes the step, then calls this on every
  /// rank. Throws as step() does. `extra_max` (e.g. QK-clip's maxima as ordered integers)
  /// ride in the same all_reduce and come back agreed (max over the ranks); as given when
  /// nothing is pending or with one rank.
  std::vector<int64_t> agree_results(const std::vector<int64_t>& extra_max = {});

  // ---- The step begun inside backward (docs/design/step_engine.md, "Early work").
  /// Opens a step whose parameters may be made ready before step() (which completes it).
  void begin_step(const std::vector<step::GroupRule>& groups, int64_t step_idx);
  /// The matrices of parameters `ready` (indices) are final on this rank: their stages'
  /// forward exchanges leave as soon as complete, in stage order. params/grads/momentum:
  /// those of ready[k] at k (local tensors, as step()'s); the gradient and momentum tensors
  /// must stay alive and unchanged until step() or discard(); momentum buffers must be
  /// contiguous. NOTE: only the ready parameters cross from Python: one call per FSDP2
  /// group inside backward, where every tensor converted is host time backward waits for.
  /// The hand-overs are held until they start work (step::StepEngine::items_start_work);
  /// the engine's calls run on the runtime's worker thread, in the order handed over. An
  /// error there discards the begun step, and step() raises it on every rank through its
  /// start agreement; discard() or begin_step() drops it. At step(), a gradient changed in
  /// place since its hand-over makes every rank drop the begun work (the engine compares its
  /// bits: step::StepEngine::items_ready's `watch`).
  void params_ready(const std::vector<int64_t>& ready, at::TensorList params, const std::vector<at::Tensor>& grads,
                    const std::vector<at::Tensor>& momentum);
  /// Closes a begun step with nothing written.
  void discard();
  /// NOTE: read without waiting for the worker: its calls (items_start_work, items_ready)
  /// never open or close the engine's step.
  bool step_open() const { return engine_->step_open(); }
  /// Whether the last step()'s (or agree_results()') writes on this rank began and its
  /// result agreement did not complete (step::StepEngine::writes_began): read after either
  /// threw, true means momentum and parameters may be torn; false, nothing was written or
  /// every rank agreed on the step's outcome.
  bool writes_began() const { return writes_began_; }

  int rank() const { return transport_->rank(); }
  int world_size() const { return transport_->world_size(); }
  const layout::WorldModel& world_model() const { return transport_->world_model(); }
  const step::RuntimeOptions& options() const { return options_; }
  /// The engine's options as resolved when the runtime was made (options, else DMUON_*).
  const step::EngineOptions& engine_options() const { return engine_->options(); }
  int64_t pipeline_depth() const { return engine_->pipeline_depth(); }
  /// Per parameter: the owner of its first matrix (−1 in gather mode).
  const std::vector<int>& owners() const { return param_owners_; }
  /// Per matrix (item): its owner.
  const std::vector<int>& item_owners() const { return engine_->owners(); }
  /// Per item: its parameter.
  std::vector<int> item_params() const;
  const std::string& plan_text() const { return engine_->plan_text(); }
  double predicted_makespan_s() const { return engine_->predicted_makespan_s(); }
  /// step::StepEngine::backward_stage_note (empty: the step begun from backward starts
  /// most of its work inside backward).
  const std::string& backward_stage_note() const { return engine_->backward_stage_note(); }
  /// The planner's predicted NS seconds of every rank (a solved plan; else empty).
  const std::vector<double>& predicted_rank_seconds() const { return engine_->predicted_rank_seconds(); }
  /// The NS times the plan was made with (RuntimeOptions::cost_model; empty: analytic).
  const plan::CostTable& measured_costs() const { return engine_->measured_costs(); }
  /// The items (matrices) of each stage of the last step, in NS-batch order.
  std::vector<std::vector<int>> stage_items() const;
  size_t num_stages() const { return engine_->stages().size(); }
  const step::RuntimeStats& last_stats() const { return stats_; }
  /// The last step's stages on this rank: phases and bytes per peer (dmuon._C.dist.StageStats).
  const std::vector<step::StageTimeline>& stage_stats() const { return engine_->last_stats().stages; }
  /// The last step's stages on every rank for the projection (step/stage_layout.h):
  /// each stage's bytes per peer of its forward and return exchange, each rank's work.
  sim::StageLayout stage_layout() const;

 private:
  void update_rules(const std::vector<step::GroupRule>& groups);
  /// Waits for the worker's calls; after an error there, discards the begun step and keeps
  /// the error for step() (handover_error_).
  void finish_handovers();
  /// Closes the begun step and lets its hand-overs go, once the caller's stream waited for the ops'.
  void drop_begun();
  void record_stats();

  step::RuntimeOptions options_;
  std::vector<layout::ParamLayout> layouts_;
  std::vector<at::ScalarType> dtypes_;
  std::unique_ptr<C10dTransport> transport_;
  std::shared_ptr<OwnedExchange> owned_;
  int first_owned_ = 0;  // the engine's index of the first owned parameter
  std::shared_ptr<step::DeviceOps> ops_;
  std::optional<c10::Stream> ops_stream_;  // the ops' own stream (GPU, step begun from backward)
  std::unique_ptr<step::StepEngine> engine_;
  std::vector<int> param_owners_;
  // num_base_groups_: the slots of the Muon groups (a transposed matrix takes its lr ratio
  // from the engine, which knows the model shape).
  int64_t num_base_groups_ = 0;
  // NOTE: the NS schedule of a group is built when the group's options change, not every step.
  std::vector<step::GroupRule> rule_source_;
  std::vector<step::GroupRule> rules_;
  std::vector<bool> last_active_;
  // The begun step's hand-overs held (not given to the engine yet), and the tensors the
  // engine reads or writes from those given, kept until step()/discard() (gradients as
  // converted for it).
  struct Handover {
    int64_t index;
    at::Tensor param, grad, momentum;
  };
  void give_held();
  void forget_handovers();
  std::vector<int> held_items() const;  // the items of the held hand-overs
  std::vector<Handover> held_;
  std::vector<at::Tensor> early_keep_;
  bool writes_began_ = false;  // the engine's, as the last step() or agree_results() left it
  step::RuntimeStats stats_;
  // NOTE: the begun step's engine calls run here, off backward's thread: measured on one H100
  // (Qwen2.5-1.5B, fake world 8), the hooks' host time per step fell from 10.7 to 2.9 ms.
  // Last member: joined before the engine it drives goes.
  std::string handover_error_;
  step::SerialWorker handovers_;
};

}  // namespace dmuon::torch_adapter

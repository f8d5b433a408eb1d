// dmuon/step/engine.h — StepEngine: the one Muon step pipeline over a transport and a
// device's ops (docs/design/step_engine.md).
//
//   plan      made once, when the engine is made (collective): the planning problem of
//             the items, solved on rank 0 and broadcast, or solved on every rank where
//             the solver is deterministic or the transport moves no data; agreed by hash
//   check     NaN/Inf flags of every local gradient and momentum buffer (reads only)
//   agree     several ranks: the start agreement (step/start_agreement.h: one all_reduce
//             of a fixed size: the caller's checks, which gradients exist, NaN/Inf), on
//             the host, before any exchange; one rank: a device-side gate, no host wait
//   stages    pipelined: forwards `depth` stages ahead, returns applied `depth` behind;
//             each stage executes its exchange plan (exchange_plan.h: counts, offsets and
//             pieces, made once per set of items with gradients, never per step)
//     prepare   momentum in place, U of pieces into the stage's send buffer
//     forward   all_to_all to the ranks that compute each item
//     iterate   (owner) norm and cast of the received pieces, or of a whole local item
//     ns        batched Newton–Schulz of each NS batch (streams, graphs: the ops')
//     return    result rows back to the ranks that hold them; own rows applied at once
//     apply     p ← p·(1 − lr·wd) − lr·ratio·O from the returned rows
//   agree     one reduction of the result flags; every rank raises naming the first
//             parameter whose orthogonalized update was not finite
//
// Work begun before step() (docs/design/step_engine.md, "Early work"): begin_step() opens
// a step; items_ready(ids) runs the check, momentum (into staging, not the buffer) and NS
// of items whose gradients are final, batched by shape, and holds the results; step() (or
// finish() + commit()) checks the rest, agrees, and only then writes momentum and weights;
// a refused step, or discard(), drops the early results with nothing written.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "plan/cost_model.h"
#include "step/device_ops.h"
#include "step/exchange_plan.h"
#include "step/items.h"
#include "step/options.h"
#include "step/phase_clock.h"
#include "step/stages.h"
#include "step/start_agreement.h"
#include "step/stats.h"
#include "step/transport.h"

namespace dmuon::step {

/// One parameter's local memory on this rank: [local rows, cols], row-major, contiguous,
/// of the parameter's dtype on the ops' device.
struct ParamTensors {
  Buffer param, grad, momentum;
  bool has_grad = false;  ///< false: no gradient this step (grad and momentum unused)
  /// NorMuon's second moment v (groups with normuon only, else empty): float32, one entry
  /// per local row of every local matrix ([local matrices · local rows], the momentum's
  /// rows), on the ops' device.
  Buffer row_state;
};

/// A gradient the step only checks (e.g. an AdamW parameter's, same device): NaN/Inf in it
/// refuses the whole step as a Muon gradient's would, in the same pass and agreement (the
/// one-process step keeps its single host wait).
struct CheckOnly {
  std::string name;
  Buffer grad;
  /// Whether it has a gradient this step (`grad` may still be empty: an empty shard).
  /// Several ranks agree on it as on a Muon parameter's: on some ranks only is an error.
  bool has_grad = true;
};

/// What a step did (the caller raises or skips from it; errors are thrown instead).
struct StepOutcome {
  enum class Status {
    kApplied,            ///< every parameter with a gradient was updated
    kNonFiniteGradient,  ///< a gradient held NaN/Inf on some rank: nothing changed anywhere
    kAgreed,             ///< finish(): every rank agreed; commit() writes the step
    kCorruptMomentum,    ///< finish(): a momentum buffer held NaN/Inf on some rank: nothing changed
  };
  Status status = Status::kApplied;
  std::vector<int> nonfinite_params;  ///< agreed over every rank, ascending
  std::vector<int> nonfinite_extra;   ///< indices into the step's CheckOnly list, ascending
  std::vector<int> corrupt_params;    ///< kCorruptMomentum: agreed over every rank, ascending
  std::string message;                ///< names the first of them and the step
  std::vector<bool> active;           ///< parameters that had a gradient (on every rank)
  bool applied() const { return status == Status::kApplied; }
};

/// The owners of parameters that each live whole on one rank (the weight-ownership mode).
struct OwnerPlan {
  std::vector<int> owners;  ///< [parameter] its rank
  std::string text;         ///< the plan as solved (serialized)
  double makespan_s = 0.0;  ///< the planner's predicted slowest rank's NS seconds
};

/// Plans an owner for every parameter of `params` (each a unit: all its matrices on one
/// rank; their layouts unsharded) as the engine plans its items, by the one driver of
/// engine_plan.cpp (options.solver, .milp, .plan_locally; the analytic cost of `device`:
/// nothing of theirs runs yet to be timed); with spread_layers, each layer's same-shape matrices land on
/// different owners (layer_of[i]: the layer of parameter i, −1 none; plan/layer_spread.h).
/// Collective over `transport`: every rank holds the same plan (agreed by its fingerprint)
/// or throws naming why. Called before any engine exists; the engine then takes the
/// owners as ParamSpec::whole_on_rank.
OwnerPlan plan_whole_owners(Transport& transport, const std::vector<ParamSpec>& params, const std::vector<int>& layer_of,
                            const EngineOptions& options, DeviceKind device, int64_t wire_element_bytes,
                            bool spread_layers);

class StepEngine {
 public:
  /// Collective: every rank makes it with the same params and options (the plan is made
  /// and agreed here: owners given by ParamSpec::whole_on_rank where set, solved for the
  /// rest). The transport and ops outlive the engine.
  StepEngine(Transport& transport, DeviceOps& ops, std::vector<ParamSpec> params, EngineOptions options);
  ~StepEngine();

  /// One step over every parameter (tensors[i] for params[i]); rules[g] is group g's rule.
  /// Throws dmuon::Error on every rank, with nothing changed, when a parameter has a
  /// gradient on some ranks only, a momentum buffer holds NaN/Inf, or a rank's input is
  /// invalid; and, after the rest of the step was applied, when an orthogonalized update
  /// was not finite.
  /// `extra`: gradients checked with the step's (every rank passes the same list).
  /// `agree_results`: false (several ranks) leaves an applied step's result agreement to
  /// agree_committed() (commit(false)); one process always agrees at once.
  /// `checks`: the caller's, agreed with the engine's in the start agreement.
  StepOutcome step(const std::vector<ParamTensors>& tensors, const std::vector<GroupRule>& rules, int64_t step_idx,
                   const std::vector<CheckOnly>& extra = {}, bool agree_results = true,
                   const StartChecks& checks = {});

  // ---- Early work and the two-phase step (the weight-ownership mode's local items; the
  // sharded step begun inside backward: stages of items that travel).
  /// Opens a step whose items may be made ready before step(): `rules` give their momentum
  /// and NS (step_idx names it in errors until finish() names it); throws when a step is
  /// already open.
  void begin_step(const std::vector<GroupRule>& rules, int64_t step_idx);
  /// Items (ids into items()) whose gradient and momentum on this rank are final: their
  /// check, momentum (into a staging copy; the buffer is not written) and Newton–Schulz
  /// run now, batched with the same-shape items of this call; the results are held until
  /// the step is committed. Items this rank neither computes nor holds need no work.
  /// Items that travel (sharded, replicated) are marked: each stage whose items are all
  /// marked issues its forward exchange, in stage order, and its NS runs when the next
  /// stage is issued (or in finish()); returns and apply wait for commit(). Every rank must
  /// mark the same items before finish() (the collectives' order).
  /// `tensors` as step()'s; only the grad and momentum of these items are read, and they
  /// must stay alive until the step is committed or discarded, and unchanged unless
  /// `watch`: then the caller may still change these gradients in place before finish()
  /// (a clip that scales them): their bits are fingerprinted now (step/fingerprint.h) and
  /// finish() compares its own tensors' (one read pass each side); where they differ on a
  /// rank, its begun work is stale (as StartChecks::changed). Throws naming a bad id or an
  /// id made ready twice.
  void items_ready(const std::vector<int>& items, const std::vector<ParamTensors>& tensors, bool watch = false);
  /// Whether items_ready(items) would start work now: one of them is worked on at once
  /// (whole on this rank, which computes it), or with the items marked so far they complete
  /// the next stage to issue. True where no step is begun or an id is bad (items_ready then
  /// throws naming it). A caller may hold its hand-overs until this says so.
  bool items_start_work(const std::vector<int>& items) const;
  /// Whether a step is open (begun, or finished and not yet committed or discarded).
  bool step_open() const { return early_ != nullptr || agreed_ != nullptr; }
  /// The rest of the step's check, then the agreement over every rank (several ranks, or
  /// one: a host read). Nothing is written: kAgreed (then commit() or discard()), or
  /// kNonFiniteGradient or kCorruptMomentum (the step is closed, early results dropped);
  /// throws, with the step closed, where step() throws before writing (a gradient on some
  /// ranks only, invalid input). `step_idx` names the step, early work included.
  /// `tensors` must stay alive until commit(). Momentum and NS of early items follow
  /// begin_step()'s rules; lr and weight decay, finish()'s. `checks` join the start
  /// agreement; where some rank's checks.changed, every rank drops its work begun early and
  /// the whole step runs from `tensors` (this rank checks them all again if it changed).
  StepOutcome finish(const std::vector<ParamTensors>& tensors, const std::vector<GroupRule>& rules, int64_t step_idx,
                     const std::vector<CheckOnly>& extra = {}, const StartChecks& checks = {});
  /// Writes the agreed step: the early items' staged momentum and held results, the rest
  /// through the pipeline; then the result agreement (throws naming the first parameter
  /// whose orthogonalized update was not finite, after the rest was applied).
  /// `agree`: false leaves the result agreement (the host read of the result flags, and
  /// the ranks' all_reduce of them) to agree_committed(), so that the caller can enqueue its
  /// own work while the device finishes this step's. NOTE: every rank must then call
  /// agree_committed() before any other call of the engine (its all_reduce is collective).
  void commit(bool agree = true);
  /// The result agreement of the step commit(false) wrote; throws as commit() does.
  /// `extra_max`: the caller's values agreed with it (max over the ranks; e.g. QK-clip's
  /// logit maxima as ordered integers), returned agreed.
  std::vector<int64_t> agree_committed(const std::vector<int64_t>& extra_max = {});
  /// Whether a step was committed without its result agreement.
  bool results_pending() const { return committed_ != nullptr; }
  /// Whether this rank's writes of the current step began: set when the first momentum,
  /// parameter or state write is enqueued (commit(), or the one-process step's gated
  /// pipeline), cleared when a step opens, when its result agreement completes, and when
  /// the one-process step's gate closed (nothing was written). A step that throws while it
  /// is set may have left momentum and parameters torn (docs/design/step_engine.md,
  /// "A step that fails").
  bool writes_began() const { return writes_began_; }
  /// Closes the open step without writing anything (early results dropped).
  void discard();

  const ItemTable& items() const { return table_; }
  /// Owner rank of every item (kEveryRank in gather mode).
  const std::vector<int>& owners() const { return owners_; }
  const std::string& plan_text() const { return plan_text_; }
  /// Fingerprint of the plan (problem, owners, batches), agreed by every rank.
  uint64_t plan_hash() const { return plan_hash_; }
  double predicted_makespan_s() const { return predicted_makespan_s_; }
  /// Where a step begun from backward can start at most half its work before backward
  /// ends (its last stage, which leaves only then, holds more than half the wire bytes of
  /// the planned items): a sentence saying so; empty otherwise.
  const std::string& backward_stage_note() const { return backward_stage_note_; }
  /// The planner's predicted NS seconds of every rank (a solved plan; else empty).
  const std::vector<double>& predicted_rank_seconds() const { return predicted_rank_s_; }
  /// The NS times the plan was made with (EngineOptions::cost; empty: the analytic model).
  const plan::CostTable& measured_costs() const { return measured_costs_; }
  const EngineOptions& options() const { return options_; }
  int pipeline_depth() const { return depth_; }
  DType wire_dtype() const { return wire_dtype_; }
  /// The stages of the last step (empty before the first).
  const std::vector<Stage>& stages() const { return stages_; }
  /// The exchange plan the last step's pipeline ran (null before the first): plans are
  /// made with the stages (every item active) and once per distinct set of items the
  /// pipeline runs (the parameters with gradients, less the items made ready early), at
  /// most kMaxExchangePlans kept, the oldest dropped first.
  std::shared_ptr<const ExchangePlan> exchange_plan() const { return last_plan_; }
  static constexpr size_t kMaxExchangePlans = 8;
  const StepStats& last_stats() const { return stats_; }

 private:
  struct StepState;
  struct Flight;
  struct Early;

  void make_plan();
  // Phases of a step: the check of every active item not made ready early (into st.flags),
  // the pipeline, and (one rank) the gated one-shot step.
  static std::unique_ptr<StepState> new_state(int num_items, int num_params, int num_extra);
  void check_rest(StepState& st, const std::vector<CheckOnly>& extra, bool recheck_early = false);
  void run_pipeline(StepState& st);
  void commit_early(StepState& st, Early& early);
  // Early stages (items that travel): issued in stage order once complete, NS and return
  // one stage later or in finish(), landed and applied in commit(); drained by discard().
  void local_items_ready(const std::vector<int>& work, const std::vector<ParamTensors>& tensors);
  // sum += the fingerprint of `items`' gradient pieces on this rank; a fresh sum of the
  // watched items' in `tensors` (empty where one's parameter has no gradient there).
  void add_fingerprint(const std::vector<int>& items, const std::vector<ParamTensors>& tensors, const Buffer& sum);
  OwnedBuffer fingerprint_watched(const std::vector<ParamTensors>& tensors);
  std::vector<Buffer> stage_copies(const std::vector<Buffer>& sources);
  void advance_stages(const std::vector<ParamTensors>& tensors);
  void issue_early_stage(size_t s, const std::vector<ParamTensors>& tensors);
  void run_early_ns(size_t s);
  void finish_early_stages();
  void commit_early_stages(StepState& st, Early& early);
  void drain_early();
  void start_stats();
  // Where clock_ adds a phase's seconds (stats_, the open step's early work).
  void add_phase_seconds(const PhaseTarget& target, double seconds);
  std::vector<int64_t> agree_results(StepState& st, const std::vector<int64_t>& extra_max = {});
  StepOutcome step_gated(const std::vector<ParamTensors>& tensors, const std::vector<GroupRule>& rules,
                         int64_t step_idx, const std::vector<CheckOnly>& extra);
  void make_stages_for(const std::vector<GroupRule>& rules);
  // The exchange plan of the items `active` (exchange_plan.h), from the cache or made now.
  std::shared_ptr<const ExchangePlan> plan_for(const std::vector<bool>& active);
  void validate(const std::vector<ParamTensors>& tensors, const std::vector<GroupRule>& rules,
                const std::vector<CheckOnly>& extra) const;
  void validate_normuon(int param_idx, const ParamTensors& t) const;
  // NorMuon's v around the pipeline (engine_normuon.cpp).
  bool normuon_active(const StepState& st, int item) const;
  bool sole_holder(int item, int rank) const;
  void normuon_gather(StepState& st);
  void normuon_return(StepState& st);
  bool computes(int item, int rank) const;
  double item_scale(const GroupRule& rule, int item) const;
  Flight issue_forward(size_t s, StepState& st);
  Flight run_stage(size_t s, StepState& st, Flight& forward);
  void land(size_t s, StepState& st, Flight& back);
  // One exchange of a stage (the all_to_all when counts.issued) and its bytes per peer.
  // `synthetic_seed` ≠ 0: over a transport that moves nothing, the receive buffer gets
  // synthetic values of that seed (updates an owner orthogonalizes), else zeros.
  void issue_exchange(Flight& f, const Buffer& send, const ExchangeCounts& counts, const std::string& what,
                      std::vector<int64_t>& sent_to, std::vector<int64_t>& received_from, uint64_t synthetic_seed);
  // The outcome of a step refused for the non-finite gradients of `flagged` (indices of
  // the parameters, then num_params + k for extra[k]).
  StepOutcome nonfinite_gradient(const std::vector<int>& flagged, std::vector<bool> active, int64_t step_idx,
                                 const std::vector<CheckOnly>& extra) const;
  std::vector<int> stream_assignment(const std::vector<const NsBatch*>& batches,
                                     const std::vector<GroupRule>& rules);

  Transport& transport_;
  DeviceOps& ops_;
  ItemTable table_;
  EngineOptions options_;
  int rank_ = 0, world_ = 1, depth_ = 1;
  DType wire_dtype_ = DType::kFloat32;
  std::vector<int> owners_;
  std::vector<OwnerBatches> owner_batches_;
  /// [item] → backward window when the step may begin from backward and the plan was solved
  /// (StageLimits::window_of); empty otherwise.
  std::vector<int> stage_windows_;
  std::string backward_stage_note_;
  std::string plan_text_;
  uint64_t plan_hash_ = 0;
  double predicted_makespan_s_ = 0.0;
  std::vector<double> predicted_rank_s_;
  plan::CostTable measured_costs_;
  std::vector<Stage> stages_;
  std::vector<ns::Algorithm> stage_algorithms_;  // the group algorithms stages_ were made for
  // NOTE: a run sees one set of active items (every parameter has a gradient) or a few
  // (frozen parts, the stages left over from early work); a plan holds O(items · world)
  // places, so a handful are kept.
  std::map<std::vector<bool>, std::shared_ptr<const ExchangePlan>> plans_;  // by active items
  std::deque<std::vector<bool>> plan_order_;  // plans_' keys, oldest first
  std::shared_ptr<const ExchangePlan> last_plan_;
  // NOTE: a batch's first runs tune its kernels and capture its graph (timings other
  // streams would disturb); NS batches spread over streams only once every batch of the
  // stage has run before. Key: (group, dtype, rows, cols, count).
  std::set<std::tuple<int, int, int64_t, int64_t, int64_t>> warm_batches_;
  // The streams of a stage's NS batches (stream_assignment) by its batches and their
  // schedules; a handful of stages and sets of active items, cleared when full.
  std::map<std::vector<double>, std::vector<int>> stream_plans_;
  static constexpr size_t kMaxStreamPlans = 64;
  StepStats stats_;
  // NOTE: made after stats_ (its add function writes there and into early_).
  PhaseClock clock_;
  std::unique_ptr<Early> early_;       // the open step's early work (begin_step → commit/discard)
  std::unique_ptr<StepState> agreed_;  // finish() → commit()
  std::unique_ptr<StepState> committed_;  // commit(false) → agree_committed()
  bool writes_began_ = false;
  // Test hook (DMUON_TEST_EXIT=PHASE@STEP): the phase and step at which this process ends.
  std::string test_exit_phase_;
  int64_t test_exit_step_ = -1;
  void exit_if_asked(const char* phase, int64_t step_idx) const;
};

}  // namespace dmuon::step

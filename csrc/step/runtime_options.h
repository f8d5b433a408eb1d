// dmuon/step/runtime_options.h — what a step runtime is made with (RuntimeOptions: the
// engine's options as given and the switches that resolve the rest when the runtime is
// made; Python: dmuon.Execution.runtime_options()) and what it reports of its last step
// (RuntimeStats; Python: runtime.last_stats). Torch-free: the torch adapter's EngineRuntime
// (csrc/torch/engine/engine_runtime.h) holds them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "sim/pipeline.h"
#include "step/options.h"

namespace dmuon::step {

class StepEngine;

/// What the owner planner balances: FLOP counts, the engine's own timings of each group's
/// NS batches (step/cost_profile.h), or timings on CUDA and FLOP counts on the CPU.
enum class CostModel { kAuto, kAnalytic, kProfile };
/// "auto" | "analytic" | "profile"; the error names cost_model.
CostModel parse_cost_model(const std::string& name);
/// "cpu" | "cuda"; the error names device_type.
DeviceKind parse_device_kind(const std::string& name);

/// How the runtime runs; fixed at construction. Typed: Python's strings become these enums
/// once, in the binding (dmuon._C.engine.RuntimeOptions), whose errors name the option.
struct RuntimeOptions {
  /// The engine's own options as given: mode, wire_dtype, stage_bytes (Python:
  /// bucket_bytes), solver, backward_order, plan_locally (plan_source "local": every rank
  /// plans; "auto"/"broadcast": rank 0 plans where the transport moves data) and
  /// cost.schedules ([group slot] each Muon group's schedule, as "profile" times it). The
  /// fields below resolve the rest when the runtime is made (resolve()).
  EngineOptions engine;
  DeviceKind device = DeviceKind::kCpu;  ///< cost model and collective buffers
  bool profile = false;  ///< synchronize the device between phases to time them
  /// Every rank must pass the same.
  CostModel cost_model = CostModel::kAnalytic;
  /// Record each stage's compute phases (RuntimeStats::bucket_times) for the projection:
  /// device time between marks (PhaseTiming::kDevice), or synchronized with `profile`.
  bool record_timeline = false;
  // Code-path switches (Python: dmuon.Execution). Unset: the DMUON_* variable named, read
  // when the runtime is made (common/env.h), else the default.
  std::optional<int64_t> fused_streams;   ///< DMUON_FUSED_STREAMS (default 2): NS streams, 1–8
  std::optional<int64_t> pipeline_depth;  ///< DMUON_PIPELINE_DEPTH (default 0: twice the world size)
  std::optional<int64_t> ns_batch_mb;     ///< DMUON_NS_BATCH_MB (default 2048): one fused batch's workspace
  std::optional<bool> cuda_graphs;        ///< DMUON_CUDA_GRAPHS (default on): NS replayed as CUDA graphs

  /// `engine` with the rest resolved now (the switches, else the DMUON_* variables: read
  /// here); throws dmuon::Error naming the option or variable that is out of range.
  EngineOptions resolve() const;
};

/// Where the time of the last step went (seconds) and what it moved (bytes, this rank).
struct RuntimeStats {
  double momentum_s = 0, pack_s = 0, comm_wait_s = 0, ns_s = 0, apply_s = 0, total_s = 0;
  int64_t bytes_sent = 0, bytes_received = 0, num_buckets = 0 /* stages */, num_orthogonalized = 0;
  int64_t num_fused = 0;  ///< parameters of the one-GPU step (the step engine, one process on CUDA)
  int64_t num_fused_streams = 0;  ///< most CUDA streams its NS batches ran on (DMUON_FUSED_STREAMS)
  /// (matrices, rows, cols) of each NS batch of the one-GPU step, in launch order.
  std::vector<std::tuple<int64_t, int64_t, int64_t>> fused_batches;
  int64_t pipeline_depth = 0;  ///< stages of pipeline slack (DMUON_PIPELINE_DEPTH)
  /// The matrices (items; EngineRuntime.item_params gives their parameters) orthogonalized
  /// on this rank, in order, each once per step.
  std::vector<int64_t> orthogonalized;
  /// RuntimeOptions::record_timeline: device time of each stage's compute phases
  /// (prepare, ns, 0, apply), and of the fake world's model fills (no phase: not real work).
  std::vector<sim::BucketTimes> bucket_times;
  double model_fill_s = 0;
  /// The step begun inside backward: stages exchanged early, the NS seconds and
  /// matrices that ran before step() (inside backward's hooks: early stages' and items whole
  /// on this rank), and the model fills (of model_fill_s) that ran there.
  int64_t early_stages = 0, early_orthogonalized = 0;
  double early_ns_s = 0;
  double early_fill_s = 0;
  bool begun_stale = false;  ///< step::StepStats::begun_stale
};

/// The last step of `engine` on `rank` (its ops on `device`) as the runtime reports it:
/// `active` [param] whether it had a gradient in that step (empty: all); `record_timeline`:
/// RuntimeStats::bucket_times.
RuntimeStats runtime_stats(const StepEngine& engine, int rank, int world_size, DeviceKind device,
                           const std::vector<bool>& active, bool record_timeline);

}  // namespace dmuon::step

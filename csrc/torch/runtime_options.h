// dmuon/torch/runtime_options.h — what the torch adapter's step runtime (EngineRuntime) is
// made with (RuntimeOptions, Python: dmuon.Execution's runtime options) and what it reports
// of its last step (StepStats, Python: runtime.last_stats).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "ns/schedule.h"
#include "sim/pipeline.h"

namespace dmuon::torch_adapter {

/// How the runtime runs; fixed at construction.
struct RuntimeOptions {
  std::string mode = "owner";       ///< "owner" | "gather"
  int64_t bucket_bytes = 64 << 20;  ///< wire bytes of one pipeline stage (EngineOptions::stage_bytes; ≤ 0: one stage)
  std::string wire_dtype = "auto";  ///< "auto" (fp32 on CPU, bf16 on CUDA) | float32 | bfloat16 | float16
  std::string solver = "milp";      ///< owner planner: "milp" | "lpt" | "round_robin"
  std::string device_type = "cpu";  ///< "cpu" | "cuda": cost model and collective buffers
  bool profile = false;             ///< synchronize the device between phases to time them
  /// What the owner planner balances: "analytic" (FLOP counts), "profile" (the engine times
  /// each group's NS batches on its ops, step/cost_profile.h) or "auto" (profile on CUDA).
  /// Every rank must pass the same.
  std::string cost_model = "analytic";
  /// [group slot] the schedule of each Muon group, as "profile" times it.
  std::vector<ns::Schedule> cost_schedules;
  /// CUDA streams the step engine's NS batches may spread over (1–8; 0: DMUON_FUSED_STREAMS,
  /// default 2).
  int64_t fused_streams = 0;
  /// Where the plan comes from: "auto" (a fake world: "local", else "broadcast") |
  /// "broadcast" (rank 0 solves, the others receive it) | "local" (every rank solves it
  /// deterministically). Either way the ranks agree on its fingerprint.
  std::string plan_source = "auto";
  /// Record each stage's compute phases (StepStats::bucket_times) for the projection: device
  /// time between marks (step::PhaseTiming::kDevice), or synchronized with `profile`.
  bool record_timeline = false;
  // Code-path switches (Python: dmuon.Execution). Unset: the DMUON_* variable named, read
  // when the runtime is made (common/env.h), else the default.
  std::optional<int64_t> pipeline_depth;  ///< DMUON_PIPELINE_DEPTH (default 0: twice the world size)
  std::optional<int64_t> ns_batch_mb;     ///< DMUON_NS_BATCH_MB (default 2048): one fused batch's workspace
  std::optional<bool> cuda_graphs;        ///< DMUON_CUDA_GRAPHS (default on): NS replayed as CUDA graphs
  /// Stages in backward order, for a step begun inside backward (EngineOptions::backward_order).
  bool backward_order = false;
};

/// Where the time of the last step went (seconds) and what it moved (bytes, this rank).
struct StepStats {
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
};

}  // namespace dmuon::torch_adapter

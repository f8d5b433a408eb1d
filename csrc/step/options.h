// dmuon/step/options.h — typed options of the step engine: the math of one param group
// (GroupRule, with its Newton–Schulz schedule built once) and how the engine runs
// (EngineOptions). Strings are parsed once, at the boundary (parse_*, here; the Python
// bindings: csrc/python/runtime_bindings.cpp), with errors that name the option.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ns/schedule.h"
#include "optim/normuon.h"
#include "optim/update_rule.h"
#include "plan/solvers.h"
#include "step/types.h"

namespace dmuon::step {

/// The update rule of one Muon param group:
///   buf ← lerp(buf, g, 1 − μ);  U ← lerp(g, buf, μ) (Nesterov) or buf;
///   p ← p·(1 − lr·wd) − lr·ratio(m, n)·orth(U).
struct GroupRule {
  double lr = 0.0;
  double weight_decay = 0.0;
  double momentum = 0.95;
  bool nesterov = true;
  optim::AdjustLr adjust_lr = optim::AdjustLr::kNone;
  ns::Schedule schedule;
  /// NorMuon's row normalization of O (optim/normuon.h); off by default. Its state v is
  /// ParamTensors::row_state.
  optim::NormuonRule normuon;

  /// Throws dmuon::Error naming the option that is out of range.
  void validate() const;
  /// Factor of O in p ← p·decay() + update_scale(m, n)·O.
  double update_scale(int64_t rows, int64_t cols) const { return -lr * optim::adjusted_lr_ratio(adjust_lr, rows, cols); }
  /// Decoupled weight decay's factor on the parameter.
  double decay() const { return 1.0 - lr * weight_decay; }
  bool operator==(const GroupRule& o) const {
    return lr == o.lr && weight_decay == o.weight_decay && momentum == o.momentum && nesterov == o.nesterov &&
           adjust_lr == o.adjust_lr && schedule == o.schedule && normuon == o.normuon;
  }
};

/// Who orthogonalizes an item.
enum class Mode {
  kOwner,   ///< its planned owner, once; results return to every rank that holds rows
  kGather,  ///< every rank (the benchmark baseline): every rank receives every piece
};
/// "owner" | "gather"; the error names the option `mode`.
Mode parse_mode(const std::string& name);
const char* mode_name(Mode mode);

/// Element type of the pieces on the wire.
enum class WireDType { kAuto, kFloat32, kBFloat16, kFloat16 };
/// "auto" | "float32" | "bfloat16" | "float16"; the error names `wire_dtype`.
WireDType parse_wire_dtype(const std::string& name);
/// auto: float32 on the CPU, bfloat16 on CUDA (16-bit halves the bytes moved).
DType resolve_wire_dtype(WireDType wire, DeviceKind device);

/// How the engine times its phases (step/phase_clock.h).
enum class PhaseTiming {
  kEnqueue,       ///< host time to enqueue them (no wait; on a GPU not the device's time)
  kSynchronized,  ///< host time after waiting for the device at each phase's end (real,
                  ///< but the phases, and the backward around early work, stop overlapping)
  kDevice,        ///< device time between marks on the ops' stream, read when the step
                  ///< ends (real without a host wait; CPU ops: host time, which is theirs)
};

/// Where the owner planner's NS seconds come from (step/cost_profile.h).
struct CostOptions {
  /// Timed on the engine's own ops (each group's schedule, the batches the step runs);
  /// false: the analytic model of the ops' device.
  bool measure = false;
  /// [group] the schedule each Muon group's matrices are timed with (measure only).
  std::vector<ns::Schedule> schedules;
  /// The measurement store (autotune/tune_cache.h); empty: the ops' default
  /// (CUDA: the autotuner's store, DMUON_AUTOTUNE_CACHE; CPU: this process's memory).
  std::string store_path;
  int num_runs = 5;  ///< timed runs per point; the median is kept
  /// Untimed runs first. NOTE: on CUDA the first run of a batch tunes its kernels and the
  /// second captures its graph; the step replays it from the third on.
  int num_warmup = 2;

  /// Throws dmuon::Error naming the option that is out of range.
  void validate() const;
};

/// How the engine runs; fixed when the engine is made.
struct EngineOptions {
  Mode mode = Mode::kOwner;
  WireDType wire_dtype = WireDType::kAuto;
  /// Wire bytes of one pipeline stage, over every owner (each owner's NS batches take at
  /// most stage_bytes / world of it, at least one item); ≤ 0: no bound.
  int64_t stage_bytes = int64_t{64} << 20;
  /// Stages of pipeline slack: forwards that far ahead, returns applied that far behind.
  /// 0: twice the world size (today's DMUON_PIPELINE_DEPTH default).
  int pipeline_depth = 0;
  /// Streams the NS batches of a stage may spread over (1–8; CPU ops ignore it).
  int num_streams = 2;
  /// Bound on one NS batch's workspace (today's DMUON_NS_BATCH_MB); at least one item.
  int64_t ns_batch_bytes = int64_t{2048} << 20;
  /// CUDA graphs of the NS iteration (replayed from a batch's third run on).
  bool graphs = true;
  /// How the phases are timed (StepStats, the per-stage timeline): PhaseTiming.
  PhaseTiming timing = PhaseTiming::kEnqueue;
  /// Stages in backward order (StageLimits::backward_order): for a step begun inside
  /// backward, whose stages leave as backward completes them.
  bool backward_order = false;
  /// With backward_order: [param] the position of its group (an FSDP2 unit, a DDP bucket)
  /// in the order backward hands gradients over (0: first), −1 where none is known; the
  /// stages are runs of whole groups (plan/stage_windows.h). Empty: none known. Every
  /// rank must pass the same (agreed with the plan).
  std::vector<int> backward_groups;
  /// Owner planner and the NS costs it balances.
  plan::SolverKind solver = plan::SolverKind::kMilp;
  plan::MilpOptions milp{};
  /// Every rank solves the plan itself (deterministically: the MILP without its wall-clock
  /// limit), never rank 0 alone and a broadcast; always so where the transport moves no
  /// data (a fake world) and for the deterministic solvers (LPT, round robin).
  bool plan_locally = false;
  CostOptions cost;
  double bandwidth_bytes_per_s = 50e9;

  /// Throws dmuon::Error naming the option that is out of range.
  void validate() const;
  /// The pipeline depth at `world_size` (0 resolved).
  int depth_for(int world_size) const { return pipeline_depth > 0 ? pipeline_depth : 2 * world_size; }
};

}  // namespace dmuon::step

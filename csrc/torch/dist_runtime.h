// dmuon/torch/dist_runtime.h — the owner-centric Muon step over a c10d process group.
//
// Each Muon parameter has one owner rank (from the planner). Per step:
//   momentum on the local rows (shard or replica) → pack the update into a wire buffer →
//   all_to_all so each owner holds its full matrices → batched Newton–Schulz on the owner →
//   all_to_all back so every rank holds its rows of the result → apply (lr scaling,
//   decoupled weight decay) → at the end, one agreement that every result was finite.
// Work goes in buckets in plan order; the next bucket's all_to_all is in flight while the
// current one is orthogonalized, results travel back asynchronously, and each bucket is
// applied as soon as its results are back, so a step's extra memory is a few buckets plus
// the Newton–Schulz workspace of the largest matrix, never a copy of the model. mode "gather" is
// the naive baseline: every rank gathers every matrix and orthogonalizes all of them.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "dist/buckets.h"
#include "dist/shard_layout.h"
#include "dist/world_model.h"
#include "group_options.h"
#include "ns/schedule.h"
#include "optim/gated_step.h"
#include "sim/pipeline.h"
#include "sim/step_layout.h"

namespace dmuon::torch_adapter {

/// How the runtime runs; fixed at construction.
struct RuntimeOptions {
  std::string mode = "owner";       ///< "owner" | "gather"
  int64_t bucket_bytes = 64 << 20;  ///< wire bytes per pipeline bucket (≤ 0: one bucket)
  std::string wire_dtype = "auto";  ///< "auto" (fp32 on CPU, bf16 on CUDA) | float32 | bfloat16 | float16
  std::string solver = "milp";      ///< owner planner: "milp" | "lpt" | "round_robin"
  std::string device_type = "cpu";  ///< "cpu" | "cuda": cost model and collective buffers
  bool profile = false;             ///< synchronize the device between phases to time them
  /// Measured NS seconds (rows, cols, num_matrices, seconds) for the planner; empty: the
  /// analytic model of device_type. Every rank must pass the same entries.
  std::vector<std::tuple<int64_t, int64_t, int64_t, double>> cost_entries;
  /// CUDA streams of the gated fused step (1–8; 0: DMUON_FUSED_STREAMS, default 2).
  int64_t fused_streams = 0;
  /// Where the plan comes from: "auto" (a fake world: "local", else "broadcast") |
  /// "broadcast" (rank 0 solves, the others receive it) | "local" (every rank solves it
  /// deterministically; on a real group the ranks then agree on its hash).
  std::string plan_source = "auto";
  /// Record each bucket's compute phases (StepStats::bucket_times) for the projection.
  bool record_timeline = false;
  // Code-path switches (Python: dmuon.Execution). Unset: the DMUON_* variable named, read
  // when the runtime is made (common/env.h), else the default.
  std::optional<bool> gated_step;         ///< DMUON_GATED_STEP (default on): the gated check-and-update
  std::optional<bool> fused_step;         ///< DMUON_FUSED_STEP (default on): the fused single-GPU batches
  std::optional<int64_t> pipeline_depth;  ///< DMUON_PIPELINE_DEPTH (default 0: twice the world size)
  std::optional<int64_t> ns_batch_mb;     ///< DMUON_NS_BATCH_MB (default 2048): one fused batch's workspace
  std::optional<bool> cuda_graphs;        ///< DMUON_CUDA_GRAPHS (default on): NS replayed as CUDA graphs
};

/// Where the time of the last step went (seconds) and what it moved (bytes, this rank).
struct StepStats {
  double momentum_s = 0, pack_s = 0, comm_wait_s = 0, ns_s = 0, apply_s = 0, total_s = 0;
  int64_t bytes_sent = 0, bytes_received = 0, num_buckets = 0, num_orthogonalized = 0;
  int64_t num_fused = 0;  ///< parameters of the fused single-GPU path
  int64_t num_fused_streams = 0;  ///< CUDA streams the gated fused batches ran on (DMUON_FUSED_STREAMS)
  /// (matrices, rows, cols) of each batch of the fused single-GPU path, in launch order.
  std::vector<std::tuple<int64_t, int64_t, int64_t>> fused_batches;
  int64_t pipeline_depth = 0;  ///< buckets of pipeline slack of the bucketed path (DMUON_PIPELINE_DEPTH)
  /// Gated check-and-update only, host wall: from the call to its first launch, and to the
  /// last launch (the rest of total_s is the wait for the device).
  double host_prepare_s = 0, host_enqueue_s = 0;
  /// Parameters orthogonalized on this rank, in order (each once per step).
  std::vector<int64_t> orthogonalized;
  /// RuntimeOptions::record_timeline: device time of each bucket's compute phases, and of
  /// the fake world's synthetic receive data (not part of any phase: not real work).
  std::vector<sim::BucketTimes> bucket_times;
  double model_fill_s = 0;
};

/// What MuonRuntime::check_and_update_fused() found and did, per parameter.
struct FusedOutcome {
  std::vector<int64_t> codes;      ///< −1 without a gradient, else bit 0 gradient, bit 1 buffer non-finite
  std::vector<int64_t> updated;    ///< 1 where the fused path updated it (nowhere when anything was non-finite)
  std::vector<int64_t> extra_bad;  ///< per `extra` tensor: 1 when it holds NaN/Inf
  std::string error;               ///< step()'s end-of-step error when a fused result was not finite, else ""
};

class MuonRuntime {
 public:
  /// group_name: a c10d group's name (ProcessGroup.group_name), or "" for one process.
  /// names/layouts: the Muon parameters, identical on every rank.
  MuonRuntime(const std::string& group_name, std::vector<std::string> names,
              std::vector<dist::ParamLayout> layouts, RuntimeOptions options);

  /// One step over every Muon parameter, local tensors (this rank's rows). grads may hold
  /// undefined tensors (and momentum_buffers then too) for parameters without a gradient
  /// on every rank: they are skipped.
  /// group_idx[i] indexes `groups`. The caller checks gradients and momentum buffers for
  /// NaN/Inf first (collectively); should an orthogonalized update still be non-finite,
  /// its non-finite entries are not applied and every rank throws at the end of the step.
  void step(at::TensorList params, const std::vector<at::Tensor>& grads,
            const std::vector<at::Tensor>& momentum_buffers, const std::vector<int64_t>& group_idx,
            const std::vector<MuonGroupOptions>& groups, int64_t step_idx);

  ~MuonRuntime();

  /// The NaN/Inf check of the parameters the fused single-GPU path will update (one
  /// process on an sm_90 GPU, whole fp32 matrices; fused_local_step.h): one read of their
  /// gradients and momentum buffers (undefined: not created yet) that also sums what the
  /// step needs, kept for step(step_idx) on the same tensors. Returns per parameter −1
  /// (not checked here: the caller checks it), else bit 0 = gradient non-finite, bit 1 =
  /// momentum buffer non-finite. Nothing is modified.
  std::vector<int64_t> check_fused(at::TensorList params, const std::vector<at::Tensor>& grads,
                                   const std::vector<at::Tensor>& momentum_buffers,
                                   const std::vector<int64_t>& group_idx, const std::vector<MuonGroupOptions>& groups,
                                   int64_t step_idx);

  /// One process on a GPU, after the first step (every momentum buffer of a parameter with a
  /// gradient exists): the NaN/Inf check of every parameter with a gradient and of `extra`
  /// (the other parameters' gradients, same device) and the fused path's whole update,
  /// enqueued together behind one device-side gate, then one copy of every flag to the
  /// host. A non-finite value anywhere closes the gate before any write: nothing is
  /// modified. Otherwise the fused parameters are updated (outcome.updated); the caller
  /// passes the rest to step() (they count in the same last_stats) and raises
  /// outcome.error, if any, where step() would have.
  /// NOTE: why: check_fused() makes the host wait for the check before it enqueues the
  /// update, and the GPU idles while the host prepares it (a 1.26 ms gap in a profiled
  /// Qwen2.5-0.5B step on an H200, gone with this path). Measured without the profiler the
  /// step time moved within run-to-run spread (BENCHMARKS.md run H): one host wait a step
  /// instead of two, not a measured speed-up.
  FusedOutcome check_and_update_fused(at::TensorList params, const std::vector<at::Tensor>& grads,
                                      const std::vector<at::Tensor>& momentum_buffers,
                                      const std::vector<int64_t>& group_idx,
                                      const std::vector<MuonGroupOptions>& groups, int64_t step_idx,
                                      const std::vector<at::Tensor>& extra);

  /// Element-wise all_reduce over the group of small integer flags (op "sum" | "max");
  /// `what` and step_idx name the collective and the step in errors.
  std::vector<int64_t> all_reduce_flags(const std::vector<int64_t>& local, const std::string& op,
                                        const std::string& what, int64_t step_idx);

  /// Whether the caller should use check_and_update_fused() where it applies
  /// (options.gated_step, else DMUON_GATED_STEP, default 1, read when the runtime is made).
  bool gated_step() const { return gated_step_; }
  /// The code-path switches as resolved when the runtime was made (options, else DMUON_*).
  bool fused_step() const { return fused_step_; }
  int fused_streams() const { return fused_streams_; }
  int64_t pipeline_depth() const { return static_cast<int64_t>(depth_); }
  int64_t ns_batch_bytes() const { return ns_batch_bytes_; }
  bool cuda_graphs() const { return cuda_graphs_; }
  bool profile() const { return options_.profile; }
  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  /// What the group's other ranks are to this process (detected when the runtime was made).
  const dist::WorldModel& world_model() const { return model_; }
  const RuntimeOptions& options() const { return options_; }
  /// The planner's predicted Newton–Schulz seconds of every rank (owner mode; else empty).
  const std::vector<double>& predicted_rank_seconds() const { return predicted_rank_s_; }
  /// The step's layout on every rank (mode, layouts, owners, buckets, wire) for the projection.
  sim::StepLayout step_layout() const;
  const std::vector<int>& owners() const { return owners_; }
  const std::string& plan_text() const { return plan_text_; }
  double predicted_makespan_s() const { return predicted_makespan_s_; }
  const std::vector<dist::Bucket>& buckets() const { return buckets_; }
  const StepStats& last_stats() const { return stats_; }

 private:
  void make_plan();
  at::Tensor wait_and_check(const c10::intrusive_ptr<c10d::Work>& work, const at::Tensor& output,
                            const std::string& what);
  c10::intrusive_ptr<c10d::Work> all_to_all(at::Tensor& output, at::Tensor& input,
                                            std::vector<int64_t> output_splits,
                                            std::vector<int64_t> input_splits);
  void sync_for_profile() const;
  uint64_t layout_hash() const;
  // A fake world: the receive buffer of a finished all_to_all filled as the model says
  // (dist::WorldModel::received_data); the rank's own piece copied from its send buffer.
  void fill_modelled_receive(const at::Tensor& recv, const std::vector<int64_t>& recv_offsets, const at::Tensor& send,
                             const std::vector<int64_t>& send_offsets, dist::ExchangeKind kind);
  // One process on a GPU: the usable active parameters through the fused kernels (they
  // are then marked inactive for the bucket pipeline); one flag per batch.
  void run_fused_local(at::TensorList params, const std::vector<at::Tensor>& grads,
                       const std::vector<at::Tensor>& momentum_buffers, const std::vector<int64_t>& group_idx,
                       const std::vector<MuonGroupOptions>& groups, const std::vector<ns::Schedule>& schedules,
                       std::vector<bool>& active, std::vector<at::Tensor>& finite_flags,
                       std::vector<size_t>& flag_owner, int64_t step_idx);

  c10::intrusive_ptr<c10d::ProcessGroup> group_;  // null for one process
  dist::WorldModel model_;                         // single, real or fake (world_detect.h)
  std::optional<at::Generator> fill_generator_;    // fake: a private copy for synthetic data
  std::vector<double> predicted_rank_s_;
  int rank_ = 0;
  int world_size_ = 1;
  std::vector<std::string> names_;
  std::vector<dist::ParamLayout> layouts_;
  std::vector<std::vector<dist::RowBlock>> rows_;  // [param][rank]
  RuntimeOptions options_;
  at::ScalarType wire_dtype_ = at::kFloat;
  std::vector<int> owners_;
  std::vector<std::vector<int>> order_by_rank_;
  std::string plan_text_;
  double predicted_makespan_s_ = 0.0;
  std::vector<dist::Bucket> buckets_;
  StepStats stats_;
  int64_t step_idx_ = 0;
  struct FusedState;                  // check_fused()'s results (fused path only)
  std::unique_ptr<FusedState> fused_;
  // FusedBatch::problem() of each batch the last check_and_update_fused() ran.
  using FusedProblem = optim::GatedBatch;
  std::vector<FusedProblem> gated_warm_problems_;
  int64_t fused_done_step_ = -1;      // the step whose fused part check_and_update_fused() ran
  bool gated_step_ = true;            // options.gated_step or DMUON_GATED_STEP
  bool fused_step_ = true;            // options.fused_step or DMUON_FUSED_STEP
  int fused_streams_ = 1;             // options.fused_streams or DMUON_FUSED_STREAMS
  size_t depth_ = 1;                  // options.pipeline_depth or DMUON_PIPELINE_DEPTH, resolved
  int64_t ns_batch_bytes_ = int64_t{2048} << 20;  // options.ns_batch_mb or DMUON_NS_BATCH_MB
  bool cuda_graphs_ = true;           // options.cuda_graphs or DMUON_CUDA_GRAPHS
};

}  // namespace dmuon::torch_adapter

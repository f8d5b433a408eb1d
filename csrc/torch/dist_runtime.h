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
  /// CUDA streams the step engine's NS batches may spread over (1–8; 0: DMUON_FUSED_STREAMS,
  /// default 2).
  int64_t fused_streams = 0;
  /// Where the plan comes from: "auto" (a fake world: "local", else "broadcast") |
  /// "broadcast" (rank 0 solves, the others receive it) | "local" (every rank solves it
  /// deterministically; on a real group the ranks then agree on its hash).
  std::string plan_source = "auto";
  /// Record each bucket's compute phases (StepStats::bucket_times) for the projection.
  bool record_timeline = false;
  // Code-path switches (Python: dmuon.Execution). Unset: the DMUON_* variable named, read
  // when the runtime is made (common/env.h), else the default.
  std::optional<int64_t> pipeline_depth;  ///< DMUON_PIPELINE_DEPTH (default 0: twice the world size)
  std::optional<int64_t> ns_batch_mb;     ///< DMUON_NS_BATCH_MB (default 2048): one fused batch's workspace
  std::optional<bool> cuda_graphs;        ///< DMUON_CUDA_GRAPHS (default on): NS replayed as CUDA graphs
};

/// Where the time of the last step went (seconds) and what it moved (bytes, this rank).
struct StepStats {
  double momentum_s = 0, pack_s = 0, comm_wait_s = 0, ns_s = 0, apply_s = 0, total_s = 0;
  int64_t bytes_sent = 0, bytes_received = 0, num_buckets = 0, num_orthogonalized = 0;
  int64_t num_fused = 0;  ///< parameters of the one-GPU step (the step engine, one process on CUDA)
  int64_t num_fused_streams = 0;  ///< most CUDA streams its NS batches ran on (DMUON_FUSED_STREAMS)
  /// (matrices, rows, cols) of each NS batch of the one-GPU step, in launch order.
  std::vector<std::tuple<int64_t, int64_t, int64_t>> fused_batches;
  int64_t pipeline_depth = 0;  ///< buckets of pipeline slack of the bucketed path (DMUON_PIPELINE_DEPTH)
  /// Orthogonalized on this rank, in order, each once per step: MuonRuntime's parameters;
  /// the engine's matrices (items, EngineRuntime.item_params gives their parameters).
  std::vector<int64_t> orthogonalized;
  /// RuntimeOptions::record_timeline: device time of each bucket's compute phases, and of
  /// the fake world's synthetic receive data (not part of any phase: not real work).
  std::vector<sim::BucketTimes> bucket_times;
  double model_fill_s = 0;
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

  /// Element-wise all_reduce over the group of small integer flags (op "sum" | "max");
  /// `what` and step_idx name the collective and the step in errors.
  std::vector<int64_t> all_reduce_flags(const std::vector<int64_t>& local, const std::string& op,
                                        const std::string& what, int64_t step_idx);

  /// The code-path switches as resolved when the runtime was made (options, else DMUON_*).
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
  size_t depth_ = 1;                  // options.pipeline_depth or DMUON_PIPELINE_DEPTH, resolved
  int64_t ns_batch_bytes_ = int64_t{2048} << 20;  // options.ns_batch_mb or DMUON_NS_BATCH_MB
  bool cuda_graphs_ = true;           // options.cuda_graphs or DMUON_CUDA_GRAPHS
};

}  // namespace dmuon::torch_adapter

// dmuon/torch/ownership_runtime.h — the weight-ownership mode of the Muon runtime.
//
// Each owned matrix lives whole on one owner rank (planned: balanced Newton–Schulz time,
// each layer's matrices spread over owners). Per training step:
//   forward   publish(i): the owner copies its master weight into the compute tensor and
//             broadcasts it (two levels on a replicate × shard grid); prefetched by the
//             caller, released after use (release) to save memory;
//   backward  grad_ready(i): the local gradient is added into its bucket's compact buffer;
//             a complete bucket is reduced to the owners (all_to_all, then a local sum) at
//             once; a thread of this runtime waits for the reduction (a side stream on
//             GPUs) and hands the owner's matrices of the bucket to the step engine's early
//             work (step::StepEngine::items_ready: check, momentum staged, batched NS)
//             while backward goes on;
//   step      finish(): the engine checks the rest and every rank agrees; commit(): the
//             engine writes momentum and parameters (owner only) — or discard().
// The math (momentum, batching, NS, the NaN/Inf checks, apply, the agreements) is the
// engine's, on the matrices' layout "whole on rank r"; this runtime is the mode's
// transport (bucket reduction and publish) and its adapter. Nothing is committed before
// every rank has agreed that the gradients and buffers were finite.
#pragma once

#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <deque>
#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "dist/owned_buckets.h"
#include "dist/shard_layout.h"
#include "group_options.h"
#include "ownership_transport.h"
#include "step/engine.h"

namespace dmuon::torch_adapter {

/// Fixed at construction.
struct OwnershipOptions {
  int64_t bucket_bytes = 25 << 20;     ///< gradient bytes per reduction bucket (≤ 0: one)
  std::string reduce_dtype = "float32";  ///< buffers and wire of the gradient reduction
  std::string solver = "milp";         ///< "milp" | "lpt" | "round_robin"
  std::string device_type = "cpu";     ///< "cpu" | "cuda"
  bool spread_layers = true;           ///< matrices of one layer on different owners
  /// Measured NS seconds (rows, cols, num_matrices, seconds); empty: analytic model.
  std::vector<std::tuple<int64_t, int64_t, int64_t, double>> cost_entries;
};

/// One recorded moment (seconds since the runtime was built), for overlap analysis.
struct TimelineEvent {
  std::string what;  ///< "grad_ready" | "reduce_issued" | "ns_begin" | "ns_end" | "flush" | "finish"
  int64_t index;     ///< matrix (grad_ready) or bucket
  double seconds;
};

class OwnershipRuntime {
 public:
  /// Group names ("" for none): shard_group is the flat group (or a mesh row);
  /// replicate_group (publish and step flags) and replicate_reduce_group (used only by the
  /// worker thread, so that its collectives keep one order) are two groups over the same
  /// mesh column, both "" on a flat group. One process passes "" everywhere.
  /// layouts: global shapes (never sharded); layer_of: layer id per matrix (−1: none);
  /// dtypes: of each master weight ("float32" | "float64" | "bfloat16" | "float16").
  OwnershipRuntime(const std::string& shard_group, const std::string& replicate_group,
                   const std::string& replicate_reduce_group, std::vector<std::string> names, std::vector<dist::ParamLayout> layouts,
                   std::vector<int> layer_of, std::vector<std::string> dtypes, OwnershipOptions options);
  ~OwnershipRuntime();
  OwnershipRuntime(const OwnershipRuntime&) = delete;
  OwnershipRuntime& operator=(const OwnershipRuntime&) = delete;

  // Options of early orthogonalization, for the next backward: the Muon group of every
  // matrix, the groups, and the owner's momentum buffers (undefined where not owned).
  void configure(std::vector<int64_t> group_idx, std::vector<MuonGroupOptions> groups,
                 std::vector<at::Tensor> momentum_buffers);

  // Forward publish of matrix i into `compute` (persistent, storage managed here) from
  // `master` (read on the owner only). Asynchronous; wait_published makes the current
  // stream (CPU: the caller) wait. release frees compute's storage.
  void publish(int64_t i, const at::Tensor& compute, const at::Tensor& master);
  void wait_published(int64_t i);
  void release(int64_t i, const at::Tensor& compute);
  /// Blocking: every rank's `tensor` (allocated here where freed) gets the owner's value of
  /// it (for checkpoints: masters and momentum buffers).
  void materialize(int64_t i, const at::Tensor& tensor);

  // Backward: matrix i's local gradient is ready. sync=false accumulates only (gradient
  // accumulation); sync=true also reduces complete buckets, in bucket order. flush ends a
  // backward pass: with sync, every bucket not yet reduced is (missing gradients count 0).
  void grad_ready(int64_t i, const at::Tensor& grad, bool sync);
  void flush(bool sync);

  // Step: finish flushes, waits for the worker, checks the rest and agrees over every
  // rank (collective): which matrices had a gradient on every rank (active), and which had
  // a non-finite gradient or momentum buffer on some rank (indices; then nothing will be
  // written and the step is closed). masters: every matrix's master (read on its owner);
  // groups: the Muon groups' options now (lr and weight decay; momentum and NS follow the
  // configure()d ones the early work ran with). commit writes the agreed step and agrees
  // that every result was finite (collective; raises naming the first that was not);
  // discard drops the step.
  struct Finished {
    std::vector<bool> active;
    std::vector<int64_t> nonfinite, corrupt;
  };
  Finished finish(int64_t step_idx, const std::vector<at::Tensor>& masters, const std::vector<MuonGroupOptions>& groups);
  void commit(int64_t step_idx);
  void discard();

  int rank() const { return rank_; }
  int world_size() const { return grid_.world(); }
  const std::vector<int>& owners() const { return owners_; }
  const std::string& plan_text() const { return plan_text_; }
  double predicted_makespan_s() const { return predicted_makespan_s_; }
  std::vector<std::vector<int>> buckets() const;
  /// The events of the current (or last finished) step.
  std::vector<TimelineEvent> timeline() const;
  void clear_timeline();

 private:
  struct Issued;  // one bucket on its way through the reduction and the worker
  void make_plan();
  void make_engine();  // with the group index of every matrix (collective: the plan hash)
  void issue_bucket(size_t k);
  void worker_loop();
  void process(Issued& issued);
  void wait_worker();
  void reset_window();  // with mutex_ held
  void drop_step();     // the step's tensors, once the engine's work on them is done
  c10::intrusive_ptr<c10d::Work> broadcast_from_owner(int64_t i, at::Tensor& tensor);
  void record(const std::string& what, int64_t index);
  at::Device device() const;
  c10::intrusive_ptr<c10d::Work> broadcast(const c10::intrusive_ptr<c10d::ProcessGroup>& group,
                                           at::Tensor& tensor, int root);
  void wait_work(const c10::intrusive_ptr<c10d::Work>& work, const std::string& what);

  // Groups and grid.
  c10::intrusive_ptr<c10d::ProcessGroup> shard_group_, replicate_group_, replicate_reduce_group_;
  dist::RankGrid grid_;
  int rank_ = 0;
  // Matrices and plan.
  std::vector<std::string> names_;
  std::vector<dist::ParamLayout> layouts_;
  std::vector<int> layer_of_;
  OwnershipOptions options_;
  at::ScalarType reduce_dtype_ = at::kFloat;
  std::vector<int> owners_;
  std::string plan_text_;
  double predicted_makespan_s_ = 0.0;
  std::vector<dist::OwnedBucket> buckets_;
  std::vector<size_t> bucket_of_;
  std::vector<size_t> slot_of_;  // position of matrix i in its bucket
  // Early-orthogonalization options (guarded by mutex_).
  std::vector<int64_t> group_idx_;
  std::vector<MuonGroupOptions> groups_;
  std::vector<step::GroupRule> rules_;  // groups_ as the engine's rules (built once per configure)
  std::vector<at::Tensor> momentum_buffers_;
  // The step engine over the owned matrices ("whole on rank owner"), its ops and transport.
  std::vector<step::DType> dtypes_;
  std::unique_ptr<OwnershipAgreement> transport_;
  std::unique_ptr<step::DeviceOps> ops_;
  std::unique_ptr<step::StepEngine> engine_;
  std::vector<int64_t> engine_group_idx_;  // the group indices engine_ was made with
  // The open step's tensors on the owner (kept until commit or discard): each matrix's
  // reduced gradient in its dtype, and the momentum the engine reads and writes (the
  // configured buffer, or zeros before the first step: copied into the buffer at commit).
  std::vector<at::Tensor> step_grad_, step_momentum_;
  std::vector<bool> fresh_momentum_;
  // Publish state.
  std::vector<c10::intrusive_ptr<c10d::Work>> publish_work_;
  // Backward state of the current accumulation window (guarded by mutex_).
  std::vector<at::Tensor> bucket_buffer_;
  std::vector<bool> contributed_;   // this window
  std::vector<bool> arrived_;       // this backward pass
  std::vector<bool> issued_;        // this window
  size_t next_to_issue_ = 0;
  // Worker.
  std::optional<c10::Stream> side_stream_;
  std::thread worker_;
  mutable std::mutex mutex_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<std::unique_ptr<Issued>> queue_;
  size_t num_issued_ = 0, num_processed_ = 0;
  bool stopping_ = false;
  std::exception_ptr worker_error_;
  int64_t step_idx_ = 0;
  std::vector<std::unique_ptr<Issued>> finished_;  // kept until commit/discard (stream safety)
  // Timeline.
  std::chrono::steady_clock::time_point start_;
  std::vector<TimelineEvent> timeline_;
  bool window_open_ = false;
};

}  // namespace dmuon::torch_adapter

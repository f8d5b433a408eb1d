// dmuon/torch/engine/owned_exchange.h — the torch adapter of the weight-ownership mode's
// exchange (step/ownership_exchange.h): c10d groups as the mesh axes' transports, the
// owners planned by the engine's driver (step::plan_whole_owners) when dmuon.own_matrices
// runs, tensors as descriptors, the publish hooks' storage (storage_control.h), and the
// streams of a GPU: gradients are added into their buckets and the buckets leave on the
// stream backward runs on; their reduction's sums and the step engine's work on the owned
// matrices run on a side stream (the ops this exchange hands the EngineRuntime), which
// waits for backward but never the other way around, so that Newton–Schulz overlaps it.
#pragma once

#include <ATen/ATen.h>
#include <c10/core/Stream.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "layout/shard_layout.h"
#include "engine/c10d_transport.h"
#include "plan/solvers.h"
#include "step/ownership_exchange.h"
#include "step/types.h"

namespace dmuon::torch_adapter {

/// Fixed when the exchange is made (typed: parsed in the binding, dmuon._C.ownership.Options).
struct OwnershipOptions {
  int64_t bucket_bytes = int64_t{25} << 20;  ///< gradient bytes per reduction bucket (≤ 0: one)
  step::DType reduce_dtype = step::DType::kFloat32;   ///< buckets and wire of the gradient reduction
  plan::SolverKind solver = plan::SolverKind::kMilp;  ///< the owner planner
  step::DeviceKind device = step::DeviceKind::kCpu;   ///< CUDA: the current CUDA device
  bool spread_layers = true;                 ///< matrices of one layer on different owners
};

/// The groups of a (replicate × shard) mesh, by c10d name ("" for none): `world` spans every
/// rank (the planning and the step's agreements), `row` this rank's shard group, `column`
/// and `column_reduce` two groups over this rank's column (publishes; the reduction's
/// second level alone). shard_of / replica_of: every world rank's coordinates.
struct OwnershipGroups {
  std::string world, row, column, column_reduce;
  int shards = 1, replicas = 1;
  std::vector<int> shard_of, replica_of;
};

class OwnedExchange {
 public:
  /// Collective over the world group (the owners are planned and agreed here). layouts:
  /// global, unsharded; layer_of: layer id per parameter (−1: none); dtypes of the master
  /// weights ("float32" | "float64" | "bfloat16" | "float16").
  OwnedExchange(const OwnershipGroups& groups, std::vector<std::string> names, std::vector<layout::ParamLayout> layouts,
                std::vector<int> layer_of, const std::vector<std::string>& dtypes, OwnershipOptions options);
  ~OwnedExchange();

  // ---- forward: publish into `compute` (storage kept by the tensor, allocated here) from
  // `master` (read on the owner); wait_published makes the current stream (CPU: the caller)
  // wait; release frees compute's storage; materialize: every rank's `tensor` gets the
  // owner's value, blocking (checkpoints).
  void publish(int64_t i, const at::Tensor& compute, const at::Tensor& master);
  void wait_published(int64_t i);
  void release(int64_t i, const at::Tensor& compute);
  void materialize(int64_t i, const at::Tensor& tensor);

  // ---- backward (step/ownership_exchange.h): `momentum` is the owner's buffer for the
  // step's early work (undefined: none, or not the owner); finished buckets are handed to
  // the attached EngineRuntime's open step, polled here without waiting.
  void grad_ready(int64_t i, const at::Tensor& grad, const at::Tensor& momentum, bool sync);
  void end_backward(bool sync);

  // ---- for the EngineRuntime over these parameters
  /// The step engine's ops: on a GPU those of the side stream.
  const std::shared_ptr<step::DeviceOps>& ops() const { return ops_; }
  step::OwnershipExchange& exchange() { return *exchange_; }
  /// Where finished buckets go (one runtime at a time; null: kept for the step).
  void attach(std::function<void(const std::vector<int>& params)> hand_over, const void* owner);
  void detach(const void* owner);
  /// Buckets in flight: polled (wait=false) or all finished (the step); hands them over.
  void progress(bool wait);
  /// Closes the window of step `step_idx` (the next one is named in errors): its buckets
  /// finished, its reduced gradients dropped. After the step, or a step that failed before
  /// it reached the runtime (collective: every rank closes it).
  void end_window(int64_t step_idx);

  int rank() const { return world_->rank(); }
  int world_size() const { return world_->world_size(); }
  const std::string& world_group() const { return world_group_; }
  const std::vector<std::string>& names() const { return names_; }
  const std::vector<layout::ParamLayout>& layouts() const { return layouts_; }
  const std::vector<std::string>& dtypes() const { return dtype_names_; }
  const std::vector<int>& owners() const { return owners_; }
  const std::string& plan_text() const { return plan_text_; }
  double predicted_makespan_s() const { return predicted_makespan_s_; }
  std::vector<std::vector<int>> buckets() const;

 private:
  // Parameter `i` as an index; throws naming `call` when it is out of range.
  size_t param_at(int64_t i, const char* call) const;
  std::string at_step(const std::string& what) const;

  std::string world_group_;
  std::vector<std::string> names_;
  std::vector<layout::ParamLayout> layouts_;
  std::vector<std::string> dtype_names_;
  std::vector<int> owners_;
  std::string plan_text_;
  double predicted_makespan_s_ = 0.0;
  std::unique_ptr<C10dTransport> world_, row_, column_, column_reduce_;
  std::optional<c10::Stream> side_stream_;
  std::unique_ptr<step::DeviceOps> grad_ops_;
  std::shared_ptr<step::DeviceOps> ops_;
  std::unique_ptr<step::OwnershipExchange> exchange_;
  std::vector<std::unique_ptr<step::Pending>> published_;  // [param] its publish in flight
  std::function<void(const std::vector<int>&)> hand_over_;
  const void* attached_ = nullptr;
};

}  // namespace dmuon::torch_adapter

// tests/cpp/step_world.h — a model of Muon parameters spread over a loopback world, and
// a plain fp64 Muon to check the step engine against.
//
// World holds every parameter's global values (fp64, rounded to the parameter's dtype),
// each rank's local tensors (its Shard(0) rows or a replica) and the gradients of every
// step. reference_muon() runs the same steps on the global values in fp64: momentum lerp,
// Nesterov, Newton–Schulz by the same schedule in fp64 (orthogonalize_cpu<double>), the
// lr ratio and decoupled weight decay.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "step/cpu/cpu_elements.h"
#include "step/cpu/cpu_ops.h"
#include "step/engine.h"
#include "step/forwarding_ops.h"
#include "loopback_transport.h"

namespace dmuon::testing {

/// One Muon parameter of a test model.
struct ModelParam {
  std::string name;
  std::vector<int64_t> shape;
  int64_t batch_dims = 0;
  bool sharded = true;
  step::DType dtype = step::DType::kFloat32;
  int group = 0;
  int whole_on_rank = -1;  ///< ≥ 0: the weight-ownership layout (ParamSpec::whole_on_rank)
  bool transposed = false;  ///< stored (in, out), as HF Conv1D (layout::ParamLayout::transposed)
  std::optional<layout::MeshPlacement> mesh;  ///< set: placed on a device mesh (`sharded` ignored)
  std::vector<int64_t> row_blocks{};  ///< rows of each block orthogonalized alone (layout::ParamLayout::row_blocks)
  int64_t col_blocks = 0;  ///< equal column blocks orthogonalized alone (layout::ParamLayout::col_blocks)
};

/// Host memory of one tensor of `dtype`.
class HostTensor {
 public:
  HostTensor() = default;
  HostTensor(const std::vector<double>& values, step::DType dtype);
  std::vector<double> values() const;
  step::Buffer buffer() const;
  int64_t numel() const { return numel_; }
  const std::vector<unsigned char>& bytes() const { return bytes_; }
  /// The elements' memory (tests copy device results into it).
  void* data() const { return bytes_.data(); }
  step::DType dtype() const { return dtype_; }
  /// Element i set to `value` (rounded to the dtype).
  void set(int64_t i, double value);

 private:
  step::DType dtype_ = step::DType::kFloat32;
  int64_t numel_ = 0;
  mutable std::vector<unsigned char> bytes_;
};

/// Every value rounded to `dtype` (how it reads back from a tensor of that dtype).
std::vector<double> rounded(const std::vector<double>& values, step::DType dtype);

/// One rank's local tensors of every parameter (row_state: NorMuon's v, float32, one per
/// local row, zero before any step).
struct RankTensors {
  std::vector<HostTensor> param, grad, momentum, row_state;
  std::vector<bool> has_grad;
  std::vector<step::ParamTensors> views() const;
};

class World {
 public:
  /// Random parameters, momentum buffers (from a previous step) and `num_steps` steps of
  /// gradients; every value exactly representable in its parameter's dtype.
  World(std::vector<ModelParam> model, int world_size, int num_steps, uint64_t seed);

  int world_size() const { return world_size_; }
  const std::vector<ModelParam>& model() const { return model_; }
  std::vector<step::ParamSpec> specs() const;
  const step::ItemTable& table() const { return table_; }
  /// Flat rows × cols of parameter p.
  int64_t numel(int p) const;

  /// Global values before any step.
  std::vector<std::vector<double>> initial_param, initial_momentum;
  /// [step][param] global gradients.
  std::vector<std::vector<std::vector<double>>> grads;

  /// Rank r's local tensors before any step (its box of the initial values).
  RankTensors local(int rank) const;
  /// Every rank's local tensors before any step.
  std::vector<RankTensors> locals() const;
  /// Rank r's local gradients of step `step` (1-based) into `t`.
  void set_grads(int rank, int step, RankTensors& t) const;
  /// Global values of parameter p (param or momentum) from every rank's local tensors;
  /// replicas must agree exactly (else the test fails naming them).
  std::vector<double> gather(int p, const std::vector<RankTensors>& ranks, bool momentum) const;
  /// NorMuon's global v of parameter p (one per flat row) from every rank's row_state.
  std::vector<double> gather_rows(int p, const std::vector<RankTensors>& ranks) const;

 private:
  // Global values of a tensor of `shape` from each rank's `local(r)` at its box (`rows`: the
  // boxes without their last dim).
  std::vector<double> gather_boxes(int p, bool rows, const std::function<std::vector<double>(int rank)>& local) const;

  std::vector<ModelParam> model_;
  int world_size_;
  step::ItemTable table_;
};

/// Every byte of every rank's parameters and momentum buffers (to check what changed).
std::vector<std::vector<unsigned char>> state_bytes(const std::vector<RankTensors>& ranks);

/// fp64 Muon (with NorMuon where a rule asks for it) over `num_steps` steps of world.grads
/// from the initial values: the global parameters, momentum buffers and NorMuon's v after
/// them (per parameter).
struct ReferenceResult {
  std::vector<std::vector<double>> param, momentum, row_state;
};
ReferenceResult reference_muon(const World& world, const std::vector<step::GroupRule>& rules, int num_steps);

/// ‖a − b‖_F / max(‖b‖_F, tiny).
double relative_error(const std::vector<double>& a, const std::vector<double>& b);
/// a − b element-wise.
std::vector<double> difference(const std::vector<double>& a, const std::vector<double>& b);

/// What a run of the engine on every rank gave.
struct EngineRun {
  std::vector<std::string> errors;                      // [rank] "" when none
  std::vector<std::vector<step::StepOutcome>> outcomes;  // [rank][step]
  std::vector<step::StepStats> stats;                    // [rank] of the last step
  std::vector<std::vector<int>> owners;                  // [rank] per item
  std::vector<std::vector<step::Stage>> stages;          // [rank]
  std::vector<RankTensors> tensors;                      // [rank] after the run
};

/// Hooks of run_engine: the ops each rank's engine uses (default: the CpuOps given), and a
/// change to a rank's inputs before a step (e.g. a NaN).
struct RunHooks {
  LoopbackOptions loopback;  // the world's
  std::function<step::DeviceOps&(int rank, step::CpuOps& cpu)> ops;
  std::function<void(int rank, int step, RankTensors& t)> before_step;
  /// Set: runs rank r's step in place of engine.step (early work, two-phase steps) and
  /// returns its outcome.
  std::function<step::StepOutcome(int rank, int step, step::StepEngine& engine, RankTensors& t)> step;
  /// Set: each step's result agreement is deferred (step(..., agree_results=false)); this
  /// runs between the step and agree_committed() (while the results are pending).
  std::function<void(int rank, int step, step::StepEngine& engine)> before_results;
};

/// `num_steps` engine steps on every rank of a loopback world (CpuOps that poison their
/// allocations with NaN, so that nothing may read memory it did not write).
EngineRun run_engine(const World& world, const step::EngineOptions& options, const std::vector<step::GroupRule>& rules,
                     int num_steps, const RunHooks& hooks = {});

/// A forwarding DeviceOps: tests override the passes they watch or break.
using step::ForwardingOps;

/// RunHooks::ops making each rank's ops an `Ops` (a ForwardingOps over the rank's CpuOps,
/// constructed with `args`), kept in `out[rank]` for the test to read after the run.
template <typename Ops, typename... Args>
std::function<step::DeviceOps&(int, step::CpuOps&)> per_rank_ops(std::vector<std::unique_ptr<Ops>>& out,
                                                                 int world_size, Args... args) {
  out.resize(static_cast<size_t>(world_size));
  return [&out, args...](int rank, step::CpuOps& cpu) -> step::DeviceOps& {
    out[static_cast<size_t>(rank)] = std::make_unique<Ops>(cpu, args...);
    return *out[static_cast<size_t>(rank)];
  };
}

/// Ops that record the shape of every matrix they orthogonalize.
class CountingOps : public ForwardingOps {
 public:
  using ForwardingOps::ForwardingOps;
  void orthogonalize(const step::NsBatchDesc& batch, const std::function<void(const step::NsView&, bool)>& fill,
                     const std::function<void(const step::NsView&)>& consume) override {
    for (int64_t k = 0; k < batch.count; ++k) shapes.emplace_back(batch.rows, batch.cols);
    inner_.orthogonalize(batch, fill, consume);
  }
  std::vector<std::pair<int64_t, int64_t>> shapes;
};

/// A group rule with Gram NS (Polar Express, restart after 2), 5 steps.
step::GroupRule gram_rule(double lr, double weight_decay, bool nesterov = true, const char* adjust_lr = "none");
/// A group rule with standard NS (Keller Jordan's quintic), 5 steps.
step::GroupRule standard_rule(double lr, double weight_decay, bool nesterov = true, const char* adjust_lr = "none");

/// A mesh of `shape` (placements per mesh dim) whose rank r sits at its row-major coordinates.
inline layout::MeshPlacement row_major_mesh(std::vector<int64_t> shape, std::vector<layout::DimPlacement> placements) {
  layout::MeshPlacement mp{shape, std::move(placements), {}};
  int64_t size = 1;
  for (int64_t s : shape) size *= s;
  for (int64_t r = 0; r < size; ++r) {
    std::vector<int64_t> c(shape.size());
    int64_t flat = r;
    for (size_t d = shape.size(); d-- > 0;) c[d] = flat % shape[d], flat /= shape[d];
    mp.rank_coords.push_back(c);
  }
  return mp;
}

}  // namespace dmuon::testing

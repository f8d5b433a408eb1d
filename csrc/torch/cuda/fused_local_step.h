// dmuon/torch/cuda/fused_local_step.h — the Muon step of whole local matrices on one GPU:
// per same-shape batch, a read-only check pass, then momentum, normalization, Newton–Schulz
// and apply with the fused kernels of ns/cuda/matrix_list.h, reading parameters, gradients
// and momentum buffers where they are (no stacked copies, no fp32 write-back of the result).
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <tuple>
#include <vector>

#include "../group_options.h"
#include "ns/cuda/matrix_list.h"
#include "ns/schedule.h"
#include "optim/gated_step.h"

namespace dmuon::torch_adapter {

/// True when (param, grad, momentum) can take the fused path: contiguous fp32 CUDA
/// tensors of one shape on one device, where the sm_90a symmetric kernel is usable (the
/// backend orthogonalize()'s "auto" picks there), when `enabled` (the runtime's fused_step:
/// Execution.fused_step or DMUON_FUSED_STEP). An undefined momentum stands for a buffer
/// not created yet (it will be made like the parameter).
bool fused_local_step_usable(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& momentum,
                             const MuonGroupOptions& options, bool enabled);

/// How many rows×cols matrices one fused batch may hold: its Newton–Schulz workspace
/// stays within `limit_bytes` (Execution.ns_batch_mb or DMUON_NS_BATCH_MB), and at least one.
int64_t fused_batch_capacity(int64_t rows, int64_t cols, const ns::Schedule& schedule, int64_t limit_bytes);

/// Whole rows×cols matrices of some parameters of one param group.
struct FusedBatch {
  int64_t group = 0, rows = 0, cols = 0;
  bool transposed = false;                     ///< matrices stored (in, out): the lr adjustment takes (cols, rows)
  std::vector<int> members;                    ///< parameter indices
  std::vector<ns::cuda::StepMatrix> matrices;  ///< every matrix of the members, in order
  std::vector<int> matrix_member;              ///< matrices[k] belongs to members[matrix_member[k]]
  bool same_tensors(const FusedBatch& other) const;
  /// What the batch computes, apart from its tensors: group, rows, cols, number of matrices.
  optim::GatedBatch problem() const { return {group, rows, cols, static_cast<int64_t>(matrices.size())}; }
};

/// The batch of `members` (params[i] etc. hold whole rows×cols matrices); an undefined
/// momentum buffer gives null momentum pointers (read as zeros by the check pass).
FusedBatch make_fused_batch(int64_t group, int64_t rows, int64_t cols, std::vector<int> members,
                            at::TensorList params, const std::vector<at::Tensor>& grads,
                            const std::vector<at::Tensor>& momenta);

/// Pass 1 on the current stream: returns the partial sums for fused_update; with `flags`
/// (int32 CUDA [matrices, 2], zeros) also marks gradients [k][0] and momentum buffers [k][1]
/// that hold NaN/Inf. Writes nothing else.
at::Tensor fused_check(const FusedBatch& batch, const MuonGroupOptions& options, const at::Tensor& like,
                       const at::Tensor& flags);

/// Passes 2 and 3 on the current stream: momentum and parameters in place (momentum
/// buffers defined). A non-finite result entry is not applied (only the decay is) and
/// sets `flag` (int32 CUDA scalar) to 1. `phase_done` (may be empty) is called after the
/// "ns" and "apply" phases are enqueued. `gate` (undefined, or an int32 CUDA scalar that
/// earlier kernels of the stream write): non-zero at run time makes both passes write
/// nothing (the iterate gets zeros, so Newton–Schulz still runs on finite numbers).
/// `graphs`: replay the Newton–Schulz iteration as a CUDA graph (the runtime's cuda_graphs).
void fused_update(const FusedBatch& batch, const MuonGroupOptions& options, const ns::Schedule& schedule,
                  const at::Tensor& partials, const at::Tensor& like, const at::Tensor& flag,
                  const std::function<void(const char* phase)>& phase_done, bool graphs,
                  const at::Tensor& gate = at::Tensor());

/// The stream count of the gated fused step (optim::gated_stream_count): `requested` when
/// not 0, else DMUON_FUSED_STREAMS (default 2).
int fused_stream_count(int64_t requested);

/// The stream index of each batch among `num_streams` (optim::gated_batch_streams: spread
/// only when the batches are `warm`, those of the previous gated step; else all on 0).
std::vector<int> fused_batch_streams(const std::vector<FusedBatch>& batches, const std::vector<optim::GatedBatch>& warm,
                                     const std::vector<ns::Schedule>& schedules, int num_streams);

/// Calls run(k) for every k in order, with the current CUDA stream of `device` set to
/// stream stream_of[k]: 0 is the caller's current stream, i > 0 a stream of dmuon's own
/// for the device (the same one on every call, so that the CUDA graphs kept per stream are
/// reused). The other streams start after the work enqueued so far on the caller's stream,
/// and the caller's stream waits for all of them before this returns (also on an error).
/// Returns how many streams that is (1 + the largest index; 1 for no batches).
int run_on_streams(const std::vector<int>& stream_of, const at::Device& device,
                   const std::function<void(size_t)>& run);

}  // namespace dmuon::torch_adapter

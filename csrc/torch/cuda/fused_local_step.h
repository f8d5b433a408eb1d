// dmuon/torch/cuda/fused_local_step.h — the Muon step of whole local matrices on one GPU:
// per same-shape batch, momentum, normalization, Newton–Schulz and apply with the fused
// kernels of ns/cuda/matrix_list.h, reading parameters, gradients and momentum buffers
// where they are (no stacked copies, no fp32 write-back of the result).
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <vector>

#include "../group_options.h"
#include "ns/schedule.h"

namespace dmuon::torch_adapter {

/// True when (param, grad, momentum) can take the fused path: contiguous fp32 CUDA
/// tensors of one shape on one device, where the sm_90a symmetric kernel is usable (the
/// backend orthogonalize()'s "auto" picks there), unless DMUON_FUSED_STEP=0.
bool fused_local_step_usable(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& momentum,
                             const MuonGroupOptions& options);

/// How many rows×cols matrices one fused batch may hold: its Newton–Schulz workspace
/// stays within DMUON_NS_BATCH_MB (default 2048) MiB, and at least one.
int64_t fused_batch_capacity(int64_t rows, int64_t cols, const ns::Schedule& schedule);

/// One batch: every tensor of the lists holds whole rows×cols matrices (numel a multiple
/// of rows·cols), all usable (fused_local_step_usable) and of one param group. Updates
/// the momentum buffers and parameters in place, on the current stream. A non-finite
/// result entry is not applied (only the decay is) and sets `flag` (int32 CUDA scalar)
/// to 1. `phase_done` (may be empty) is called after "momentum", "ns" and "apply" are
/// enqueued.
void fused_local_batch(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
                       const std::vector<at::Tensor>& momenta, int64_t rows, int64_t cols,
                       const MuonGroupOptions& options, const ns::Schedule& schedule, const at::Tensor& flag,
                       const std::function<void(const char* phase)>& phase_done);

}  // namespace dmuon::torch_adapter

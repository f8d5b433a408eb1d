// dmuon/torch/muon_step.h — one single-process Muon step over a list of parameters.
#pragma once

#include <ATen/ATen.h>

#include <string>

namespace dmuon::torch_adapter {

/// Options shared by every parameter of one Muon param group.
struct MuonGroupOptions {
  double lr = 0.0;
  double weight_decay = 0.0;
  double momentum = 0.95;
  bool nesterov = true;
  std::string adjust_lr = "none";
  std::string algorithm = "gram";
  std::vector<double> coefficients;   // a, b, c per step
  std::vector<int64_t> restart_after;
  double eps = 1e-7;
};

/// For each parameter: momentum on its buffer, Newton–Schulz of the (Nesterov) update
/// batched with every other matrix of the same shape and device, then
/// p ← p·(1 − lr·wd) − lr·ratio(m, n)·O. batch_dims[i] is 1 for a [E, m, n] stack of
/// independent matrices and 0 when trailing dims are flattened into columns (convs).
/// Transactional: when any orthogonalized update is not finite it throws naming the index
/// of the first such parameter, and neither parameters nor momentum buffers have changed.
void muon_step(at::TensorList params, at::TensorList grads, at::TensorList momentum_buffers,
               at::IntArrayRef batch_dims, const MuonGroupOptions& options);

/// Matrix view [B, m, n] of a parameter-shaped tensor (see batch_dims above).
at::Tensor as_matrix_batch(const at::Tensor& t, int64_t batch_dims);

}  // namespace dmuon::torch_adapter

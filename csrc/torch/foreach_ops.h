// dmuon/torch/foreach_ops.h — multi-tensor (torch._foreach_*) forms of the step's
// per-parameter work, so a step costs a few launches per bucket instead of a few per
// parameter (on GPUs the per-parameter launches, not the math, dominated small models).
#pragma once

#include <ATen/ATen.h>

#include <vector>

namespace dmuon::torch_adapter {

/// One bool per tensor (on the first tensor's device, in input order): true where the
/// tensor holds NaN or ±Inf. Multi-tensor max-abs norms grouped by device and dtype.
at::Tensor nonfinite_flags(at::TensorList tensors);

/// buffers[i] ← lerp(buffers[i], grads[i], weight), in place, for every i.
void foreach_lerp_(std::vector<at::Tensor>& buffers, const std::vector<at::Tensor>& grads, double weight);

/// params[i] ← params[i]·decay + scale·updates[i] (updates converted to the parameter's
/// dtype and shape first). NOTE: one scale per call keeps add_'s arithmetic (p + α·u),
/// the same as the per-parameter form.
void foreach_apply_(std::vector<at::Tensor>& params, const std::vector<at::Tensor>& updates,
                    double scale, double decay);

}  // namespace dmuon::torch_adapter

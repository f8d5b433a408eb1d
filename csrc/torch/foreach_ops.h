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

/// params[i] ← params[i]·decays[i] + scales[i]·updates[i] (updates converted to the
/// parameter's dtype and shape first): one multi-tensor call per distinct (scale, decay).
/// NOTE: a single scale per call keeps add_'s arithmetic (p + α·u), the same as the
/// per-parameter form, so results do not depend on how parameters are grouped.
void apply_updates_(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& updates,
                    const std::vector<double>& scales, const std::vector<double>& decays);

}  // namespace dmuon::torch_adapter

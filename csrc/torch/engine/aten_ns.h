// dmuon/torch/engine/aten_ns.h — Newton–Schulz through ATen's batched products, on any
// device and in any floating dtype: the float64 parameters' NS (engine/aten_float64_ops.h)
// and the "aten" backend of the test op torch.ops.dmuon_testing.orthogonalize.
#pragma once

#include <ATen/ATen.h>

#include "ns/schedule.h"

namespace dmuon::torch_adapter {

/// Orthogonalizes every matrix of `batch` [B, rows, cols]: normalized by its Frobenius norm
/// (clamped at schedule.eps) in float32 (float64 for a float64 `dtype`), made wide, iterated
/// in `dtype` (float64, float32, float16 or bfloat16). Returns `dtype` [B, rows, cols].
at::Tensor aten_orthogonalize(const at::Tensor& batch, const ns::Schedule& schedule, at::ScalarType dtype);

}  // namespace dmuon::torch_adapter

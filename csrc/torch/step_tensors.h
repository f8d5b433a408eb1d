// dmuon/torch/step_tensors.h — torch tensors as the step engine's descriptors (element
// types, devices, buffers) and back. The engine's device ops: engine/torch_ops.h.
#pragma once

#include <ATen/ATen.h>

#include <string>

#include "step/types.h"

namespace dmuon::torch_adapter {

/// The engine's element type of `type`; throws naming `what` for one it has none of.
step::DType step_dtype(at::ScalarType type, const std::string& what);
/// The torch dtype of an engine element type.
at::ScalarType scalar_type(step::DType dtype);
/// "float32" | "float64" | "bfloat16" | "float16" → the engine's element type; the error
/// names `what`.
step::DType parse_step_dtype(const std::string& name, const std::string& what);

/// A view of a contiguous CPU or CUDA tensor; an empty one: an empty view of its dtype and
/// device; an undefined one: an empty view. The errors name `what`.
step::Buffer to_buffer(const at::Tensor& tensor, const std::string& what);
/// A flat at::Tensor viewing `buffer` (no copy; the buffer must outlive it).
at::Tensor tensor_view(const step::Buffer& buffer);
/// The torch device of an engine device.
at::Device torch_device(const step::Device& device);

}  // namespace dmuon::torch_adapter

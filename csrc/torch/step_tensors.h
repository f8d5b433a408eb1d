// dmuon/torch/step_tensors.h — torch tensors as the step engine's descriptors, and the
// engine's device ops for a runtime's device (CPU, or CUDA on a stream of the caller's).
#pragma once

#include <ATen/ATen.h>
#include <c10/core/Stream.h>

#include <memory>
#include <optional>
#include <string>

#include "step/device_ops.h"
#include "step/types.h"

namespace dmuon::torch_adapter {

/// The engine's element type of `type`; throws naming `what` for one it has none of.
step::DType step_dtype(at::ScalarType type, const std::string& what);
/// The torch dtype of an engine element type.
at::ScalarType scalar_type(step::DType dtype);
/// "float32" | "float64" | "bfloat16" | "float16" → the engine's element type; the error
/// names `what`.
step::DType parse_step_dtype(const std::string& name, const std::string& what);

/// A view of a contiguous tensor (an undefined or storage-less one: an empty view).
step::Buffer to_buffer(const at::Tensor& tensor, const std::string& what);

/// The engine's ops for device_type "cpu" (at::parallel_for over a batch's matrices) or
/// "cuda" (the current device; every pass enqueued on `stream`, memory from torch's
/// caching allocator). Throws naming the device type when this build has no such ops.
std::unique_ptr<step::DeviceOps> make_step_ops(const std::string& device_type, const std::optional<c10::Stream>& stream);

}  // namespace dmuon::torch_adapter

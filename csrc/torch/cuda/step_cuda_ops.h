// dmuon/torch/cuda/step_cuda_ops.h — the step engine's CUDA ops on a torch stream, with
// device memory from torch's caching allocator (no CUDA headers here).
#pragma once

#include <c10/core/Stream.h>

#include <memory>

#include "step/device_ops.h"

namespace dmuon::torch_adapter {

/// CudaOps on `stream`'s device, every pass enqueued on `stream`; memory from torch's
/// caching allocator, stream-ordered on it.
std::unique_ptr<step::DeviceOps> make_cuda_step_ops(const c10::Stream& stream);

}  // namespace dmuon::torch_adapter

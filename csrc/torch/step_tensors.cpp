// dmuon/torch/step_tensors.cpp — tensors → descriptors, and the ops of a device.
#include "step_tensors.h"

#include <ATen/Parallel.h>

#include "common/check.h"
#include "step/cpu/cpu_ops.h"
#if defined(DMUON_WITH_CUDA) && defined(DMUON_WITH_STEP_CUDA)
#include "cuda/step_cuda_ops.h"
#endif

namespace dmuon::torch_adapter {

step::DType step_dtype(at::ScalarType type, const std::string& what) {
  switch (type) {
    case at::kFloat: return step::DType::kFloat32;
    case at::kDouble: return step::DType::kFloat64;
    case at::kBFloat16: return step::DType::kBFloat16;
    case at::kHalf: return step::DType::kFloat16;
    case at::kInt: return step::DType::kInt32;
    default: DMUON_FAIL(what, ": dtype ", c10::toString(type), " is not float32, float64, bfloat16 or float16");
  }
}

at::ScalarType scalar_type(step::DType dtype) {
  switch (dtype) {
    case step::DType::kFloat32: return at::kFloat;
    case step::DType::kFloat64: return at::kDouble;
    case step::DType::kBFloat16: return at::kBFloat16;
    case step::DType::kFloat16: return at::kHalf;
    case step::DType::kInt32: return at::kInt;
  }
  DMUON_FAIL("scalar_type: unknown step dtype");
}

step::DType parse_step_dtype(const std::string& name, const std::string& what) {
  if (name == "float32") return step::DType::kFloat32;
  if (name == "float64") return step::DType::kFloat64;
  if (name == "bfloat16") return step::DType::kBFloat16;
  if (name == "float16") return step::DType::kFloat16;
  DMUON_FAIL(what, ": dtype must be float32, float64, bfloat16 or float16, got '", name, "'");
}

step::Buffer to_buffer(const at::Tensor& tensor, const std::string& what) {
  if (!tensor.defined() || tensor.numel() == 0) return {};
  DMUON_CHECK(tensor.is_contiguous(), what, " must be contiguous");
  step::Buffer b;
  b.data = tensor.data_ptr();
  b.dtype = step_dtype(tensor.scalar_type(), what);
  b.numel = tensor.numel();
  b.device = tensor.is_cuda() ? step::Device{step::DeviceKind::kCuda, tensor.get_device()} : step::Device{};
  DMUON_CHECK(tensor.is_cuda() || tensor.is_cpu(), what, " is on ", tensor.device().str(), ", not the CPU or CUDA");
  return b;
}

std::unique_ptr<step::DeviceOps> make_step_ops(const std::string& device_type, const std::optional<c10::Stream>& stream) {
  if (device_type == "cpu") {
    step::CpuOpsOptions options;
    // NOTE: a grain of one matrix: a batch's matrices are independent NS problems.
    options.parallel_for = [](int64_t n, const std::function<void(int64_t, int64_t)>& body) {
      at::parallel_for(0, n, 1, body);
    };
    return std::make_unique<step::CpuOps>(options);
  }
  DMUON_CHECK(device_type == "cuda", "device_type must be 'cpu' or 'cuda', got '", device_type, "'");
#if defined(DMUON_WITH_CUDA) && defined(DMUON_WITH_STEP_CUDA)
  DMUON_CHECK(stream.has_value(), "make_step_ops: the CUDA ops need a stream");
  return make_cuda_step_ops(*stream);
#else
  (void)stream;
  DMUON_FAIL("this build of dmuon has no CUDA step ops (built without CUDA)");
#endif
}

}  // namespace dmuon::torch_adapter

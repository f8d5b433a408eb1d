// dmuon/torch/step_tensors.cpp — tensors → descriptors.
#include "step_tensors.h"

#include "common/check.h"

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
  if (!tensor.defined()) return {};
  step::Buffer b;
  b.dtype = step_dtype(tensor.scalar_type(), what);
  b.numel = tensor.numel();
  b.device = tensor.is_cuda() ? step::Device{step::DeviceKind::kCuda, tensor.get_device()} : step::Device{};
  // NOTE: an empty view keeps its dtype and device: the engine checks an empty gradient's
  // dtype against its parameter's (items_ready), and reads nothing of it.
  if (b.numel == 0) return b;
  DMUON_CHECK(tensor.is_cuda() || tensor.is_cpu(), what, " is on ", tensor.device().str(), ", not the CPU or CUDA");
  DMUON_CHECK(tensor.is_contiguous(), what, " must be contiguous");
  b.data = tensor.data_ptr();
  return b;
}

at::Device torch_device(const step::Device& device) {
  if (device.kind == step::DeviceKind::kCuda) return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(device.index));
  return at::Device(at::kCPU);
}

at::Tensor tensor_view(const step::Buffer& buffer) {
  const auto options = at::TensorOptions().dtype(scalar_type(buffer.dtype)).device(torch_device(buffer.device));
  if (buffer.numel == 0) return at::empty({0}, options);
  return at::from_blob(buffer.data, {buffer.numel}, options);
}

}  // namespace dmuon::torch_adapter

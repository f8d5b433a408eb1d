// dmuon/torch/ops.cpp — TORCH_LIBRARY schemas and implementations of torch.ops.dmuon.*.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "common/check.h"
#include "foreach_ops.h"
#include "orthogonalize.h"

namespace dmuon::torch_adapter {
namespace {

// NOTE: dmuon::Error is not a c10::Error; rethrowing as one keeps the message and gives
// Python a RuntimeError through the dispatcher.
template <typename F>
auto translate_errors(F&& body) -> decltype(body()) {
  try {
    return body();
  } catch (const dmuon::Error& e) {
    TORCH_CHECK(false, e.what());
  }
}

at::Tensor orthogonalize_op(const at::Tensor& x, c10::string_view algorithm,
                            at::ArrayRef<double> coefficients, at::IntArrayRef restart_after,
                            double eps, c10::string_view backend, c10::string_view compute_dtype) {
  return translate_errors([&] {
    const auto schedule = make_schedule(std::string(algorithm), coefficients, restart_after, eps);
    return orthogonalize(x, schedule, std::string(backend), std::string(compute_dtype));
  });
}

// Bool [N] on the CPU: tensors[i] holds a NaN or ±Inf. One host sync for the whole list.
at::Tensor nonfinite_mask_op(at::TensorList tensors) {
  return nonfinite_flags(tensors).to(at::kCPU);
}

}  // namespace
}  // namespace dmuon::torch_adapter

TORCH_LIBRARY(dmuon, m) {
  m.def(
      "orthogonalize(Tensor x, str algorithm, float[] coefficients, int[] restart_after, "
      "float eps, str backend='auto', str compute_dtype='auto') -> Tensor");
  m.def("nonfinite_mask(Tensor[] tensors) -> Tensor");
}

TORCH_LIBRARY_IMPL(dmuon, CompositeExplicitAutograd, m) {
  m.impl("orthogonalize", &dmuon::torch_adapter::orthogonalize_op);
  m.impl("nonfinite_mask", &dmuon::torch_adapter::nonfinite_mask_op);
}

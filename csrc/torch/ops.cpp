// dmuon/torch/ops.cpp — TORCH_LIBRARY schemas and implementations of torch.ops.dmuon.*, the
// product's ops (test and bench ops: torch.ops.dmuon_testing, csrc/torch_testing/testing_ops.cpp).
#include <ATen/ATen.h>
#include <torch/library.h>

#include "op_errors.h"
#include "orthogonalize.h"

namespace dmuon::torch_adapter {
namespace {

at::Tensor orthogonalize_op(const at::Tensor& x, c10::string_view algorithm,
                            at::ArrayRef<double> coefficients, at::IntArrayRef restart_after,
                            double eps, c10::string_view backend, c10::string_view compute_dtype) {
  return translate_errors([&] {
    const auto schedule = make_schedule(std::string(algorithm), coefficients, restart_after, eps);
    return orthogonalize(x, schedule, std::string(backend), std::string(compute_dtype));
  });
}

}  // namespace
}  // namespace dmuon::torch_adapter

TORCH_LIBRARY(dmuon, m) {
  m.def(
      "orthogonalize(Tensor x, str algorithm, float[] coefficients, int[] restart_after, "
      "float eps, str backend='auto', str compute_dtype='auto') -> Tensor");
}

TORCH_LIBRARY_IMPL(dmuon, CompositeExplicitAutograd, m) {
  m.impl("orthogonalize", &dmuon::torch_adapter::orthogonalize_op);
}

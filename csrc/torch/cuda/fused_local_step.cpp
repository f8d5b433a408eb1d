// dmuon/torch/cuda/fused_local_step.cpp — batches of whole matrices through the fused kernels.
#include "fused_local_step.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>

#include "common/check.h"
#include "common/env.h"
#include "cuda_orthogonalize.h"
#include "ns/cuda/cuda_backend.h"
#include "ns/cuda/matrix_list.h"

namespace dmuon::torch_adapter {
namespace {

// NOTE: Gram NS iterates in fp16, standard NS in bf16 (DESIGN.md §3), as orthogonalize()'s "auto".
at::ScalarType iterate_dtype(const ns::Schedule& schedule) {
  return schedule.algorithm == ns::Algorithm::kGram ? at::kHalf : at::kBFloat16;
}

}  // namespace

bool fused_local_step_usable(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& momentum,
                             const MuonGroupOptions& options) {
  static const bool enabled = env::get_bool("DMUON_FUSED_STEP", true);
  if (!enabled || !param.is_cuda() || param.dim() < 2) return false;
  for (const at::Tensor* t : {&param, &grad, &momentum})
    if (!t->defined() || t->scalar_type() != at::kFloat || !t->is_contiguous() || t->device() != param.device() ||
        t->sizes() != param.sizes())
      return false;
  const ns::Algorithm algorithm = ns::parse_algorithm(options.algorithm);
  return cuda_sym_kernel_usable(param, algorithm == ns::Algorithm::kGram ? at::kHalf : at::kBFloat16);
}

int64_t fused_batch_capacity(int64_t rows, int64_t cols, const ns::Schedule& schedule) {
  static const int64_t limit_mb = env::get_int("DMUON_NS_BATCH_MB", 2048);
  DMUON_CHECK(limit_mb >= 1, "DMUON_NS_BATCH_MB must be at least 1, got ", limit_mb);
  const size_t one = ns::cuda::workspace_bytes(schedule.algorithm, 1, rows, cols);
  const size_t per_matrix = ns::cuda::workspace_bytes(schedule.algorithm, 2, rows, cols) - one;
  const size_t limit = static_cast<size_t>(limit_mb) << 20;
  if (one >= limit) return 1;
  return 1 + static_cast<int64_t>((limit - one) / std::max<size_t>(per_matrix, 1));
}

void fused_local_batch(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
                       const std::vector<at::Tensor>& momenta, int64_t rows, int64_t cols,
                       const MuonGroupOptions& options, const ns::Schedule& schedule, const at::Tensor& flag,
                       const std::function<void(const char* phase)>& phase_done) {
  DMUON_CHECK(!params.empty() && params.size() == grads.size() && params.size() == momenta.size(),
              "fused_local_batch: ", params.size(), " params, ", grads.size(), " grads, ", momenta.size(),
              " momentum buffers");
  DMUON_CHECK(flag.is_cuda() && flag.scalar_type() == at::kInt && flag.numel() == 1,
              "fused_local_batch: flag must be one int32 CUDA element");
  c10::cuda::CUDAGuard guard(params[0].device());
  auto done = [&](const char* phase) {
    if (phase_done) phase_done(phase);
  };

  // The matrices of every tensor, in list order.
  std::vector<ns::cuda::StepMatrix> matrices;
  const int64_t matrix_numel = rows * cols;
  for (size_t i = 0; i < params.size(); ++i) {
    DMUON_CHECK(params[i].numel() % matrix_numel == 0 && params[i].device() == params[0].device(),
                "fused_local_batch: parameter ", i, " of shape ", params[i].sizes(), " is not whole ", rows, "x",
                cols, " matrices on ", params[0].device());
    for (int64_t k = 0; k < params[i].numel() / matrix_numel; ++k)
      matrices.push_back({params[i].data_ptr<float>() + k * matrix_numel,
                          grads[i].data_ptr<float>() + k * matrix_numel,
                          momenta[i].data_ptr<float>() + k * matrix_numel});
  }
  const int64_t count = static_cast<int64_t>(matrices.size());
  const at::TensorOptions floats = params[0].options();
  at::Tensor partials = at::empty({ns::cuda::num_partials(count, rows, cols)}, floats);
  at::Tensor scales = at::empty({count}, floats);
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();

  // Pass 1: momentum in place and the partial sums of the update's squares.
  const ns::cuda::MomentumRule rule{options.momentum, options.nesterov};
  ns::cuda::momentum_partials(matrices.data(), count, rows, cols, rule, partials.data_ptr<float>(), stream);
  ns::cuda::partials_to_scales(partials.data_ptr<float>(), count, rows, cols, schedule.eps,
                               scales.data_ptr<float>(), stream);
  done("momentum");

  // Pass 2 inside the backend's run (the autotuner may repeat it), then pass 3 on its result.
  const at::ScalarType dtype = iterate_dtype(schedule);
  const ns::cuda::DType half = dtype == at::kHalf ? ns::cuda::DType::kFloat16 : ns::cuda::DType::kBFloat16;
  const bool use_kernel = cuda_sym_kernel_usable(params[0], dtype);
  const float* scale_ptr = scales.data_ptr<float>();
  const double update_scale = options.update_scale(rows, cols), decay = options.decay();
  int* flag_ptr = flag.data_ptr<int>();
  bool ns_reported = false;
  orthogonalize_cuda_prepared(
      count, rows, cols, schedule, dtype, use_kernel, params[0],
      [&](void* x, int64_t ld, cudaStream_t s) {
        ns::cuda::normalized_update(half, matrices.data(), count, rows, cols, rule, scale_ptr, x, ld, s);
      },
      [&](const void* result, int64_t ld, cudaStream_t s) {
        done("ns");
        ns_reported = true;
        ns::cuda::apply_result(half, result, ld, matrices.data(), count, rows, cols, update_scale, decay, flag_ptr,
                               s);
      });
  if (!ns_reported) done("ns");
  done("apply");
}

}  // namespace dmuon::torch_adapter

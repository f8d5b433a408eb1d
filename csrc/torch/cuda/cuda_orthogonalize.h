// dmuon/torch/cuda/cuda_orthogonalize.h — torch glue of the CUDA Newton–Schulz backend:
// current stream, caching-allocator workspace, and the kernel's one-time self-check.
#pragma once

#include <ATen/ATen.h>

#include <vector>

#include "ns/schedule.h"

namespace dmuon::torch_adapter {

/// True when the sm_90a symmetric kernel is built, the tensor's GPU is sm_90 and the
/// kernel passed its numerical self-check on that GPU (run once per device and dtype).
bool cuda_sym_kernel_usable(const at::Tensor& x, at::ScalarType dtype);

/// Orthogonalize a [B, rows, cols] CUDA tensor with the CUDA backend, iterating in
/// `dtype` (float16 or bfloat16); returns fp32 [B, rows, cols]. use_kernel selects the
/// sm_90a symmetric kernel, otherwise dense cuBLASLt products mirrored.
at::Tensor orthogonalize_cuda(const at::Tensor& batch, const ns::Schedule& schedule,
                              at::ScalarType dtype, bool use_kernel);

/// [number of cached graphs, captures, replays, bytes of kept workspaces] (tests).
std::vector<int64_t> cuda_graph_stats();

/// One symmetric product on CUDA tensors (tests): D = α·A·Bᵀ + β·C for [B, m, k] inputs
/// A and B (fp16/bf16, row strides multiples of 8) and C [B, m, m] or undefined.
/// Returns D [B, m, m] (a view with padded rows), poisoned with NaN before the product.
at::Tensor cuda_sym_product(const at::Tensor& a, const at::Tensor& b, const at::Tensor& c,
                            double alpha, double beta, bool use_kernel);

}  // namespace dmuon::torch_adapter

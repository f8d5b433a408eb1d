// dmuon/torch/cuda/cuda_orthogonalize.h — torch glue of the CUDA Newton–Schulz backend:
// current stream, caching-allocator workspace, and the kernel's one-time self-check.
#pragma once

#include <ATen/ATen.h>

#include <cuda_runtime.h>

#include <functional>
#include <vector>

#include "ns/cuda/cuda_backend.h"
#include "ns/schedule.h"

namespace dmuon::torch_adapter {

/// True when the sm_90a symmetric kernel is built, the tensor's GPU is sm_90 and the
/// kernel passed its numerical self-check on that GPU (run once per device and dtype).
bool cuda_sym_kernel_usable(const at::Tensor& x, at::ScalarType dtype);

/// Orthogonalize a [B, rows, cols] CUDA tensor with the CUDA backend, iterating in
/// `dtype` (float16 or bfloat16); returns fp32 [B, rows, cols]. use_kernel selects the
/// sm_90a symmetric kernel, otherwise dense cuBLASLt products mirrored.
/// `graphs`: capture and replay the iteration as a CUDA graph (else always eager).
at::Tensor orthogonalize_cuda(const at::Tensor& batch, const ns::Schedule& schedule,
                              at::ScalarType dtype, bool use_kernel, bool graphs);

/// Consumes the 16-bit result of a run (wide orientation, leading dimension ld, batch
/// stride min(rows, cols)·ld), enqueued on `stream`; the buffer is reused by later runs.
using FinishResult = std::function<void(const void* result, int64_t ld, cudaStream_t stream)>;

/// The CUDA backend on a batch whose iterate the caller writes (`prepare`, see
/// ns::cuda::PrepareIterate) and whose result it consumes (`finish`), on the current
/// stream of `like`'s device: autotuned on first use, then (with `graphs`) replayed as a
/// CUDA graph.
void orthogonalize_cuda_prepared(int64_t num, int64_t rows, int64_t cols, const ns::Schedule& schedule,
                                 at::ScalarType dtype, bool use_kernel, const at::Tensor& like,
                                 const ns::cuda::PrepareIterate& prepare, const FinishResult& finish, bool graphs);

/// [number of cached graphs, captures, replays, bytes of kept workspaces] (tests).
std::vector<int64_t> cuda_graph_stats();

/// One symmetric product on CUDA tensors (tests): D = α·A·Bᵀ + β·C for [B, m, k] inputs
/// A and B (fp16/bf16, row strides multiples of 8) and C [B, m, m] or undefined.
/// Returns D [B, m, m] (a view with padded rows), poisoned with NaN before the product.
at::Tensor cuda_sym_product(const at::Tensor& a, const at::Tensor& b, const at::Tensor& c,
                            double alpha, double beta, bool use_kernel);

}  // namespace dmuon::torch_adapter

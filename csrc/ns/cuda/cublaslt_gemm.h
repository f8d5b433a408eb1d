// dmuon/ns/cuda/cublaslt_gemm.h — dense strided-batched products through cuBLASLt.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "ns/cuda/cuda_backend.h"

namespace dmuon::ns::cuda {

/// Problem descriptor of D = α·A·op(B) + β·C over a batch, all row-major 16-bit:
/// A m×k, B k×n (or n×k when transpose_b), C and D m×n. Strides in elements.
/// With `pointer_array`, a, b, c and d of gemm() are device arrays of `batch` pointers (one
/// matrix each; the strides are unused) that are all `alignment`-byte aligned.
struct GemmDesc {
  DType dtype = DType::kFloat16;
  bool transpose_b = false;
  int64_t batch = 1, m = 0, n = 0, k = 0;
  int64_t lda = 0, stride_a = 0, ldb = 0, stride_b = 0, ldc = 0, stride_c = 0, ldd = 0,
          stride_d = 0;
  bool pointer_array = false;
  int64_t alignment = 256;
};

/// The dense product A·Bᵀ (m×m) of a symmetric product's operands and layouts.
GemmDesc dense_desc(const SymProductArgs& args);

/// Enqueue the product on `stream` (fp32 accumulation, fp32 α/β, β·C in the epilogue).
/// `c` may be null when beta == 0. The cuBLASLt plan of each descriptor is cached.
/// `workspace` (may be null) lets cuBLASLt pick algorithms that need scratch space.
/// `algo_idx` picks the heuristic's algo_idx-th algorithm (0: its first choice; the
/// autotuner times the others, see gemm_num_algos).
void gemm(const GemmDesc& desc, double alpha, const void* a, const void* b, double beta,
          const void* c, void* d, void* workspace, size_t workspace_bytes, cudaStream_t stream,
          int algo_idx = 0);

/// How many algorithms cuBLASLt's heuristic offers for the product (at most 8).
/// `has_c`: whether β·C is used (C's layout then differs from D's).
int gemm_num_algos(const GemmDesc& desc, bool has_c, size_t workspace_bytes);

}  // namespace dmuon::ns::cuda

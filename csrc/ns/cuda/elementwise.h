// dmuon/ns/cuda/elementwise.h — the small fused kernels around the products: Frobenius
// normalization with the cast to 16 bits (and the transpose of tall matrices), the a·I
// term, the mirror of a lower triangle, and the write-back to fp32.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "ns/cuda/autotune_rules.h"
#include "ns/cuda/cuda_backend.h"

namespace dmuon::ns::cuda {

/// sum_squares[b] = Σ x² over matrix b of `batch` packed fp32 matrices of `numel` elements.
void sum_squares(const float* x, int64_t batch, int64_t numel, float* sum_squares,
                 cudaStream_t stream);

/// out[b] (m×ld_out, 16-bit) = in[b] / max(√sum_squares[b], eps), transposed when
/// `transpose` (in[b] is rows×cols packed fp32; m×n is the wide orientation). Padding
/// columns n..ld_out−1 are written as zeros.
void normalize_cast(DType dtype, const float* in, int64_t batch, int64_t rows, int64_t cols,
                    bool transpose, const float* sum_squares, double eps, void* out,
                    int64_t ld_out, cudaStream_t stream);

/// out[b] (rows×cols packed fp32) = in[b] (16-bit, m×ld_in), transposed back when `transpose`.
void write_back(DType dtype, const void* in, int64_t ld_in, int64_t batch, int64_t rows,
                int64_t cols, bool transpose, float* out, cudaStream_t stream);

/// q[b] = z[b] + a·I for batch m×m matrices (leading dimension ld, batch stride `stride`);
/// the sum is formed in fp32 and rounded once.
void add_identity(DType dtype, const void* z, double a, void* q, int64_t batch, int64_t m,
                  int64_t ld, int64_t stride, cudaStream_t stream);

/// d[b][r][c] = d[b][c][r] for r < c: copies the lower triangle onto the upper one.
void mirror_lower(DType dtype, void* d, int64_t batch, int64_t m, int64_t ld, int64_t stride,
                  cudaStream_t stream);

/// Agreement of a 16-bit result d with a reference r (both batch × rows×cols, leading
/// dimension ld, batch stride `stride`): the autotuner's check of every candidate.
/// (CompareStats: ns/cuda/autotune_rules.h.)
/// Synchronous (waits for `stream`). `check_symmetric` needs rows == cols.
CompareStats compare_16bit(DType dtype, const void* d, const void* r, int64_t batch, int64_t rows,
                           int64_t cols, int64_t ld, int64_t stride, bool check_symmetric,
                           cudaStream_t stream);

}  // namespace dmuon::ns::cuda

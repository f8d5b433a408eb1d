// dmuon/ns/cuda/cuda_backend.h — Newton–Schulz on CUDA GPUs (torch-free entry points).
//
// The iterate is fp16 (Gram NS) or bf16 (standard NS); products accumulate in fp32.
// Symmetric products take the paths their SymMode allows (sym_product_args.h), tuned per
// shape: the sm_90a kernel (sm90_sym_product.cu) on sm_90, the portable lower-block and
// row-panel products (tri_sym_product.h) on any GPU, or a dense cuBLASLt product whose lower
// triangle is mirrored.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <functional>

#include "ns/cuda/sym_product_args.h"
#include "ns/schedule.h"

namespace dmuon::ns::cuda {

/// True when this build contains the sm_90a symmetric kernel.
bool sym_kernel_built();

/// True when the sm_90a kernel can run on `device` (built, and compute capability 9.0).
bool sym_kernel_supported(int device);

/// Leading dimension the CUDA backend uses for a row of `cols` 16-bit elements
/// (NOTE: TMA needs 16-byte aligned row strides, so rows are padded to 8 elements).
int64_t padded_ld(int64_t cols);

/// Bytes of the cuBLASLt workspace the backend gives every product.
/// NOTE: cuBLASLt's heuristic picks faster split/stream-K algorithms when it may use
/// scratch space; 32 MiB is what cuBLAS itself reserves per stream on Hopper.
inline constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;

/// Bytes of workspace orthogonalize() needs for `batch` rows×cols matrices.
size_t workspace_bytes(Algorithm algorithm, int64_t batch, int64_t rows, int64_t cols);

/// Orthogonalize `batch` packed row-major fp32 rows×cols matrices from `input` into
/// `output` (same layout; may alias input). Tall matrices are iterated transposed.
/// Each matrix is divided by max(‖X‖_F, eps) in fp32 before the cast to `dtype`.
/// Everything is enqueued on `stream`; `workspace` holds workspace_bytes(...) bytes,
/// 256-byte aligned.
void orthogonalize(const Schedule& schedule, DType dtype, SymMode sym_mode, const float* input,
                   float* output, int64_t batch, int64_t rows, int64_t cols, void* workspace,
                   size_t workspace_bytes, cudaStream_t stream);

/// Writes the normalized, wide 16-bit iterate of every matrix into `x` (batch × m × ld,
/// m = min(rows, cols), ld = padded_ld(max(rows, cols)), tall matrices transposed), on
/// `stream`. It may be called several times for one run (the autotuner's first run of a
/// problem re-runs the iteration), so it must not modify what it reads.
using PrepareIterate = std::function<void(void* x, int64_t ld, cudaStream_t stream)>;

/// The preparation orthogonalize() makes of `batch` packed fp32 rows×cols matrices: each
/// matrix's sum of squares into sum_squares[batch] (fp32), then the matrices divided by
/// max(√sum, eps) and cast into x (ld as for PrepareIterate; tall matrices transposed).
void prepare_packed(const Schedule& schedule, DType dtype, const float* input, int64_t batch, int64_t rows,
                    int64_t cols, float* sum_squares, void* x, int64_t ld, cudaStream_t stream);

/// orthogonalize() with the caller's preparation and without the write-back: returns the
/// workspace buffer that holds the 16-bit result (wide orientation, leading dimension
/// padded_ld(max(rows, cols)), batch stride m·ld).
const void* orthogonalize_prepared(const Schedule& schedule, DType dtype, SymMode sym_mode, int64_t batch,
                                   int64_t rows, int64_t cols, void* workspace, size_t workspace_bytes,
                                   cudaStream_t stream, const PrepareIterate& prepare);

/// The same run in parts, for CUDA-graph capture of the iteration: the caller prepares
/// the iterate buffer (iterate_buffer), then orthogonalize_iterate runs on workspace
/// buffers only (capturable once the shape's configurations are tuned) and returns the
/// buffer holding the result, which orthogonalize_finish writes back into `output`.
void* iterate_buffer(const Schedule& schedule, int64_t batch, int64_t rows, int64_t cols, void* workspace,
                     size_t workspace_bytes);
void* orthogonalize_iterate(const Schedule& schedule, DType dtype, SymMode sym_mode, int64_t batch,
                            int64_t rows, int64_t cols, void* workspace, size_t workspace_bytes,
                            cudaStream_t stream);
void orthogonalize_finish(DType dtype, const void* result, int64_t batch, int64_t rows, int64_t cols,
                          float* output, cudaStream_t stream);

/// One symmetric product (SymProductArgs, ns/cuda/sym_product_args.h) with `mode`.
void sym_product(const SymProductArgs& args, SymMode mode, cudaStream_t stream);

}  // namespace dmuon::ns::cuda

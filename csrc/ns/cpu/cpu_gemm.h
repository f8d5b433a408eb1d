// dmuon/ns/cpu/cpu_gemm.h — a packed, cache-blocked GEMM for the CPU backend.
//
// NOTE: the core is torch-free and must build on machines without a BLAS development
// package (the GPU machines have none), so it carries this small GEMM. It is
// single-threaded; the caller parallelizes over independent matrices.
#pragma once

#include <cstdint>

namespace dmuon::ns::cpu {

/// D = α·A·op(B) + β·C for one row-major matrix, op(B) = Bᵀ when `transpose_b`.
/// A is M×K (lda), op(B) is K×N, C and D are M×N (ldc, ldd); C may be null when β = 0
/// and must not alias D. With `lower_only`, only tiles touching the lower triangle
/// (M == N) are computed and the upper triangle is then mirrored from the lower one:
/// the result is exactly symmetric, which is how symmetric products are formed.
template <typename T>
void gemm(bool transpose_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda,
          const T* B, int64_t ldb, T beta, const T* C, int64_t ldc, T* D, int64_t ldd,
          bool lower_only);

}  // namespace dmuon::ns::cpu

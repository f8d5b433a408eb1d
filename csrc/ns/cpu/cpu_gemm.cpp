// dmuon/ns/cpu/cpu_gemm.cpp — packed GEMM: B panels (KC×NC) and A panels (MC×KC) are
// copied into contiguous, zero-padded micro-panels and a MR×NR register tile is
// accumulated over KC at a time.
#include "ns/cpu/cpu_gemm.h"

#include <algorithm>
#include <vector>

#include "common/check.h"

namespace dmuon::ns::cpu {
namespace {

// NOTE: MR×NR = 4×16 floats keeps the accumulators in 16 SSE (8 AVX) registers once GCC
// vectorizes the inner j loop; KC×NR of B (16 KiB) stays in L1, MC×KC of A in L2.
constexpr int64_t kMr = 4;
constexpr int64_t kNr = 16;
constexpr int64_t kMc = 128;
constexpr int64_t kKc = 256;
constexpr int64_t kNc = 1024;

// Pack op(B)[p0:p0+kc, j0:j0+nc] as ceil(nc/NR) panels of [kc][NR], zero-padded.
template <typename T>
void pack_b(bool transpose_b, const T* B, int64_t ldb, int64_t p0, int64_t kc, int64_t j0,
            int64_t nc, T* packed) {
  for (int64_t jr = 0; jr < nc; jr += kNr) {
    const int64_t nr = std::min(kNr, nc - jr);
    T* panel = packed + (jr / kNr) * kc * kNr;
    for (int64_t p = 0; p < kc; ++p) {
      T* row = panel + p * kNr;
      for (int64_t j = 0; j < nr; ++j) {
        const int64_t col = j0 + jr + j;
        row[j] = transpose_b ? B[col * ldb + p0 + p] : B[(p0 + p) * ldb + col];
      }
      for (int64_t j = nr; j < kNr; ++j) row[j] = T(0);
    }
  }
}

// Pack A[i0:i0+mc, p0:p0+kc] as ceil(mc/MR) panels of [kc][MR], zero-padded.
template <typename T>
void pack_a(const T* A, int64_t lda, int64_t i0, int64_t mc, int64_t p0, int64_t kc, T* packed) {
  for (int64_t ir = 0; ir < mc; ir += kMr) {
    const int64_t mr = std::min(kMr, mc - ir);
    T* panel = packed + (ir / kMr) * kc * kMr;
    for (int64_t p = 0; p < kc; ++p) {
      T* col = panel + p * kMr;
      for (int64_t i = 0; i < mr; ++i) col[i] = A[(i0 + ir + i) * lda + p0 + p];
      for (int64_t i = mr; i < kMr; ++i) col[i] = T(0);
    }
  }
}

// acc[MR][NR] = Σ_p a[p][:] ⊗ b[p][:]
template <typename T>
inline void micro_kernel(int64_t kc, const T* __restrict a, const T* __restrict b,
                         T (&acc)[kMr][kNr]) {
  for (int64_t i = 0; i < kMr; ++i)
    for (int64_t j = 0; j < kNr; ++j) acc[i][j] = T(0);
  for (int64_t p = 0; p < kc; ++p) {
    const T* __restrict bp = b + p * kNr;
    const T* __restrict ap = a + p * kMr;
    for (int64_t i = 0; i < kMr; ++i) {
      const T ai = ap[i];
      for (int64_t j = 0; j < kNr; ++j) acc[i][j] += ai * bp[j];
    }
  }
}

}  // namespace

template <typename T>
void gemm(bool transpose_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda,
          const T* B, int64_t ldb, T beta, const T* C, int64_t ldc, T* D, int64_t ldd,
          bool lower_only) {
  DMUON_CHECK(M >= 0 && N >= 0 && K >= 0, "gemm: negative size ", M, "x", N, "x", K);
  DMUON_CHECK(!lower_only || M == N, "gemm: lower_only needs a square result, got ", M, "x", N);
  DMUON_CHECK(beta == T(0) || C != nullptr, "gemm: beta != 0 needs C");
  DMUON_CHECK(C == nullptr || C != D, "gemm: C must not alias D");
  if (M == 0 || N == 0) return;

  // K == 0: the product is empty, D = β·C.
  if (K == 0) {
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) D[i * ldd + j] = beta == T(0) ? T(0) : beta * C[i * ldc + j];
    return;
  }

  std::vector<T> packed_b(static_cast<size_t>(std::min(kNc, N + kNr) / kNr + 1) * kKc * kNr);
  std::vector<T> packed_a(static_cast<size_t>(std::min(kMc, M + kMr) / kMr + 1) * kKc * kMr);
  T acc[kMr][kNr];

  for (int64_t j0 = 0; j0 < N; j0 += kNc) {
    const int64_t nc = std::min(kNc, N - j0);
    for (int64_t p0 = 0; p0 < K; p0 += kKc) {
      const int64_t kc = std::min(kKc, K - p0);
      const bool first_k_block = p0 == 0;
      pack_b(transpose_b, B, ldb, p0, kc, j0, nc, packed_b.data());
      for (int64_t i0 = 0; i0 < M; i0 += kMc) {
        const int64_t mc = std::min(kMc, M - i0);
        // Whole A block strictly above the diagonal: nothing to do for it.
        if (lower_only && j0 >= i0 + mc) continue;
        pack_a(A, lda, i0, mc, p0, kc, packed_a.data());
        for (int64_t jr = 0; jr < nc; jr += kNr) {
          const int64_t nr = std::min(kNr, nc - jr);
          for (int64_t ir = 0; ir < mc; ir += kMr) {
            const int64_t mr = std::min(kMr, mc - ir);
            const int64_t row0 = i0 + ir;
            const int64_t col0 = j0 + jr;
            if (lower_only && col0 >= row0 + mr) continue;  // tile strictly upper
            micro_kernel(kc, packed_a.data() + (ir / kMr) * kc * kMr,
                         packed_b.data() + (jr / kNr) * kc * kNr, acc);
            // Epilogue: the first K block applies β·C, later ones accumulate.
            for (int64_t i = 0; i < mr; ++i) {
              T* d_row = D + (row0 + i) * ldd + col0;
              if (first_k_block) {
                const T* c_row = C == nullptr ? nullptr : C + (row0 + i) * ldc + col0;
                for (int64_t j = 0; j < nr; ++j)
                  d_row[j] = alpha * acc[i][j] + (beta == T(0) ? T(0) : beta * c_row[j]);
              } else {
                for (int64_t j = 0; j < nr; ++j) d_row[j] += alpha * acc[i][j];
              }
            }
          }
        }
      }
    }
  }

  // Mirror the lower triangle onto the upper one.
  if (lower_only) {
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = i + 1; j < N; ++j) D[i * ldd + j] = D[j * ldd + i];
  }
}

template void gemm<float>(bool, int64_t, int64_t, int64_t, float, const float*, int64_t,
                          const float*, int64_t, float, const float*, int64_t, float*, int64_t,
                          bool);
template void gemm<double>(bool, int64_t, int64_t, int64_t, double, const double*, int64_t,
                           const double*, int64_t, double, const double*, int64_t, double*,
                           int64_t, bool);

}  // namespace dmuon::ns::cpu

// dmuon/ns/cuda/sym_product_args.h — the CUDA backend's element types, symmetric-product
// modes and the operands of one symmetric product: plain data, no CUDA headers, so that the
// host-side rules about them (sm90_sym_config.h, autotune_rules.h) build and are tested
// without a CUDA toolkit.
#pragma once

#include <cstddef>
#include <cstdint>

namespace dmuon::ns::cuda {

/// Element type of the half-precision iterate.
enum class DType { kFloat16, kBFloat16 };

/// Which symmetric-product paths a product may take; the autotuner picks among them per shape.
/// Paths: the sm_90a one-triangle kernel (TMA + WGMMA, "sm90:…"), the portable products (any
/// CUDA GPU, tri_plan.h: lower blocks "blk:<block>" and row panels "tri:<block>") and
/// cuBLASLt's dense product (lower → upper mirror, "lt:<i>").
enum class SymMode {
  kKernel,        ///< sm_90a kernel, portable or dense (sm_90 GPUs).
  kDenseMirror,   ///< dense only.
  kPortable,      ///< portable or dense (every other GPU, or the kernel unusable).
  kKernelOnly,    ///< sm_90a kernel only (forced).
  kPortableOnly,  ///< portable only, blocks or panels (forced).
  kBlocksOnly,    ///< portable lower blocks only (forced).
  kPanelsOnly,    ///< portable row panels only (forced).
};

/// One symmetric product D = α·A·Bᵀ + β·C over a batch of m×m results (A, B: m×k), all
/// row-major 16-bit matrices with leading dimensions and batch strides in elements.
/// For tests and the self-check. c may be null when beta == 0.
struct SymProductArgs {
  DType dtype = DType::kFloat16;
  int64_t batch = 1, m = 0, k = 0;
  const void* a = nullptr;
  int64_t lda = 0, stride_a = 0;
  const void* b = nullptr;
  int64_t ldb = 0, stride_b = 0;
  const void* c = nullptr;
  int64_t ldc = 0, stride_c = 0;
  void* d = nullptr;
  int64_t ldd = 0, stride_d = 0;
  double alpha = 1.0, beta = 0.0;
  /// Stream-ordered device scratch (the backend's cuBLASLt workspace): the split-K
  /// configurations ("sm90:sk-…") keep their partial tiles and counters there.
  void* scratch = nullptr;
  size_t scratch_bytes = 0;
};

}  // namespace dmuon::ns::cuda

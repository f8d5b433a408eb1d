// dmuon/ns/ns_bound.h — what a Newton–Schulz run must cost at least, kernel by kernel:
// the FLOPs each kernel executes and the bytes it must move, so that a measured step can be
// read against the design's own floor (torch-free; tests/cpp/test_ns_bound.cpp).
//
// The kernels are those of ns_algorithms.h (the same steps, walked by a counting backend),
// with 16-bit iterates as the CUDA backend runs them. A kernel's bytes: each distinct
// operand read once and its result written once, whole matrices (the design stores both
// triangles of every symmetric result). A symmetric product of m×k operands counts m²·k
// FLOPs (half the dense product), as plan::ns_flops does.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "ns/schedule.h"

namespace dmuon::ns {

/// Which primitive of ns_algorithms.h a kernel is.
enum class KernelKind { kSymmetric, kDense, kElementwise };

/// A product kernel as a general GEMM library would run it: `batch` results D (m×n) of
/// A (m×k) times B, plus β·C where `with_c`. A symmetric product is A·Bᵀ (B m×k, n = m), a
/// dense one A·B (B k×n). `same_operands`: A is B (X·Xᵀ, R·R).
struct ProductShape {
  KernelKind kind = KernelKind::kDense;
  int64_t batch = 1, m = 0, n = 0, k = 0;
  bool with_c = false;
  bool same_operands = false;

  bool operator==(const ProductShape& other) const;
  bool operator<(const ProductShape& other) const;
};

/// One kernel of a run: the FLOPs it executes, the bytes it must move, and its primitive
/// (sym_product, gemm, add_identity); for the products, their shape (batch 1).
struct KernelWork {
  double flops = 0.0;
  double bytes = 0.0;
  KernelKind kind = KernelKind::kDense;
  ProductShape product{};
};

/// One kernel's floor: the larger of its FLOPs at `flops_per_second` and its bytes at
/// `bytes_per_second`.
double kernel_bound_seconds(const KernelWork& kernel, double flops_per_second, double bytes_per_second);

/// Every kernel of one run of `schedule` under `algorithm` on one rows×cols matrix (the
/// iterate is min×max, `elem_bytes` a element), in launch order. A batch of b matrices
/// runs the same kernels with b times the work.
std::vector<KernelWork> ns_kernel_work(const Schedule& schedule, Algorithm algorithm, int64_t rows, int64_t cols,
                                       int elem_bytes = 2);

/// Seconds of `kernels` one after another, each at the larger of its FLOPs at
/// `flops_per_second` and its bytes at `bytes_per_second`.
double kernels_bound_seconds(const std::vector<KernelWork>& kernels, double flops_per_second,
                             double bytes_per_second);

/// Bytes a parameter costs the fused single-GPU step's memory passes (step/cuda/piece_kernels.h):
/// the check reads gradient and momentum (8), the normalized update reads them, writes the
/// momentum and the 16-bit iterate (14), the apply reads the result and the parameter
/// and writes the parameter (10).
inline constexpr double kFusedStepPassBytesPerParam = 32.0;

/// The floor of the fused single-GPU step over `shapes` (rows, cols of every Muon matrix).
struct StepBound {
  double ns_seconds = 0.0;      ///< Σ kernels_bound_seconds of each matrix's cheaper iteration
  double sym_seconds = 0.0;     ///< the part of ns_seconds in symmetric products
  double dense_seconds = 0.0;   ///< … in dense products
  double elementwise_seconds = 0.0;  ///< … in add_identity
  double passes_seconds = 0.0;  ///< kFusedStepPassBytesPerParam per parameter at bytes_per_second
  double ns_flops = 0.0;        ///< FLOPs of the iterations the bound chose
  double ns_bytes = 0.0;        ///< their bytes
  double pass_bytes = 0.0;
  double seconds() const { return ns_seconds + passes_seconds; }
};

/// Per matrix the iteration the CUDA backend may run (square Gram schedules run standard;
/// wide Gram schedules the cheaper of Gram and standard, as the autotuner picks by time;
/// standard schedules standard), each kernel at its floor, one after another.
StepBound fused_step_bound(const std::vector<std::pair<int64_t, int64_t>>& shapes, const Schedule& schedule,
                           double flops_per_second, double bytes_per_second);

/// One batch of the step's Newton–Schulz: `count` rows×cols matrices run together.
struct NsBatch {
  int64_t count = 1, rows = 0, cols = 0;
};

/// The distinct products, sorted, of every iteration the CUDA backend may run on each of
/// `batches` (as fused_step_bound chooses among them), each with its batch's count.
std::vector<ProductShape> step_products(const std::vector<NsBatch>& batches, const Schedule& schedule);

/// The floor of the fused step with each product at a measured time of the dense GEMM of
/// its shape: `dense_seconds[i]` for step_products(batches, schedule)[i]. A dense product
/// takes that time; a symmetric one half of it (its FLOPs, half the dense product's, at the
/// rate the GEMM reached); each at least its bytes at `bytes_per_second`. add_identity and
/// the memory passes at `bytes_per_second`; per batch the cheaper iteration.
/// NOTE: this asks what the step would cost if every product ran as efficiently per FLOP as
/// the GEMM library does on that shape; the peak floor asks it at the best shape's rate.
StepBound measured_step_bound(const std::vector<NsBatch>& batches, const Schedule& schedule,
                              const std::vector<double>& dense_seconds, double bytes_per_second);

}  // namespace dmuon::ns

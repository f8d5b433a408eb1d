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

/// One kernel of a run: the FLOPs it executes, the bytes it must move, and its primitive
/// (sym_product, gemm, add_identity).
struct KernelWork {
  double flops = 0.0;
  double bytes = 0.0;
  KernelKind kind = KernelKind::kDense;
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

/// Bytes a parameter costs the fused single-GPU step's memory passes (matrix_list.h):
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

}  // namespace dmuon::ns

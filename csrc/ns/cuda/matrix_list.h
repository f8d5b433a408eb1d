// dmuon/ns/cuda/matrix_list.h — the fused single-GPU step around Newton–Schulz, over lists
// of same-shape fp32 matrices that live in separate allocations (parameters, gradients,
// momentum buffers): no stacked copies.
//
// Per batch of matrices (one param group, one shape), three passes over memory:
//   1. check_partials      reads grad and momentum: partial sums of U² of the update the
//                          step will make (U = lerp(grad, lerp(momentum, grad, 1 − μ), μ)
//                          with Nesterov, else the new momentum) and NaN/Inf flags; writes
//                          nothing, so a step with a bad gradient changes nothing
//   2. normalized_update   the new momentum (written once) and U / max(‖U‖_F, eps) cast to
//                          16 bits into the NS iterate (wide orientation; tall matrices
//                          transposed)
//   3. apply_result        param ← param·decay + scale·O, O read from the NS result
// NOTE: 8 + 14 + 10 = 32 bytes per parameter (reads and writes), NaN/Inf check included,
// against about 88 for the same work as separate multi-tensor ops with a stacked fp32
// copy, a 16-bit cast, an fp32 write-back and separate checks; the partial sums are
// reduced in a fixed order, so the step is deterministic.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "ns/cuda/cuda_backend.h"

namespace dmuon::ns::cuda {

/// One matrix of a fused step: rows×cols fp32, each row-major and contiguous.
struct StepMatrix {
  float* param = nullptr;
  const float* grad = nullptr;
  float* momentum = nullptr;
};

/// The momentum rule of one param group (torch.optim.Muon's: EMA via lerp, Nesterov).
struct MomentumRule {
  double momentum = 0.95;
  bool nesterov = true;
};

/// Floats of scratch that momentum_partials() fills for `count` rows×cols matrices.
int64_t num_partials(int64_t count, int64_t rows, int64_t cols);

/// Pass 1 (see the file header) over matrices[0, count). A null momentum reads as zeros.
/// flags (int32 [count, 2], zeroed by the caller; may be null): [b][0] |= 1 when grad b
/// holds NaN/Inf, [b][1] |= 1 when momentum b does.
void check_partials(const StepMatrix* matrices, int64_t count, int64_t rows, int64_t cols, MomentumRule rule,
                    float* partials, int* flags, cudaStream_t stream);

/// scales[b] = 1 / max(√(Σ partials of matrix b), eps), summed in a fixed order.
void partials_to_scales(const float* partials, int64_t count, int64_t rows, int64_t cols, double eps,
                        float* scales, cudaStream_t stream);

/// Pass 2: iterate b (m×ld 16-bit, m ≤ n the wide orientation, row-major; transposed when
/// rows > cols; padding columns zero) = scales[b]·U_b. With update_momentum the momentum
/// is first updated in place (lerp towards grad); without, it is read as already updated,
/// so the pass can run again (the autotuner re-runs a problem's first iteration).
/// skip (device int, may be null): when non-zero at run time, nothing is written but zeros
/// into the iterate (the step's gate: a bad gradient anywhere leaves every state as it was).
void normalized_update(DType dtype, const StepMatrix* matrices, int64_t count, int64_t rows,
                       int64_t cols, MomentumRule rule, bool update_momentum, const float* scales,
                       void* iterate, int64_t ld, cudaStream_t stream, const int* skip = nullptr);

/// Pass 3: param ← param·decay + scale·O_b, O_b the 16-bit result b (wide orientation,
/// leading dimension ld). A non-finite entry of O counts as 0 (only the decay applies)
/// and sets *nonfinite_flag to 1. skip (device int, may be null): when non-zero at run
/// time, nothing is written.
void apply_result(DType dtype, const void* result, int64_t ld, const StepMatrix* matrices,
                  int64_t count, int64_t rows, int64_t cols, double scale, double decay,
                  int* nonfinite_flag, cudaStream_t stream, const int* skip = nullptr);

}  // namespace dmuon::ns::cuda

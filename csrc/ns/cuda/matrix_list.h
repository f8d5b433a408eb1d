// dmuon/ns/cuda/matrix_list.h — the one-GPU step's normalized update over a list of
// same-shape fp32 matrices that live in separate allocations (gradients, momentum
// buffers): no stacked copies. The step's other passes (check, apply) and this one over
// row pieces and other dtypes: step/cuda/piece_kernels.h.
//
// normalized_update writes the new momentum (once) and U / max(‖U‖_F, eps) cast to 16 bits
// into the NS iterate (wide orientation; tall matrices transposed), U = lerp(grad,
// momentum, μ) with Nesterov, else the new momentum: 14 bytes per parameter.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "ns/cuda/cuda_backend.h"

namespace dmuon::ns::cuda {

/// One matrix of a fused step: rows×cols fp32, each row-major and contiguous.
struct StepMatrix {
  const float* grad = nullptr;
  float* momentum = nullptr;
};

/// The momentum rule of one param group (torch.optim.Muon's: EMA via lerp, Nesterov).
struct MomentumRule {
  double momentum = 0.95;
  bool nesterov = true;
};

/// Iterate b (m×ld 16-bit, m ≤ n the wide orientation, row-major; transposed when
/// rows > cols; padding columns zero) = scales[b]·U_b. With update_momentum the momentum
/// is first updated in place (lerp towards grad); without, it is read as already updated,
/// so the pass can run again (the autotuner re-runs a problem's first iteration).
/// skip (device int, may be null): when non-zero at run time, nothing is written but zeros
/// into the iterate (the step's gate: a bad gradient anywhere leaves every state as it was).
void normalized_update(DType dtype, const StepMatrix* matrices, int64_t count, int64_t rows,
                       int64_t cols, MomentumRule rule, bool update_momentum, const float* scales,
                       void* iterate, int64_t ld, cudaStream_t stream, const int* skip = nullptr);

}  // namespace dmuon::ns::cuda

// dmuon/step/cuda/normuon_kernels.h — NorMuon's row normalization of an NS result on CUDA
// (Li et al., 2025, "NorMuon: Making Muon more efficient and scalable"; the rule and its
// rescale are optim/normuon.h's), torch-free, on the batch's own stream.
//
// Two launches per NS batch, over the listed matrices of its 16-bit result (the iterate
// layout: wide orientation, transposed for tall items, padded ld):
//   row sums   Σ_j O_ij² per item row, float, in a fixed order (deterministic)
//   moments    per matrix: ‖O‖², v_next, the divisors √v + ε, ‖Ô‖², the row factors
//              keep/d_i; v written and the matrix marked as scaled only where O is finite
//              and the gate is open (else v kept; the flag raised when not finite)
// The result itself is not written: its consumers (result_to_pieces, apply_result) multiply
// each row by its factor as they read it (IterateView::row_scale).
// NOTE: a third pass scaling O in place cost a read and a write of the whole result:
// NorMuon's step cost on Qwen2.5-1.5B was +4.6% and +5.8% of the step in two runs with it
// (BENCHMARKS.md, "NorMuon's CUDA pass").
// Sums of the moments in double, as the CPU rule; the row sums in float (bounded by the
// 16-bit result they read: a relative 1e-6 against its 4e-3 rounding).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "step/cuda/piece_kernels.h"

namespace dmuon::step::cuda {

/// One matrix of the batch and its state: v, float32 [rows], written in place.
struct NormuonDesc {
  float* v = nullptr;
  int64_t matrix_idx = 0;
  int flag_idx = 0;  ///< flags[flag_idx] ← 1 when the matrix's O is not finite (gate open)
};

/// Bytes of scratch normuon() needs for `listed` matrices of a batch of `count` matrices of
/// `rows` item rows.
int64_t normuon_scratch_bytes(int64_t listed, int64_t count, int64_t rows);

/// Row factors of a batch, in normuon()'s scratch: factors[k·rows + i] of matrix k where
/// scaled[k] is non-zero (the listed matrices whose update was normalized).
struct RowScale {
  const float* factors = nullptr;
  const int* scaled = nullptr;
};

/// NorMuon's moments of `matrices` of `result` (16-bit; a batch of `count` matrices), with
/// β₂ and ε: v updated and the row factors returned (in `scratch`, which holds
/// normuon_scratch_bytes(matrices.size(), count, result.rows) bytes, stream-ordered).
RowScale normuon(const IterateView& result, int64_t count, const std::vector<NormuonDesc>& matrices, double beta2,
                 double eps, void* scratch, int* flags, const int* skip, cudaStream_t stream);

}  // namespace dmuon::step::cuda

// dmuon/optim/normuon.h — NorMuon's row normalization of an orthogonalized update
// (Li et al., 2025, "NorMuon: Making Muon more efficient and scalable", arXiv:2510.05491).
//
// After Newton–Schulz gives O (rows×cols), with v a per-row second moment (float32 state):
//   v_i ← β₂·v_i + (1 − β₂)·mean_j O_ij²
//   Ô_ij = O_ij / (√v_i + ε)
//   Ô ← Ô · ‖O‖_F / ‖Ô‖_F          (the update keeps O's overall size)
// and then the usual p ← p·(1 − lr·wd) − lr·ratio(m, n)·Ô.
// Rows are the matrix's rows as stored in the parameter (a Linear weight's output
// neurons), whatever orientation Newton–Schulz iterated in.
// NOTE: the rescale: the paper's Algorithm 1 scales Ô to an RMS of 0.2·lr·√(mn)/‖Ô‖_F,
// i.e. ‖Ô‖_F·lr_eff = 0.2·lr·√(mn); modded-nanogpt's NorMuon keeps ‖Ô‖_F = ‖O‖_F and leaves
// the size to the usual lr adjustment. We keep ‖O‖_F so that adjust_lr keeps its meaning
// (adjust_lr="match_rms_adamw" gives the paper's 0.2·√max(m, n) scale of an orthogonal O).
#pragma once

#include <cstdint>

namespace dmuon::optim {

/// NorMuon's options of a param group (off by default).
struct NormuonRule {
  bool enabled = false;
  double beta2 = 0.95;
  double eps = 1e-8;
  /// Throws dmuon::Error naming normuon_beta2 or normuon_eps when out of range.
  void validate() const;
  bool operator==(const NormuonRule& o) const {
    return enabled == o.enabled && beta2 == o.beta2 && eps == o.eps;
  }
};

/// Element (i, j) of a rows×cols matrix at data[i·ld + j], or at data[j·ld + i] when
/// `transposed` (stored cols×rows).
struct MatrixRef {
  int64_t rows = 0, cols = 0, ld = 0;
  bool transposed = false;
  int64_t at(int64_t i, int64_t j) const { return transposed ? j * ld + i : i * ld + j; }
};

/// NorMuon in place on one matrix O (float, double) with its v (float32 [rows]): sums in
/// double. Returns false, changing neither O nor v, when O is not finite (the caller's
/// apply refuses and flags such an update; v must not take a NaN). A zero O stays zero.
template <typename T>
bool normuon_matrix(T* o, const MatrixRef& m, float* v, const NormuonRule& rule);

}  // namespace dmuon::optim

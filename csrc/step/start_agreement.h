// dmuon/step/start_agreement.h — the one agreement before a step writes anything, and the
// messages every rank raises when it fails.
//
// One all_reduce (max) of a fixed size, whatever the model: the structure's signature
// (every rank must hold the same), the hash of which gradients this rank has, whether its
// own checks failed, its first non-finite gradient and momentum buffer, and whether its
// begun work is stale. Fixed so that ranks whose structures differ (a param group added
// on some ranks, a runtime made again on some) still meet in the same collective, learn it
// and raise. Only when it fails, one all_gather of each rank's texts names the cause: the
// failing rank raises its own error, every other rank names that rank; a structure or
// gradient that differs is named with every rank's view of it.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "step/transport.h"

namespace dmuon::step {

/// Values (int64) of the agreement's all_reduce, whatever the model.
inline constexpr int kStartAgreementValues = 12;

/// What the caller checked before the step (identical kinds of facts on every rank).
struct StartChecks {
  uint64_t signature = 0;  ///< the structure every rank must share (param groups, the runtime's inputs)
  std::string error;       ///< why this rank cannot step ("" when it can)
  /// The structure in words, one line per part ("Muon, 2 parameter(s), first 'w' (8, 8)"),
  /// compared line by line across ranks when the signatures differ.
  std::vector<std::string> describe;
  /// This rank's work begun before the step is stale (a gradient changed since it was
  /// handed over): every rank then drops its begun work and steps from the gradients as
  /// they are.
  bool changed = false;
};

/// This rank's facts of the step, from the engine's check (empty without one).
struct StartFacts {
  std::vector<bool> has_grad;  ///< per checked tensor (parameters, then check-only gradients)
  int first_nonfinite = -1;    ///< first index into has_grad whose gradient holds NaN/Inf
  int first_corrupt = -1;      ///< first parameter whose momentum buffer holds NaN/Inf
};

/// The agreed facts (the same on every rank).
struct StartAgreed {
  int first_nonfinite = -1;  ///< over every rank
  int first_corrupt = -1;    ///< over every rank
  bool changed = false;      ///< some rank's begun work is stale
};

/// Agrees on `checks` and `facts` over `transport` (one rank: no collective). Throws
/// dmuon::Error on every rank when some rank's checks failed, the signatures or the
/// gradients' presence differ; `what_of(i)` names has_grad's i-th tensor ("parameter 'w'").
StartAgreed agree_start(Transport& transport, const StartChecks& checks, const StartFacts& facts, int64_t step_idx,
                        const std::function<std::string(int)>& what_of);

}  // namespace dmuon::step

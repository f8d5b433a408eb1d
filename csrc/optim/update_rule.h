// dmuon/optim/update_rule.h — the scalar parts of the Muon update rule that do not
// depend on tensors: learning-rate adjustment per matrix shape.
#pragma once

#include <cstdint>
#include <string>

namespace dmuon::optim {

/// How the learning rate of a rows×cols matrix is scaled.
enum class AdjustLr {
  kNone,           ///< ratio 1
  kOriginal,       ///< √max(1, rows/cols), as torch.optim.Muon
  kMatchRmsAdamW,  ///< 0.2·√max(rows, cols) (Moonlight): update RMS ≈ AdamW's
  kSpectral,       ///< √(rows/cols)
};

/// Parse "none" | "original" | "match_rms_adamw" | "spectral"; the error names `adjust_lr`.
AdjustLr parse_adjust_lr(const std::string& name);

/// The factor that multiplies lr for a rows×cols matrix.
double adjusted_lr_ratio(AdjustLr mode, int64_t rows, int64_t cols);

}  // namespace dmuon::optim

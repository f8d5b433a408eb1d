// dmuon/optim/update_rule.cpp — learning-rate adjustment per matrix shape.
#include "optim/update_rule.h"

#include <algorithm>
#include <cmath>

#include "common/check.h"

namespace dmuon::optim {

AdjustLr parse_adjust_lr(const std::string& name) {
  if (name == "none") return AdjustLr::kNone;
  if (name == "original") return AdjustLr::kOriginal;
  if (name == "match_rms_adamw") return AdjustLr::kMatchRmsAdamW;
  if (name == "spectral") return AdjustLr::kSpectral;
  DMUON_FAIL("adjust_lr must be None, 'original', 'match_rms_adamw' or 'spectral', got '", name,
             "'");
}

double adjusted_lr_ratio(AdjustLr mode, int64_t rows, int64_t cols) {
  DMUON_CHECK(rows >= 1 && cols >= 1, "adjusted_lr_ratio: invalid matrix shape ", rows, "x", cols);
  const double r = static_cast<double>(rows), c = static_cast<double>(cols);
  switch (mode) {
    case AdjustLr::kNone: return 1.0;
    case AdjustLr::kOriginal: return std::sqrt(std::max(1.0, r / c));
    case AdjustLr::kMatchRmsAdamW: return 0.2 * std::sqrt(std::max(r, c));
    case AdjustLr::kSpectral: return std::sqrt(r / c);
  }
  DMUON_FAIL("unknown AdjustLr mode");
}

}  // namespace dmuon::optim

// Learning-rate adjustment per shape, against the formulas in docs/configuration.md (adjust_lr).
#include <gtest/gtest.h>

#include <cmath>

#include "common/check.h"
#include "optim/update_rule.h"

namespace {

using dmuon::optim::AdjustLr;

TEST(UpdateRule, AdjustedLrRatios) {
  EXPECT_DOUBLE_EQ(dmuon::optim::adjusted_lr_ratio(AdjustLr::kNone, 128, 512), 1.0);
  EXPECT_DOUBLE_EQ(dmuon::optim::adjusted_lr_ratio(AdjustLr::kOriginal, 512, 128), 2.0);
  EXPECT_DOUBLE_EQ(dmuon::optim::adjusted_lr_ratio(AdjustLr::kOriginal, 128, 512), 1.0);
  EXPECT_DOUBLE_EQ(dmuon::optim::adjusted_lr_ratio(AdjustLr::kMatchRmsAdamW, 100, 400), 4.0);
  EXPECT_DOUBLE_EQ(dmuon::optim::adjusted_lr_ratio(AdjustLr::kSpectral, 128, 512), 0.5);
}

TEST(UpdateRule, ParseErrorsNameTheOption) {
  EXPECT_EQ(dmuon::optim::parse_adjust_lr("spectral"), AdjustLr::kSpectral);
  try {
    dmuon::optim::parse_adjust_lr("cosine");
    FAIL();
  } catch (const dmuon::Error& e) {
    EXPECT_NE(std::string(e.what()).find("adjust_lr"), std::string::npos);
  }
  EXPECT_THROW(dmuon::optim::adjusted_lr_ratio(AdjustLr::kNone, 0, 3), dmuon::Error);
}

}  // namespace

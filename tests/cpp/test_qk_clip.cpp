// MuonClip's QK-clip factors (optim/qk_clip.h): multi-head and GQA rules, row expansion
// for a shard of rows, errors that name the option.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "common/check.h"
#include "optim/qk_clip.h"

namespace {

using dmuon::optim::qk_clip_factors;
using dmuon::optim::qk_clip_row_factors;

TEST(QkClip, MultiHeadSplitsTheFactor) {
  // τ = 10: head 0 under (factor 1), head 1 at 40 (γ = 1/4: √γ = 1/2 on q and k each).
  const auto f = qk_clip_factors({3.0, 40.0}, 2, 10.0);
  ASSERT_EQ(f.q.size(), 2u);
  ASSERT_EQ(f.k.size(), 2u);
  EXPECT_EQ(f.q[0], 1.0);
  EXPECT_EQ(f.k[0], 1.0);
  EXPECT_DOUBLE_EQ(f.q[1], 0.5);
  EXPECT_DOUBLE_EQ(f.k[1], 0.5);
  EXPECT_TRUE(f.any());
  EXPECT_FALSE(qk_clip_factors({3.0, 10.0}, 2, 10.0).any());  // at τ exactly: not clipped
}

TEST(QkClip, GroupedQueryPutsTheFactorOnQ) {
  // 4 q heads, 2 kv heads: q head 2 at 20 (γ = 1/2) takes all of it; k untouched.
  const auto f = qk_clip_factors({1.0, 2.0, 20.0, 5.0}, 2, 10.0);
  EXPECT_EQ(f.q, (std::vector<double>{1.0, 1.0, 0.5, 1.0}));
  EXPECT_EQ(f.k, (std::vector<double>{1.0, 1.0}));
}

TEST(QkClip, RowFactorsOfAShard) {
  // 3 heads of 4 rows; rows [3, 9) span heads 0, 1 and 2.
  const auto rows = qk_clip_row_factors({0.1, 0.2, 0.3}, 4, 3, 6);
  EXPECT_EQ(rows, (std::vector<double>{0.1, 0.2, 0.2, 0.2, 0.2, 0.3}));
  EXPECT_TRUE(qk_clip_row_factors({0.1}, 4, 4, 0).empty());
  EXPECT_THROW(qk_clip_row_factors({0.1, 0.2}, 4, 6, 3), dmuon::Error);
}

TEST(QkClip, ErrorsNameTheOption) {
  auto message = [](auto fn) {
    try {
      fn();
    } catch (const dmuon::Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message([] { qk_clip_factors({1.0}, 1, 0.0); }).find("tau"), std::string::npos);
  EXPECT_NE(message([] { qk_clip_factors({1.0, 2.0, 3.0}, 2, 5.0); }).find("num_kv_heads"), std::string::npos);
  EXPECT_NE(message([] { qk_clip_factors({1.0, NAN}, 2, 5.0); }).find("head 1"), std::string::npos);
  EXPECT_NE(message([] { qk_clip_row_factors({1.0}, 0, 0, 1); }).find("head_dim"), std::string::npos);
}

}  // namespace

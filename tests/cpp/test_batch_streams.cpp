// Tests of ns/batch_streams.h: shapes kept together, spread by cost, deterministic.
#include "ns/batch_streams.h"

#include <gtest/gtest.h>

#include <limits>

#include "common/check.h"

namespace dmuon::ns {
namespace {

TEST(BatchStreams, OneStreamTakesEverything) {
  const std::vector<int> s = assign_streams({{1, 5.0}, {2, 1.0}, {1, 5.0}}, 1);
  EXPECT_EQ(s, (std::vector<int>{0, 0, 0}));
}

TEST(BatchStreams, ShapesStayTogetherAndTheLargestGetsItsOwnStream) {
  // Key 7 costs 12 in three batches; keys 1, 2, 3 cost 2, 3 and 4.
  const std::vector<StreamJob> jobs = {{1, 2.0}, {2, 3.0}, {7, 4.0}, {7, 4.0}, {3, 4.0}, {7, 4.0}};
  const std::vector<int> s = assign_streams(jobs, 2);
  ASSERT_EQ(s.size(), jobs.size());
  EXPECT_EQ(s[2], s[3]);
  EXPECT_EQ(s[3], s[5]);
  EXPECT_EQ(s[2], 0);  // the most expensive key first, onto stream 0
  // The rest (9 in all) share the other stream: 12 against 9 is the best split.
  EXPECT_EQ(s[0], 1);
  EXPECT_EQ(s[1], 1);
  EXPECT_EQ(s[4], 1);
}

TEST(BatchStreams, LongestFirstBalancesLoads) {
  // Keys by total: 11 (8) → stream 0, 13 (7) → 1, 10 (6) → 1 (13), 14 (5) → 0 (13),
  // 12 (4) → 0 (the tie at 13 goes to the lower index).
  const std::vector<int> s = assign_streams({{10, 6.0}, {11, 8.0}, {12, 4.0}, {13, 7.0}, {14, 5.0}}, 2);
  EXPECT_EQ(s, (std::vector<int>{1, 0, 0, 1, 0}));
}

TEST(BatchStreams, MoreStreamsThanShapesLeavesSomeEmpty) {
  const std::vector<int> s = assign_streams({{3, 1.0}, {4, 2.0}}, 4);
  EXPECT_EQ(s, (std::vector<int>{1, 0}));
}

TEST(BatchStreams, TiesKeepTheFirstSeenOrder) {
  const std::vector<int> s = assign_streams({{9, 1.0}, {8, 1.0}, {7, 1.0}}, 2);
  EXPECT_EQ(s, (std::vector<int>{0, 1, 0}));
  EXPECT_TRUE(assign_streams({}, 2).empty());
}

TEST(BatchStreams, BadInputsNameTheirParameter) {
  try {
    assign_streams({{1, 1.0}}, 0);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("num_streams"), std::string::npos) << e.what();
  }
  EXPECT_THROW(assign_streams({{1, -1.0}}, 2), Error);
  EXPECT_THROW(assign_streams({{1, std::numeric_limits<double>::quiet_NaN()}}, 2), Error);
}

}  // namespace
}  // namespace dmuon::ns

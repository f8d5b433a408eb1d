// The autotuner's timing order (csrc/autotune/timing_rounds.h): a first measurement of each
// candidate in order (not counted), then rounds in turns with the order rotated, repeats by
// the first time, the median of each candidate's own measurements, failures left out.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <vector>

#include "autotune/timing_rounds.h"

namespace {

using dmuon::autotune::medians_in_turns;

TEST(TimingRounds, TurnsRotateAndShortRunsRepeat) {
  // Candidate 0 runs 1 ms (short: two a turn), 1 and 2 run 5 ms (one a turn).
  std::vector<size_t> order;
  std::map<size_t, std::vector<double>> script = {{0, {1.0, 3.0, 1.0, 2.0, 9.0, 1.5, 0.5}},
                                                  {1, {5.0, 6.0, 4.0, 5.5}},
                                                  {2, {5.0, 7.0, 8.0, 6.5}}};
  std::map<size_t, size_t> next;
  const auto medians = medians_in_turns(3, 3, 2.0, [&](size_t i) {
    order.push_back(i);
    return script[i][next[i]++];
  });
  const std::vector<size_t> expected = {0, 1, 2,        // first measurements, in order
                                        0, 0, 1, 2,     // round 0
                                        1, 2, 0, 0,     // round 1 starts at candidate 1
                                        2, 0, 0, 1};    // round 2 at candidate 2
  EXPECT_EQ(order, expected);
  // Medians of the counted measurements only: {3, 1, 2, 9, 1.5, 0.5} → 2 (upper middle),
  // {6, 4, 5.5} → 5.5, {7, 8, 6.5} → 7.
  EXPECT_DOUBLE_EQ(medians[0], 2.0);
  EXPECT_DOUBLE_EQ(medians[1], 5.5);
  EXPECT_DOUBLE_EQ(medians[2], 7.0);
}

TEST(TimingRounds, AFailedCandidateIsLeftOutAndNotMeasuredAgain) {
  std::vector<size_t> order;
  int calls_of_1 = 0;
  const auto medians = medians_in_turns(3, 2, 0.0, [&](size_t i) {
    order.push_back(i);
    if (i == 1 && ++calls_of_1 == 2) return -1.0;  // fails in its first turn
    if (i == 2) return -1.0;                       // fails at once
    return 4.0;
  });
  EXPECT_EQ(order, (std::vector<size_t>{0, 1, 2, 0, 1, 0}));
  EXPECT_DOUBLE_EQ(medians[0], 4.0);
  EXPECT_TRUE(std::isnan(medians[1]));
  EXPECT_TRUE(std::isnan(medians[2]));
}

TEST(TimingRounds, NoCandidates) { EXPECT_TRUE(medians_in_turns(0, 3, 2.0, [](size_t) { return 1.0; }).empty()); }

}  // namespace

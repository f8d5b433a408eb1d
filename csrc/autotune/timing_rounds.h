// dmuon/autotune/timing_rounds.h — the order in which the autotuner times its candidates:
// in turns, over rounds, so that every candidate sees the same mix of clocks (torch-free and
// CUDA-free: the order and the medians are unit-tested on the CPU,
// tests/cpp/test_timing_rounds.cpp).
// NOTE: why: under an H200's power limit the clock follows the recent load (Nsight Compute
// read 1.30–1.50 GHz across GEMM kernels); candidates timed one after another
// drifted by up to 8% (the same kernel twice, 3584×18944 X·Xᵀ b15), as much as the
// configurations differ.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <vector>

namespace dmuon::autotune {

/// Median time of each of `count` candidates, measured in turns. First each candidate is
/// measured once, in order: that time sets its repeats per round (2 under `short_ms`, else
/// 1; short runs are noisier) and is not counted. Then `rounds` rounds, round r starting at
/// candidate r mod count: every candidate measured `repeats` times in its turn.
/// measure(i) returns a time ≥ 0, or a negative value when candidate i failed: it is not
/// measured again and its median is NaN.
template <class Measure>
std::vector<double> medians_in_turns(size_t count, int rounds, double short_ms, Measure measure) {
  const double failed = std::numeric_limits<double>::quiet_NaN();
  std::vector<std::vector<double>> times(count);
  std::vector<int> repeats(count, 0);  // 0: failed
  for (size_t i = 0; i < count; ++i) {
    const double first = measure(i);
    if (first >= 0) repeats[i] = first < short_ms ? 2 : 1;
  }
  for (int r = 0; r < rounds; ++r) {
    for (size_t j = 0; j < count; ++j) {
      const size_t i = (static_cast<size_t>(r) + j) % count;
      for (int k = 0; k < repeats[i]; ++k) {
        const double t = measure(i);
        if (t < 0) {
          repeats[i] = 0;
          times[i].clear();
          break;
        }
        times[i].push_back(t);
      }
    }
  }
  std::vector<double> medians(count, failed);
  for (size_t i = 0; i < count; ++i) {
    if (repeats[i] == 0 || times[i].empty()) continue;
    std::vector<double> sorted = times[i];
    std::sort(sorted.begin(), sorted.end());
    medians[i] = sorted[sorted.size() / 2];
  }
  return medians;
}

}  // namespace dmuon::autotune

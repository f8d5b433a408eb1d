// dmuon/plan/cost_model.h — t(shape, batch): seconds of one batched Newton–Schulz launch.
//
// Two sources: a table of measured times (the step engine measures it when it plans,
// step/cost_profile.h), and an analytic model from the FLOP formulas of DESIGN.md §3 for
// CPU runs or when profiling is off.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "plan/problem.h"

namespace dmuon::plan {

/// Which Newton–Schulz variant the FLOP count assumes.
enum class NsFlavor { kAuto, kStandard, kGram };

/// Parses "auto" | "standard" | "gram"; errors name the parameter ns_algorithm.
NsFlavor parse_ns_flavor(const std::string& name);

/// FLOPs of 5-step NS on one rows×cols matrix, k = min, l = max dimension:
/// standard 20k²l+10k³ (15k²l+5k³ symmetric), Gram with one restart 8k²l+28k³
/// (6k²l+14k³ symmetric); kAuto takes the cheaper of the two (standard when square).
double ns_flops(int64_t rows, int64_t cols, NsFlavor flavor, bool symmetric);

/// t(b) = launch_overhead_s + b · flops / flops_per_second: one launch overhead per
/// batch plus per-matrix FLOP time, so batching is sublinear.
struct AnalyticCostModel {
  double flops_per_second = 400e12;  ///< sustained NS throughput
  double launch_overhead_s = 20e-6;  ///< per batched launch
  NsFlavor flavor = NsFlavor::kAuto;
  bool symmetric = true;  ///< count the symmetric-product FLOPs (our SYRK kernel)

  /// NOTE: 400 TFLOP/s is about half the bf16 dense GEMM peak measured on one H200
  /// (≈770 TFLOP/s, DESIGN.md §5); 20 µs is a few kernel launches of a 5-step NS.
  static AnalyticCostModel gpu_default();
  /// NOTE: 50 GFLOP/s is an order-of-magnitude figure for a few CPU cores running the
  /// packed CPU GEMM; 50 µs covers thread start-up per batch.
  static AnalyticCostModel cpu_default();

  void validate() const;
  double seconds(int64_t rows, int64_t cols, int64_t num_matrices) const;
  CostFn as_cost_fn() const;
};

/// Measured t(shape, batch), interpolated linearly in the batch size between measured
/// points and extrapolated with the per-matrix slope of the last two points.
class CostTable {
 public:
  /// Records one measurement; seconds must be positive and finite.
  void set(int64_t rows, int64_t cols, int64_t num_matrices, double seconds);
  /// Seconds for rows×cols×num_matrices; throws naming the shape if it was never measured.
  double seconds(int64_t rows, int64_t cols, int64_t num_matrices) const;
  size_t size() const;
  /// (rows, cols, num_matrices, seconds) for every entry, sorted.
  std::vector<std::tuple<int64_t, int64_t, int64_t, double>> entries() const;
  CostFn as_cost_fn() const;

 private:
  std::map<std::pair<int64_t, int64_t>, std::map<int64_t, double>> table_;
};

/// The cost the step runtime plans with: the measured entries (rows, cols, num_matrices,
/// seconds; identical on every rank) when there are any, else the analytic model of
/// device_type ("cuda": gpu_default, otherwise cpu_default).
CostFn runtime_cost_fn(const std::vector<std::tuple<int64_t, int64_t, int64_t, double>>& entries,
                       const std::string& device_type);

}  // namespace dmuon::plan

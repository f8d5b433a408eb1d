// dmuon/plan/cost_model.h — t(shape, batch): seconds of one batched Newton–Schulz launch.
//
// Two sources: a table measured on the GPU at start-up (median of timed runs, cached on
// disk), and an analytic model from the FLOP formulas of DESIGN.md §3 for CPU runs or
// when profiling is off.
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
  bool has_shape(int64_t rows, int64_t cols) const;
  size_t size() const;
  /// (rows, cols, num_matrices, seconds) for every entry, sorted.
  std::vector<std::tuple<int64_t, int64_t, int64_t, double>> entries() const;
  CostFn as_cost_fn() const;

  /// Writes the table to `path` atomically (temporary file, fsync, rename); `key` names
  /// the device/driver/version the numbers belong to.
  void save(const std::string& path, const std::string& key) const;
  /// Reads a table written by save(). Returns false (no throw) when the file is missing
  /// or its key differs; throws naming the file (and line) when it is malformed, truncated
  /// or edited (its end line holds the entry count and a checksum of everything before it).
  bool load(const std::string& path, const std::string& key);

 private:
  std::map<std::pair<int64_t, int64_t>, std::map<int64_t, double>> table_;
};

/// The cost the step runtime plans with: the measured entries (rows, cols, num_matrices,
/// seconds; identical on every rank) when there are any, else the analytic model of
/// device_type ("cuda": gpu_default, otherwise cpu_default).
CostFn runtime_cost_fn(const std::vector<std::tuple<int64_t, int64_t, int64_t, double>>& entries,
                       const std::string& device_type);

/// Times `run_once(rows, cols, num_matrices)` (returns the seconds of one run) for each
/// (rows, cols, num_matrices) in `points`: `num_warmup` discarded runs, then the median
/// of `num_runs` runs. The GPU runtime passes its real NS launch timed with CUDA events.
CostTable profile_cost_table(
    const std::vector<std::tuple<int64_t, int64_t, int64_t>>& points,
    const std::function<double(int64_t, int64_t, int64_t)>& run_once, int num_runs = 5,
    int num_warmup = 1);

}  // namespace dmuon::plan

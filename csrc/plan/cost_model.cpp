// dmuon/plan/cost_model.cpp — analytic NS cost and measured cost tables.
#include "plan/cost_model.h"

#include <algorithm>
#include <cmath>

#include "common/check.h"

namespace dmuon::plan {

NsFlavor parse_ns_flavor(const std::string& name) {
  if (name == "auto") return NsFlavor::kAuto;
  if (name == "standard") return NsFlavor::kStandard;
  if (name == "gram") return NsFlavor::kGram;
  DMUON_FAIL("ns_algorithm must be 'auto', 'standard' or 'gram', got '", name, "'");
}

double ns_flops(int64_t rows, int64_t cols, NsFlavor flavor, bool symmetric) {
  DMUON_CHECK(rows >= 1 && cols >= 1, "ns_flops: rows and cols must be >= 1, got ", rows, "x", cols);
  const double k = static_cast<double>(std::min(rows, cols));
  const double l = static_cast<double>(std::max(rows, cols));
  const double standard = symmetric ? 15 * k * k * l + 5 * k * k * k : 20 * k * k * l + 10 * k * k * k;
  const double gram = symmetric ? 6 * k * k * l + 14 * k * k * k : 8 * k * k * l + 28 * k * k * k;
  switch (flavor) {
    case NsFlavor::kStandard: return standard;
    case NsFlavor::kGram: return gram;
    case NsFlavor::kAuto: break;
  }
  // NOTE: square matrices use standard NS (DESIGN.md §3), otherwise the cheaper count.
  return rows == cols ? standard : std::min(standard, gram);
}

// ---- Analytic model ---------------------------------------------------------------------

AnalyticCostModel AnalyticCostModel::gpu_default() { return AnalyticCostModel{}; }

AnalyticCostModel AnalyticCostModel::cpu_default() {
  AnalyticCostModel model;
  model.flops_per_second = 50e9;
  model.launch_overhead_s = 50e-6;
  model.symmetric = false;
  return model;
}

void AnalyticCostModel::validate() const {
  DMUON_CHECK(std::isfinite(flops_per_second) && flops_per_second > 0,
              "flops_per_second must be positive, got ", flops_per_second);
  DMUON_CHECK(std::isfinite(launch_overhead_s) && launch_overhead_s >= 0,
              "launch_overhead_s must be >= 0, got ", launch_overhead_s);
}

double AnalyticCostModel::seconds(int64_t rows, int64_t cols, int64_t num_matrices) const {
  DMUON_CHECK(num_matrices >= 1, "num_matrices must be >= 1, got ", num_matrices);
  return launch_overhead_s +
         static_cast<double>(num_matrices) * ns_flops(rows, cols, flavor, symmetric) /
             flops_per_second;
}

CostFn AnalyticCostModel::as_cost_fn() const {
  validate();
  const AnalyticCostModel model = *this;
  return [model](int64_t rows, int64_t cols, int64_t n) { return model.seconds(rows, cols, n); };
}

// ---- Measured table ---------------------------------------------------------------------

void CostTable::set(int64_t rows, int64_t cols, int64_t num_matrices, double seconds) {
  DMUON_CHECK(rows >= 1 && cols >= 1 && num_matrices >= 1, "cost table entry ", rows, "x", cols,
              " batch ", num_matrices, ": dimensions must be >= 1");
  DMUON_CHECK(std::isfinite(seconds) && seconds > 0, "cost table entry ", rows, "x", cols,
              " batch ", num_matrices, " has seconds = ", seconds, ": costs must be positive");
  table_[{rows, cols}][num_matrices] = seconds;
}

size_t CostTable::size() const {
  size_t total = 0;
  for (const auto& [shape, points] : table_) total += points.size();
  return total;
}

std::vector<std::tuple<int64_t, int64_t, int64_t, double>> CostTable::entries() const {
  std::vector<std::tuple<int64_t, int64_t, int64_t, double>> out;
  for (const auto& [shape, points] : table_)
    for (const auto& [n, t] : points) out.emplace_back(shape.first, shape.second, n, t);
  return out;
}

double CostTable::seconds(int64_t rows, int64_t cols, int64_t num_matrices) const {
  const auto shape_it = table_.find({rows, cols});
  DMUON_CHECK(shape_it != table_.end(), "cost table has no entry for shape ", rows, "x", cols);
  DMUON_CHECK(num_matrices >= 1, "num_matrices must be >= 1, got ", num_matrices);
  const std::map<int64_t, double>& points = shape_it->second;
  const auto exact = points.find(num_matrices);
  if (exact != points.end()) return exact->second;
  // Interpolate between the neighbours, or extrapolate from the nearest end.
  auto hi = points.lower_bound(num_matrices);
  if (points.size() == 1) {
    const auto& [n0, t0] = *points.begin();
    return t0 * static_cast<double>(num_matrices) / static_cast<double>(n0);
  }
  if (hi == points.begin()) ++hi;
  if (hi == points.end()) --hi;
  auto lo = std::prev(hi);
  const double slope = (hi->second - lo->second) / static_cast<double>(hi->first - lo->first);
  const double t = lo->second + slope * static_cast<double>(num_matrices - lo->first);
  // NOTE: a noisy table can give a non-positive extrapolation at small batches; the
  // per-matrix time of the smallest measured batch is a safe floor there.
  const double floor = points.begin()->second / static_cast<double>(points.begin()->first) *
                       static_cast<double>(num_matrices);
  return t > 0 ? t : floor;
}

CostFn CostTable::as_cost_fn() const {
  const CostTable table = *this;
  return [table](int64_t rows, int64_t cols, int64_t n) { return table.seconds(rows, cols, n); };
}

CostFn runtime_cost_fn(const std::vector<std::tuple<int64_t, int64_t, int64_t, double>>& entries,
                       const std::string& device_type) {
  if (entries.empty())
    return (device_type == "cuda" ? AnalyticCostModel::gpu_default() : AnalyticCostModel::cpu_default()).as_cost_fn();
  CostTable table;
  for (const auto& [rows, cols, count, seconds] : entries) table.set(rows, cols, count, seconds);
  return table.as_cost_fn();
}

}  // namespace dmuon::plan

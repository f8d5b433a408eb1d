// dmuon/plan/cost_model.cpp — analytic NS cost, measured cost tables and their disk cache.
#include "plan/cost_model.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "common/check.h"
#include "plan/hash.h"

namespace dmuon::plan {
namespace {

// NOTE: v2 ends with "end <entries> <FNV-1a of everything before that line>": a file cut
// inside a number (5.4672999795002397e-05 → 5.4672999795002397) parsed as a valid v1 table.
constexpr const char* kTableMagic = "dmuon-cost-table v2";

std::string checksum_of(const std::string& text) {
  Hasher hasher;
  hasher.bytes(text.data(), text.size());
  std::ostringstream hex;
  hex << std::hex << hasher.digest();
  return hex.str();
}

}  // namespace

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

bool CostTable::has_shape(int64_t rows, int64_t cols) const {
  return table_.count({rows, cols}) > 0;
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

void CostTable::save(const std::string& path, const std::string& key) const {
  DMUON_CHECK(key.find('\n') == std::string::npos, "cost table key must be one line");
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp);
    DMUON_CHECK(out.good(), "cannot write cost table file ", tmp);
    std::ostringstream body;
    body << kTableMagic << "\nkey " << key << "\n";
    body.precision(17);
    for (const auto& [rows, cols, n, t] : entries())
      body << rows << " " << cols << " " << n << " " << t << "\n";
    const std::string head = body.str();
    out << head << "end " << size() << " " << checksum_of(head) << "\n";
    out.flush();
    DMUON_CHECK(out.good(), "failed writing cost table file ", tmp);
  }
  // NOTE: fsync before rename so a crash never leaves a truncated table under `path`.
  const int fd = ::open(tmp.c_str(), O_RDONLY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
  DMUON_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, "cannot rename ", tmp, " to ", path);
}

bool CostTable::load(const std::string& path, const std::string& key) {
  std::ifstream in(path, std::ios::binary);
  if (!in.good()) return false;
  std::ostringstream whole;
  whole << in.rdbuf();
  const std::string text = whole.str();
  // The header, then the end line: its entry count and the checksum of all before it.
  const size_t first_newline = text.find('\n');
  DMUON_CHECK(text.substr(0, first_newline) == kTableMagic, path, ":1: not a dmuon cost table (expected '",
              kTableMagic, "')");
  const size_t end_line = text.rfind("\nend ");
  DMUON_CHECK(!text.empty() && text.back() == '\n' && end_line != std::string::npos, path,
              ": truncated (no end line)");
  const std::string head = text.substr(0, end_line + 1);
  std::istringstream end_fields(text.substr(end_line + 5));
  size_t count = 0;
  std::string checksum, rest;
  DMUON_CHECK((end_fields >> count >> checksum) && !(end_fields >> rest), path,
              ": malformed end line (expected 'end <entries> <checksum>')");
  DMUON_CHECK(checksum == checksum_of(head), path, ": checksum mismatch (corrupt or edited)");
  std::istringstream lines(head);
  std::string line;
  std::getline(lines, line);  // the magic line, checked above
  int line_no = 2;
  DMUON_CHECK(std::getline(lines, line) && line.rfind("key ", 0) == 0, path, ":", line_no,
              ": expected 'key <device key>'");
  if (line.substr(4) != key) return false;
  CostTable loaded;
  while (std::getline(lines, line)) {
    ++line_no;
    std::istringstream fields(line);
    int64_t rows = 0, cols = 0, n = 0;
    double t = 0;
    DMUON_CHECK((fields >> rows >> cols >> n >> t) && !(fields >> rest), path, ":", line_no,
                ": expected 'rows cols num_matrices seconds', got '", line, "'");
    try {
      loaded.set(rows, cols, n, t);
    } catch (const Error& error) {
      DMUON_FAIL(path, ":", line_no, ": ", error.what());
    }
  }
  DMUON_CHECK(loaded.size() == count, path, ": ", loaded.size(), " entries, the end line says ", count);
  *this = std::move(loaded);
  return true;
}

CostTable profile_cost_table(const std::vector<std::tuple<int64_t, int64_t, int64_t>>& points,
                             const std::function<double(int64_t, int64_t, int64_t)>& run_once,
                             int num_runs, int num_warmup) {
  DMUON_CHECK(num_runs >= 1, "num_runs must be >= 1, got ", num_runs);
  DMUON_CHECK(num_warmup >= 0, "num_warmup must be >= 0, got ", num_warmup);
  DMUON_CHECK(static_cast<bool>(run_once), "run_once must be set");
  CostTable table;
  for (const auto& [rows, cols, n] : points) {
    for (int i = 0; i < num_warmup; ++i) run_once(rows, cols, n);
    std::vector<double> runs;
    for (int i = 0; i < num_runs; ++i) runs.push_back(run_once(rows, cols, n));
    std::sort(runs.begin(), runs.end());
    // Median (the lower middle for an even count, so it is always a measured value).
    table.set(rows, cols, n, runs[static_cast<size_t>((num_runs - 1) / 2)]);
  }
  return table;
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

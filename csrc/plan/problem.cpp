// dmuon/plan/problem.cpp — validation of planner inputs and cost tabulation.
#include "plan/problem.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

#include "common/check.h"
#include "plan/hash.h"

namespace dmuon::plan {
namespace {

// NOTE: the wire carries 16-bit values (DESIGN.md §3, runtime), 2 bytes per element.
constexpr int64_t kWireBytesPerElement = 2;

std::string describe(const MatrixSpec& m) {
  return detail::concat("'", m.name, "' (", m.rows, "x", m.cols,
                        m.batch > 1 ? detail::concat(" x", m.batch) : std::string(), ")");
}

}  // namespace

int64_t default_memory_bytes(int64_t rows, int64_t cols) {
  const int64_t k = std::min(rows, cols);
  return 4 * rows * cols + 2 * (rows * cols + 3 * k * k);
}

int64_t ShapeClass::num_homed() const {
  int64_t total = 0;
  for (int64_t n : home_count) total += n;
  return total;
}

double Problem::home_saving(int shape_idx, int rank, int64_t num_units) const {
  const ShapeClass& s = shapes[static_cast<size_t>(shape_idx)];
  return static_cast<double>(std::min(num_units, s.homes_on(rank))) * s.recv_seconds;
}

bool Problem::has_homes() const {
  for (const ShapeClass& s : shapes)
    if (s.has_homes()) return true;
  return false;
}

double Problem::batch_load(int shape_idx, int64_t num_units) const {
  const ShapeClass& s = shapes[static_cast<size_t>(shape_idx)];
  return s.batch_seconds[static_cast<size_t>(num_units - 1)] +
         static_cast<double>(num_units) * s.recv_seconds;
}

Problem build_problem(std::vector<MatrixSpec> matrices, const ProblemOptions& options,
                      const CostFn& cost) {
  // Scalar arguments.
  DMUON_CHECK(!matrices.empty(), "matrices must not be empty (the manifest has no Muon matrices)");
  DMUON_CHECK(options.world_size >= 1, "world_size must be at least 1, got ", options.world_size);
  DMUON_CHECK(std::isfinite(options.bandwidth_bytes_per_s) && options.bandwidth_bytes_per_s > 0,
              "bandwidth_bytes_per_s must be positive, got ", options.bandwidth_bytes_per_s);
  DMUON_CHECK(options.memory_cap_bytes >= 0, "memory_cap_bytes must be >= 0 (0: no cap), got ",
              options.memory_cap_bytes);
  DMUON_CHECK(options.max_batch >= 0, "max_batch must be >= 0 (0: unlimited), got ",
              options.max_batch);
  DMUON_CHECK(static_cast<bool>(cost), "cost function must be set");

  // Per matrix: dimensions, defaults for bytes, memory cap.
  for (size_t i = 0; i < matrices.size(); ++i) {
    MatrixSpec& m = matrices[i];
    if (m.name.empty()) m.name = detail::concat("matrix[", i, "]");
    DMUON_CHECK(m.rows >= 1 && m.cols >= 1, "matrix ", describe(m),
                ": rows and cols must be at least 1");
    DMUON_CHECK(m.batch >= 1, "matrix ", describe(m), ": batch must be at least 1, got ", m.batch);
    DMUON_CHECK(m.wire_bytes >= 0 && m.memory_bytes >= 0, "matrix ", describe(m),
                ": wire_bytes and memory_bytes must be >= 0");
    DMUON_CHECK(m.home >= -1 && m.home < options.world_size, "matrix ", describe(m), ": home must be a rank in [0, ",
                options.world_size, ") or -1 (none), got ", m.home);
    if (m.wire_bytes == 0) m.wire_bytes = m.rows * m.cols * m.batch * kWireBytesPerElement;
    if (m.memory_bytes == 0) m.memory_bytes = m.batch * default_memory_bytes(m.rows, m.cols);
    DMUON_CHECK(options.memory_cap_bytes == 0 || m.memory_bytes <= options.memory_cap_bytes,
                "matrix ", describe(m), " needs ", m.memory_bytes,
                " bytes, more than memory_cap_bytes = ", options.memory_cap_bytes,
                ": it fits no rank");
  }

  // Group identical units into shape classes, in order of first appearance.
  Problem problem;
  problem.options = options;
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>, int> class_of;
  for (size_t i = 0; i < matrices.size(); ++i) {
    const MatrixSpec& m = matrices[i];
    const auto key = std::make_tuple(m.rows, m.cols, m.batch, m.wire_bytes, m.memory_bytes);
    auto it = class_of.find(key);
    if (it == class_of.end()) {
      it = class_of.emplace(key, static_cast<int>(problem.shapes.size())).first;
      ShapeClass s;
      s.rows = m.rows;
      s.cols = m.cols;
      s.stack = m.batch;
      s.wire_bytes = m.wire_bytes;
      s.memory_bytes = m.memory_bytes;
      problem.shapes.push_back(s);
    }
    ShapeClass& s = problem.shapes[static_cast<size_t>(it->second)];
    s.matrix_idx.push_back(static_cast<int>(i));
    if (m.home >= 0) {
      if (s.home_count.empty()) s.home_count.assign(static_cast<size_t>(options.world_size), 0);
      ++s.home_count[static_cast<size_t>(m.home)];
    }
  }

  // Cost table per class: b = 1 .. the largest batch allowed by count, max_batch and cap.
  const double D = options.world_size;
  for (ShapeClass& s : problem.shapes) {
    int64_t max_batch = s.count();
    if (options.max_batch > 0) max_batch = std::min(max_batch, options.max_batch);
    if (options.memory_cap_bytes > 0)
      max_batch = std::min(max_batch, options.memory_cap_bytes / s.memory_bytes);
    s.recv_seconds = (D - 1.0) / D * static_cast<double>(s.wire_bytes) /
                     options.bandwidth_bytes_per_s;
    s.batch_seconds.resize(static_cast<size_t>(max_batch));
    for (int64_t b = 1; b <= max_batch; ++b) {
      const double seconds = cost(s.rows, s.cols, b * s.stack);
      DMUON_CHECK(std::isfinite(seconds) && seconds > 0, "cost of ", b * s.stack, " matrices of ",
                  s.rows, "x", s.cols, " is ", seconds, ": costs must be positive and finite");
      s.batch_seconds[static_cast<size_t>(b - 1)] = seconds;
    }
  }

  // Hash of every input that can change a plan.
  Hasher hasher;
  hasher.str("dmuon-plan-problem-v2");  // NOTE: v2 hashes homes
  hasher.i64(options.world_size);
  hasher.f64(options.bandwidth_bytes_per_s);
  hasher.i64(options.memory_cap_bytes);
  hasher.i64(options.max_batch);
  for (const MatrixSpec& m : matrices) {
    hasher.str(m.name);
    for (int64_t v : {m.rows, m.cols, m.batch, m.wire_bytes, m.memory_bytes, static_cast<int64_t>(m.home)})
      hasher.i64(v);
  }
  for (const ShapeClass& s : problem.shapes)
    for (double t : s.batch_seconds) hasher.f64(t);
  problem.hash = hasher.digest();
  problem.matrices = std::move(matrices);
  return problem;
}

}  // namespace dmuon::plan

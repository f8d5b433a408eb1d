// dmuon/plan/problem.h — the owner-planning problem: Muon matrices, world size, costs.
//
// The planner decides which rank owns each Muon matrix. Identical matrices (same shape,
// stack size, wire bytes and memory) form a shape class; a batch of b units of one class
// is orthogonalized in one batched launch that costs batch_seconds[b-1] on one rank.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace dmuon::plan {

/// One Muon parameter: a rows×cols matrix, or a 3-D stack of `batch` such matrices
/// (MoE experts) that is owned as a whole.
struct MatrixSpec {
  std::string name;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t batch = 1;         ///< matrices in a 3-D stack (1 for a plain matrix)
  int64_t wire_bytes = 0;    ///< bytes an owner gathers; 0: rows·cols·batch·2 (16-bit wire)
  int64_t memory_bytes = 0;  ///< owner memory (full matrix + NS workspace); 0: estimate
};

/// Seconds of one batched orthogonalization launch of `num_matrices` rows×cols matrices.
using CostFn = std::function<double(int64_t rows, int64_t cols, int64_t num_matrices)>;

/// Everything besides the matrices and the cost function.
struct ProblemOptions {
  int world_size = 1;                  ///< D, number of ranks
  double bandwidth_bytes_per_s = 50e9;  ///< link bandwidth for bytes an owner receives
  int64_t memory_cap_bytes = 0;        ///< per-rank cap on owned memory; 0: none
  int64_t max_batch = 0;               ///< most units in one launch; 0: unlimited
};

/// Identical units (matrices or stacks) that can share one batched launch.
struct ShapeClass {
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t stack = 1;                 ///< matrices per unit (3-D stack size)
  int64_t wire_bytes = 0;            ///< per unit
  int64_t memory_bytes = 0;          ///< per unit
  std::vector<int> matrix_idx;       ///< the units, as indices into Problem::matrices
  double recv_seconds = 0.0;         ///< per unit: (D-1)/D · wire_bytes / bandwidth
  std::vector<double> batch_seconds; ///< [b-1]: compute seconds of a batch of b units
  int64_t max_batch() const { return static_cast<int64_t>(batch_seconds.size()); }
  int64_t count() const { return static_cast<int64_t>(matrix_idx.size()); }
};

/// A validated, immutable planning problem. Build it with build_problem().
struct Problem {
  std::vector<MatrixSpec> matrices;  ///< with wire/memory bytes filled in
  std::vector<ShapeClass> shapes;    ///< in order of first appearance
  ProblemOptions options;
  uint64_t hash = 0;                 ///< of every input that can change a plan

  int world_size() const { return options.world_size; }
  /// Load a batch of b units of shape s adds to its owner: compute + receive.
  double batch_load(int shape_idx, int64_t num_units) const;
};

/// Memory an owner needs for one rows×cols matrix when MatrixSpec::memory_bytes is 0:
/// the assembled update in fp32 (4·m·n) plus the 16-bit NS workspace X, Gram R, Q and a
/// temporary (2·(m·n + 3·k²), k = min(m, n)).
int64_t default_memory_bytes(int64_t rows, int64_t cols);

/// Validates the inputs (errors name the argument) and tabulates costs per shape class.
Problem build_problem(std::vector<MatrixSpec> matrices, const ProblemOptions& options,
                      const CostFn& cost);

}  // namespace dmuon::plan

// dmuon/plan/problem.h — the owner-planning problem: Muon matrices, world size, costs.
//
// The planner decides which rank owns each Muon matrix. Identical matrices (same shape,
// stack size, wire bytes and memory) form a shape class; a batch of b units of one class
// is orthogonalized in one batched launch that costs batch_seconds[b-1] on one rank.
// A matrix may have a home: the rank that already holds it whole (an MoE expert under
// FSDP2's Shard(0) on the expert dim, or on an EP split). Owning it there receives nothing;
// anywhere else its receive term is paid as for any matrix (the locality term).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace dmuon::plan {

/// One Muon parameter: a rows×cols matrix, or a 3-D stack of `batch` such matrices
/// owned as a whole (MoE experts planned as a stack; split them into one spec per expert
/// to plan them one by one).
struct MatrixSpec {
  std::string name;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t batch = 1;         ///< matrices in a 3-D stack (1 for a plain matrix)
  int64_t wire_bytes = 0;    ///< bytes an owner gathers; 0: rows·cols·batch·2 (16-bit wire)
  int64_t memory_bytes = 0;  ///< owner memory (full matrix + NS workspace); 0: estimate
  int home = -1;             ///< rank that holds it whole already (owning it there receives nothing); −1: none
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
  /// [rank]: units whose home is that rank; empty when no unit of the class has a home.
  /// NOTE: homes do not split classes (the MILP stays per class × rank): a rank holding n
  /// units of the class receives max(0, n − home_count[rank]) of them, its home units first.
  std::vector<int64_t> home_count;
  int64_t max_batch() const { return static_cast<int64_t>(batch_seconds.size()); }
  int64_t count() const { return static_cast<int64_t>(matrix_idx.size()); }
  bool has_homes() const { return !home_count.empty(); }
  int64_t homes_on(int rank) const { return home_count.empty() ? 0 : home_count[static_cast<size_t>(rank)]; }
  /// Units with a home anywhere.
  int64_t num_homed() const;
};

/// A validated, immutable planning problem. Build it with build_problem().
struct Problem {
  std::vector<MatrixSpec> matrices;  ///< with wire/memory bytes filled in
  std::vector<ShapeClass> shapes;    ///< in order of first appearance
  ProblemOptions options;
  uint64_t hash = 0;                 ///< of every input that can change a plan

  int world_size() const { return options.world_size; }
  /// Load a batch of b units of shape s adds to an owner that receives them all: compute +
  /// receive (the load off their homes).
  double batch_load(int shape_idx, int64_t num_units) const;
  /// Receive seconds home units save on `rank` when it holds `num_units` of shape s.
  double home_saving(int shape_idx, int rank, int64_t num_units) const;
  /// Whether some matrix has a home (ranks are then not interchangeable).
  bool has_homes() const;
};

/// Memory an owner needs for one rows×cols matrix when MatrixSpec::memory_bytes is 0:
/// the assembled update in fp32 (4·m·n) plus the 16-bit NS workspace X, Gram R, Q and a
/// temporary (2·(m·n + 3·k²), k = min(m, n)).
int64_t default_memory_bytes(int64_t rows, int64_t cols);

/// Validates the inputs (errors name the argument) and tabulates costs per shape class.
Problem build_problem(std::vector<MatrixSpec> matrices, const ProblemOptions& options,
                      const CostFn& cost);

}  // namespace dmuon::plan

// dmuon/plan/layer_spread.h — spread each layer's matrices over different owners, keeping
// the plan's loads.
//
// In the weight-ownership mode an owner publishes its matrices to every other rank just
// before their layer's forward; when one owner holds several matrices of a layer, its sends
// serialize that layer. Units of one shape class are interchangeable for the planner's
// objective (a rank's batches and load depend only on how many units of each class it
// holds), so which units go to which rank is free. spread_layers() uses that freedom:
// every rank keeps its per-class counts, batch sizes, compute/receive seconds, recv/memory
// bytes, load and the makespan bit for bit; only WHICH matrices fill them changes.
//
// Typical use (rank 0 plans, the others deserialize the broadcast text as before):
//   Plan plan = solve(problem, SolverKind::kMilp, MilpOptions::from_env());
//   spread_layers(problem, layer_of, plan);
//   broadcast(plan.serialize());
#pragma once

#include <cstdint>
#include <vector>

#include "plan/plan.h"
#include "plan/problem.h"

namespace dmuon::plan {

/// Reassigns same-class matrices between owners so that the matrices of one layer land on
/// different ranks as much as possible. `layer_of[i]` is the layer of matrix i, or −1 for
/// none: such matrices fill whatever capacity the layered ones leave, on their old owner
/// where it has room (a plan with no layered matrix, or of a problem with homes, is
/// returned unchanged).
///
/// Objective, over every (layer, rank) pair: Σ (wire bytes the rank publishes for the
/// layer)², then Σ (its matrices of the layer)²; squares push every layer toward an even
/// split. Bytes come first because they are what serializes a layer's publish: at D = 4
/// a Qwen layer is best split {gate}, {up}, {down}, {q, k, v, o}, four matrices on one
/// owner but the least bytes on the busiest one.
///
/// Algorithm: a greedy first round (classes by decreasing bytes; each class layer by
/// layer, every matrix onto the rank with room for its class that publishes the fewest
/// bytes, then matrices, for its layer; ties to the most room left, then the lowest rank),
/// then rounds that re-place each class exactly given all the others (a min-cost flow
/// layer → rank with convex costs), keeping a class's new placement only when strictly
/// cheaper, until a round changes nothing. The input plan is kept when it is no worse.
/// Deterministic and idempotent; milliseconds for hundreds of matrices (L = 80, D = 256:
/// 0.3 s). The exact rounds run on the ranks only (layer nodes eliminated, per matrix
/// O(D² + path · L · D)): Qwen3-30B-A3B's 18 672 matrices at D = 8 take 0.1 s by layer
/// (L = 48) and about 1 s by backward window (L ≈ 820, plan/stage_windows.h) on one
/// CPU core, where the full graph (O((L + D)²) per matrix) took over a minute.
///
/// Quality: a heuristic (with per-rank class counts fixed this is a 3-D assignment
/// problem), but on the shipped manifests (Qwen2.5-0.5B/1.5B/7B, Llama-3.1-8B) with LPT
/// and MILP plans at D = 2, 4, 7, 8, 16 the worst layer's bytes on one owner reach
/// LayerSpreadStats::bytes_bound (the largest matrix) at D ≥ 4 wherever the plan's class
/// counts allow it, the exact per-layer optimum at D = 2 from LPT plans, and at D ≥ 7 the
/// matrices per owner reach matrices_bound_for_counts (1: no collisions, when every rank
/// holds at most L matrices). What stays is forced by the counts: MILP plans at small D
/// concentrate a class on few ranks (e.g. all q/k/v/o/down of Qwen2.5-0.5B on one of 2
/// ranks), which no reassignment can undo.
///
/// Rewrites plan.owner and each batch's matrix_idx (ascending within a batch; batches keep
/// their order, which is also the order deserialize_plan() rebuilds). Errors name the
/// argument: layer_of of the wrong size or below −1, a plan of another problem.
void spread_layers(const Problem& problem, const std::vector<int>& layer_of, Plan& plan);

/// How well a plan spreads layers over owners. Maxima are over layers (ids ≥ 0) and ranks.
struct LayerSpreadStats {
  int num_layers = 0;                  ///< distinct layer ids ≥ 0
  int worst_layer = -1;                ///< layer of max_bytes_per_owner (lowest id on ties)
  int64_t max_matrices_per_owner = 0;  ///< most matrices of one layer on one rank
  int64_t max_collisions = 0;          ///< most (matrices − distinct owners) of one layer
  int64_t total_collisions = 0;        ///< Σ over layers of (matrices − distinct owners)
  int64_t max_bytes_per_owner = 0;     ///< most wire bytes one rank publishes for one layer
  /// Bounds no plan can beat: max over layers of ceil(n_l / D), max(0, n_l − D) and
  /// max(largest matrix, ceil(bytes_l / D)).
  int64_t matrices_bound = 0;
  int64_t collisions_bound = 0;
  int64_t bytes_bound = 0;
  /// The same bounds raised by this plan's per-rank totals, which spreading cannot change:
  /// a rank with c layered matrices (b bytes) over L layers has ceil(c / L) (ceil(b / L))
  /// of some layer.
  int64_t matrices_bound_for_counts = 0;
  int64_t bytes_bound_for_counts = 0;
};

/// Measures `plan` against `layer_of` (same argument checks as spread_layers()).
LayerSpreadStats layer_spread_stats(const Problem& problem, const std::vector<int>& layer_of,
                                    const Plan& plan);

}  // namespace dmuon::plan

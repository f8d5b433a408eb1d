// dmuon/sim/stage_layout.h — everything the step engine's pipeline of one step is made
// of, for every rank at once: per stage, every rank's bytes to every peer in the stage's
// forward exchange (pieces to their owners) and its return (results back), and every
// rank's work in the stage.
//
// It is what the engine decided (every rank derives every rank's exchange plan alike:
// step/stage_layout.h reads it from them), so the traffic and the work of ranks that were
// not run follow from it. The projection runs it through the engine's pipeline order
// (sim/pipeline.h, stage_pipeline_program).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace dmuon::sim {

/// One all_to_all of a stage as the engine issues it.
struct StageExchange {
  bool issued = false;         ///< the engine calls the collective (every rank alike)
  std::vector<int64_t> bytes;  ///< [src · world + dst]; 0 on the diagonal (own pieces stay)
};

/// Same-shape matrices one rank orthogonalizes in one batched launch.
struct NsBatchShape {
  int64_t rows = 0, cols = 0, count = 0;
};

/// One rank's work in one stage (the engine's phases, step/stats.h StageTimeline):
///   prepare  momentum and U of its pieces bound for the wire (elements);
///   ns       its NS batches (iterate, NS, the return's packing and its own rows' apply);
///   apply    the rows returned to it by other owners (elements).
struct RankStageWork {
  double prepare_elements = 0;
  std::vector<NsBatchShape> ns_batches;
  double apply_elements = 0;
};

struct StageLayout {
  int world_size = 1;
  int64_t agreement_bytes = 0;  ///< the engine's start-of-step agreement (one all_reduce; 0: none)
  std::vector<StageExchange> forward, back;     ///< [stage]
  std::vector<std::vector<RankStageWork>> work;  ///< [stage][rank]

  size_t num_stages() const { return forward.size(); }
  /// Throws dmuon::Error naming the field that is inconsistent.
  void validate() const;
  /// Stages [first, num_stages()) alone: what runs at step() when the first stages were
  /// exchanged inside backward. Throws dmuon::Error when first > num_stages().
  StageLayout from_stage(size_t first) const;
};

}  // namespace dmuon::sim

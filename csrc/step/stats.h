// dmuon/step/stats.h — where one rank's step went: phase totals (today's StepStats) and a
// per-stage timeline with the bytes exchanged with each peer, which the fake-world
// projection (csrc/sim) turns into a step time at a given link bandwidth.
//
// Times are as EngineOptions::timing takes them (step/phase_clock.h): by default the host
// time to enqueue each phase (on a GPU not the device's time); synchronized after each
// phase (real, at the cost of the overlap it measures); or device time between marks.
#pragma once

#include <cstdint>
#include <tuple>
#include <vector>

namespace dmuon::step {

/// One pipeline stage on this rank.
struct StageTimeline {
  int64_t stage_idx = 0;
  int64_t num_batches = 0;  ///< NS batches this rank ran in the stage
  int64_t num_items = 0;    ///< matrices it orthogonalized in them
  double prepare_s = 0, forward_wait_s = 0, ns_s = 0, return_wait_s = 0, apply_s = 0;
  /// [world] bytes of this stage's exchanges with each peer (0 for this rank itself).
  std::vector<int64_t> forward_sent_to, forward_received_from, return_sent_to, return_received_from;
};

struct StepStats {
  double check_s = 0;      ///< NaN/Inf check and the start-of-step agreement
  double momentum_s = 0;   ///< momentum and U of pieces bound for the wire
  double pack_s = 0;       ///< exchange layouts and issuing the collectives
  double comm_wait_s = 0;  ///< waiting for collectives
  double ns_s = 0;         ///< NS batches, with their iterate and result passes and own-row apply
  double apply_s = 0;      ///< applying rows returned by their owners
  double total_s = 0;
  /// A transport that moves nothing (fake world): filling receive buffers by the model
  /// (no real work; outside every phase).
  double model_fill_s = 0;
  int64_t bytes_sent = 0, bytes_received = 0;  ///< to and from other ranks
  int64_t agreement_bytes = 0;  ///< the start-of-step agreement's all_reduce (int64 entries; 0: none)
  int64_t num_stages = 0, num_ns_batches = 0, num_orthogonalized = 0;
  int64_t pipeline_depth = 0;
  int64_t num_streams = 0;  ///< most streams one stage's NS batches ran on
  /// Work begun inside backward: the stages exchanged early; the NS seconds and
  /// matrices that ran inside items_ready (before finish()): the early stages' and those of
  /// items whole on this rank (all of them at world 1); the model fills among model_fill_s
  /// that ran there.
  int64_t early_stages = 0, early_orthogonalized = 0;
  double early_ns_s = 0;
  double early_fill_s = 0;
  /// The begun work was dropped at the agreement (a rank's gradient changed since it was
  /// handed over, or its caller said so) and the step ran from the gradients as they were.
  bool begun_stale = false;
  /// (matrices, rows, cols) of each NS batch this rank ran, in order.
  std::vector<std::tuple<int64_t, int64_t, int64_t>> ns_batches;
  std::vector<StageTimeline> stages;
};

}  // namespace dmuon::step

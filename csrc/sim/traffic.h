// dmuon/sim/traffic.h — the bytes every rank sends and receives in each collective of a
// step's pipeline, split by link (same node or not), exactly as the all_to_alls move them
// (their own piece, which stays on the rank, excluded), from the engine's stage layout.
#pragma once

#include <cstdint>
#include <vector>

#include "sim/stage_layout.h"
#include "sim/topology.h"

namespace dmuon::sim {

/// One rank's bytes in one collective, by link.
struct RankTraffic {
  int64_t send_intra = 0, send_inter = 0, recv_intra = 0, recv_inter = 0;
  int64_t sent() const { return send_intra + send_inter; }
  int64_t received() const { return recv_intra + recv_inter; }
};

/// One all_to_all: whether the runtime issues it, and every rank's bytes.
struct Exchange {
  bool issued = false;
  std::vector<RankTraffic> ranks;  ///< [world]
};

/// Per stage: the forward all_to_all (updates to the ranks that compute them) and the
/// return (results back to every rank; owner mode only, never issued in gather mode).
struct StepTraffic {
  std::vector<Exchange> forward, back;
  /// Σ over the step of `rank`'s traffic.
  RankTraffic total(int rank) const;
};

/// The traffic of the engine's stages on `topology` (world sizes must match): each
/// stage's forward and return exchange as the engine issues them, split by link.
StepTraffic step_traffic(const StageLayout& layout, const Topology& topology);

}  // namespace dmuon::sim

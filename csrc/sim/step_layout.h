// dmuon/sim/step_layout.h — everything the bucket pipeline of one step is made of, for
// every rank at once: the Muon parameters' layouts, their owners, the buckets and the wire.
//
// A bucket layout written by hand (the GoogleTests' small cases): parameters, owners and
// buckets, from which the traffic and work of every rank follow by the rules of
// traffic.h and rank_prediction.h. The step engine's own layout is sim/stage_layout.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "dist/buckets.h"
#include "dist/shard_layout.h"

namespace dmuon::sim {

struct StepLayout {
  bool gather = false;                         ///< mode "gather": every rank computes every matrix
  int world_size = 1;
  std::vector<dist::ParamLayout> layouts;      ///< the Muon parameters, in runtime order
  std::vector<int> owners;                     ///< owner mode: each parameter's owner rank
  std::vector<dist::Bucket> buckets;           ///< pipeline order
  int64_t wire_element_size = 4;               ///< bytes per exchanged element
  std::vector<bool> active;                    ///< parameters with a gradient this step (empty: all)

  /// Throws dmuon::Error naming the field that is inconsistent.
  void validate() const;
  bool is_active(int idx) const { return active.empty() || active[static_cast<size_t>(idx)]; }
  /// Whether `rank` orthogonalizes parameter idx (its owner; every rank in gather mode).
  bool computes(int idx, int rank) const { return gather || owners[static_cast<size_t>(idx)] == rank; }
};

}  // namespace dmuon::sim

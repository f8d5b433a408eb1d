// dmuon/sim/collective_cost.h — the modelled time of one collective.
//
// The model: a collective costs its link's latency plus bytes / bandwidth.
//   all_to_all   latency (the inter-node one when any byte crosses nodes) + the slowest
//                rank's transfer, where a rank's transfer is the slower of its two links,
//                each carrying the larger of what the rank sends and receives over it
//                (full duplex; NVLink and the NIC work at once).
//   ring         all-gather / reduce-scatter of a buffer of B bytes (the gathered size) over
//                S ranks: latency + (S−1)/S · B / bandwidth; all-reduce twice that (NCCL's
//                bus-bandwidth model); the bandwidth is the network's when the group spans
//                nodes (every ring crosses a NIC), else the intra-node link's.
#pragma once

#include <cstdint>

#include "sim/topology.h"
#include "sim/traffic.h"

namespace dmuon::sim {

/// Seconds of one all_to_all moving `exchange` on `topology`; 0 when it is not issued.
double all_to_all_seconds(const Exchange& exchange, const Topology& topology);

enum class RingKind { kAllGather, kReduceScatter, kAllReduce };

/// Seconds of a ring collective of `bytes` (the full, gathered buffer) over the ranks of
/// `group` (its topology); 0 for a group of one rank.
double ring_seconds(RingKind kind, int64_t bytes, const Topology& group);

}  // namespace dmuon::sim

// dmuon/sim/collective_cost.cpp — latency + bytes / bandwidth.
#include "sim/collective_cost.h"

#include <algorithm>

#include "common/check.h"

namespace dmuon::sim {

double all_to_all_seconds(const Exchange& exchange, const Topology& topology) {
  if (!exchange.issued) return 0.0;
  DMUON_CHECK(static_cast<int>(exchange.ranks.size()) == topology.world_size(), "all_to_all_seconds: ",
              exchange.ranks.size(), " ranks of traffic on a topology of ", topology.world_size());
  double slowest = 0.0;
  bool crosses_nodes = false;
  for (const RankTraffic& t : exchange.ranks) {
    const double intra = static_cast<double>(std::max(t.send_intra, t.recv_intra)) / topology.intra().bytes_per_s;
    const double inter = static_cast<double>(std::max(t.send_inter, t.recv_inter)) / topology.inter().bytes_per_s;
    slowest = std::max({slowest, intra, inter});
    crosses_nodes = crosses_nodes || t.send_inter > 0 || t.recv_inter > 0;
  }
  return (crosses_nodes ? topology.inter().latency_s : topology.intra().latency_s) + slowest;
}

double ring_seconds(RingKind kind, int64_t bytes, const Topology& group) {
  DMUON_CHECK(bytes >= 0, "ring_seconds: bytes must be >= 0, got ", bytes);
  const int size = group.world_size();
  if (size == 1) return 0.0;
  const Link& link = group.spans_nodes() ? group.inter() : group.intra();
  const double factor = (kind == RingKind::kAllReduce ? 2.0 : 1.0) * (size - 1) / size;
  return link.latency_s + factor * static_cast<double>(bytes) / link.bytes_per_s;
}

}  // namespace dmuon::sim

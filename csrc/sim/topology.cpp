// dmuon/sim/topology.cpp — validation and the two-level cluster layout.
#include "sim/topology.h"

#include <cmath>

#include "common/check.h"

namespace dmuon::sim {
namespace {

void check_link(const Link& link, const char* name) {
  DMUON_CHECK(std::isfinite(link.bytes_per_s) && link.bytes_per_s > 0, name,
              " bandwidth must be a positive number of bytes/s, got ", link.bytes_per_s);
  DMUON_CHECK(std::isfinite(link.latency_s) && link.latency_s >= 0, name, " latency must be >= 0 s, got ",
              link.latency_s);
}

}  // namespace

Topology::Topology(std::vector<int> node_of, Link intra, Link inter)
    : node_of_(std::move(node_of)), intra_(intra), inter_(inter) {
  DMUON_CHECK(!node_of_.empty(), "a topology needs at least one rank");
  for (size_t r = 0; r < node_of_.size(); ++r) {
    DMUON_CHECK(node_of_[r] >= 0, "node_of[", r, "] must be >= 0, got ", node_of_[r]);
    spans_nodes_ = spans_nodes_ || node_of_[r] != node_of_[0];
  }
  check_link(intra_, "intra-node");
  check_link(inter_, "inter-node");
}

Topology Topology::two_level(int world_size, int gpus_per_node, Link intra, Link inter, int first_global_rank,
                             int stride) {
  DMUON_CHECK(world_size >= 1, "world_size must be >= 1, got ", world_size);
  DMUON_CHECK(gpus_per_node >= 1, "gpus_per_node must be >= 1, got ", gpus_per_node);
  DMUON_CHECK(first_global_rank >= 0 && stride >= 1, "first_global_rank must be >= 0 and stride >= 1, got ",
              first_global_rank, " and ", stride);
  std::vector<int> node_of(static_cast<size_t>(world_size));
  for (int r = 0; r < world_size; ++r) node_of[static_cast<size_t>(r)] = (first_global_rank + r * stride) / gpus_per_node;
  return Topology(std::move(node_of), intra, inter);
}

}  // namespace dmuon::sim

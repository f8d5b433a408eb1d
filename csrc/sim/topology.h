// dmuon/sim/topology.h — where the ranks of a process group sit: nodes of GPUs joined by
// a fast link inside a node (NVLink) and a slower one between nodes (the network).
//
// The projection's link model: a rank moves bytes to and from peers on its own node over
// its intra-node link and to and from other nodes over its own network interface (one NIC
// per GPU, as 8-GPU H100/H200 nodes have); both links work at once, each full duplex.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace dmuon::sim {

/// One kind of link: sustained bandwidth and the fixed cost of one collective over it.
struct Link {
  double bytes_per_s = 0.0;
  double latency_s = 0.0;
};

class Topology {
 public:
  /// Group rank i sits on node node_of[i]. Throws dmuon::Error naming the argument when
  /// the node list is empty or negative, or a link has no bandwidth or a negative latency.
  Topology(std::vector<int> node_of, Link intra, Link inter);

  /// A group whose rank i is global rank first + i·stride of a cluster of nodes of
  /// gpus_per_node consecutive global ranks (a flat world: first 0, stride 1; an HSDP shard
  /// group of replica q: first q·S, stride 1; its replicate group of shard s: first s,
  /// stride S).
  static Topology two_level(int world_size, int gpus_per_node, Link intra, Link inter, int first_global_rank = 0,
                            int stride = 1);

  int world_size() const { return static_cast<int>(node_of_.size()); }
  int node_of(int rank) const { return node_of_[static_cast<size_t>(rank)]; }
  bool same_node(int a, int b) const { return node_of(a) == node_of(b); }
  /// Whether the group's ranks sit on more than one node.
  bool spans_nodes() const { return spans_nodes_; }
  const Link& intra() const { return intra_; }
  const Link& inter() const { return inter_; }

 private:
  std::vector<int> node_of_;
  Link intra_, inter_;
  bool spans_nodes_ = false;
};

}  // namespace dmuon::sim

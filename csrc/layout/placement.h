// dmuon/layout/placement.h — where the pieces of a DTensor live on a device mesh.
//
// A parameter of global shape S is placed on a mesh of shape M (any number of dims) with
// one placement per mesh dim: Replicate, Shard(d) (torch.chunk of tensor dim d over that
// mesh dim: chunks of ceil(size / n), trailing ones shorter or empty) or _StridedShard(d,
// split_factor) (what FSDP2 puts on its mesh dim when a later mesh dim, e.g. TP, already
// shards the same tensor dim: FSDP2 chunks the TP-local tensor, so its split is applied
// inside the later ones'; split_factor is their product of mesh sizes).
// Several mesh dims may shard the same tensor dim: each splits the range left by the
// earlier ones (mesh-dim order; a strided shard after the later shards of its dim). So
// every rank holds one box of the tensor (a range per dim; replicas hold equal boxes, the
// distinct boxes partition the tensor), and its local tensor is that box, contiguous.
// Ranks of the transport group outside the parameter's mesh hold nothing.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dmuon::layout {

enum class PlacementKind : int { kReplicate = 0, kShard = 1, kStridedShard = 2 };

/// The placement of one mesh dim.
struct DimPlacement {
  PlacementKind kind = PlacementKind::kReplicate;
  int64_t dim = 0;           ///< the tensor dim split (Shard, StridedShard)
  int64_t split_factor = 1;  ///< StridedShard only: product of the later mesh dims splitting `dim`
  bool operator==(const DimPlacement& o) const {
    return kind == o.kind && dim == o.dim && split_factor == o.split_factor;
  }
};

/// A range [begin, begin + count) of one tensor dim.
struct DimRange {
  int64_t begin = 0;
  int64_t count = 0;
  bool operator==(const DimRange& o) const { return begin == o.begin && count == o.count; }
};

/// What one rank holds of a tensor: a range per tensor dim (every count 0: nothing).
using Box = std::vector<DimRange>;

/// Elements of a box (0 when any range is empty).
int64_t box_numel(const Box& box);

/// A parameter's placement on a mesh, seen by every rank of the transport group alike.
struct MeshPlacement {
  std::vector<int64_t> mesh_shape;
  std::vector<DimPlacement> placements;  ///< one per mesh dim
  /// [rank of the transport group] → its coordinates in the mesh (one per mesh dim), or
  /// empty where that rank is not in the mesh (it holds none of the parameter).
  std::vector<std::vector<int64_t>> rank_coords;

  int world_size() const { return static_cast<int>(rank_coords.size()); }
  /// Throws dmuon::Error naming `what` and the placements when they cannot place a tensor
  /// of `global_shape` (a dim out of range, a bad coordinate, a split factor that is not
  /// the product of the later mesh sizes splitting its dim).
  void validate(const std::vector<int64_t>& global_shape, const std::string& what) const;
  /// "(Shard(0), Replicate()) on a 2x2 mesh" (errors).
  std::string describe() const;
};

/// The box of the rank at `coords` (validate() first).
Box box_at(const std::vector<int64_t>& global_shape, const MeshPlacement& placement,
           const std::vector<int64_t>& coords);

/// Every transport rank's box (validates; a rank outside the mesh holds an empty box).
std::vector<Box> rank_boxes(const std::vector<int64_t>& global_shape, const MeshPlacement& placement,
                            const std::string& what);

}  // namespace dmuon::layout

// dmuon/layout/placement.cpp — boxes of a tensor placed on a device mesh (see placement.h).
#include "layout/placement.h"

#include <sstream>

#include "common/check.h"

namespace dmuon::layout {
namespace {

std::string placement_name(const DimPlacement& p) {
  switch (p.kind) {
    case PlacementKind::kReplicate: return "Replicate()";
    case PlacementKind::kShard: return "Shard(" + std::to_string(p.dim) + ")";
    case PlacementKind::kStridedShard:
      return "_StridedShard(" + std::to_string(p.dim) + ", split_factor=" + std::to_string(p.split_factor) + ")";
  }
  return "?";
}

bool splits(const DimPlacement& p, int64_t dim) { return p.kind != PlacementKind::kReplicate && p.dim == dim; }

// The mesh dims that split tensor dim `dim`, in the order their splits apply: mesh-dim
// order, a strided shard after the later mesh dims of its tensor dim (right to left, as
// FSDP2 over TP shards).
std::vector<size_t> split_order(const MeshPlacement& mp, int64_t dim) {
  std::vector<size_t> order, deferred;
  for (size_t m = 0; m < mp.placements.size(); ++m) {
    if (!splits(mp.placements[m], dim)) continue;
    (mp.placements[m].kind == PlacementKind::kStridedShard ? deferred : order).push_back(m);
  }
  for (auto it = deferred.rbegin(); it != deferred.rend(); ++it) order.push_back(*it);
  return order;
}

// torch.chunk's piece `index` of `n` of the range `r`.
DimRange chunk_of(const DimRange& r, int64_t n, int64_t index) {
  const int64_t chunk = (r.count + n - 1) / n;
  const int64_t begin = std::min(r.count, index * chunk);
  const int64_t end = std::min(r.count, begin + chunk);
  return {r.begin + begin, end - begin};
}

}  // namespace

int64_t box_numel(const Box& box) {
  int64_t numel = 1;
  for (const DimRange& r : box) numel *= r.count;
  return box.empty() ? 0 : numel;
}

std::string MeshPlacement::describe() const {
  std::ostringstream out;
  out << "(";
  for (size_t m = 0; m < placements.size(); ++m) out << (m ? ", " : "") << placement_name(placements[m]);
  out << ") on a ";
  for (size_t m = 0; m < mesh_shape.size(); ++m) out << (m ? "x" : "") << mesh_shape[m];
  out << " mesh";
  return out.str();
}

void MeshPlacement::validate(const std::vector<int64_t>& global_shape, const std::string& what) const {
  const std::string where = what + " with placements " + describe();
  DMUON_CHECK(!mesh_shape.empty() && placements.size() == mesh_shape.size(), where, ": ", placements.size(),
              " placements for a mesh of ", mesh_shape.size(), " dims");
  for (int64_t size : mesh_shape) DMUON_CHECK(size >= 1, where, ": mesh dim of size ", size);
  const int64_t ndim = static_cast<int64_t>(global_shape.size());
  for (size_t m = 0; m < placements.size(); ++m) {
    const DimPlacement& p = placements[m];
    if (p.kind == PlacementKind::kReplicate) continue;
    DMUON_CHECK(p.dim >= 0 && p.dim < ndim, where, ": mesh dim ", m, " shards tensor dim ", p.dim, " of a ", ndim,
                "-D tensor");
    if (p.kind != PlacementKind::kStridedShard) continue;
    int64_t later = 1;
    for (size_t k = m + 1; k < placements.size(); ++k)
      if (splits(placements[k], p.dim)) later *= mesh_shape[k];
    DMUON_CHECK(p.split_factor == later, where, ": mesh dim ", m, "'s split factor ", p.split_factor,
                " is not the product of the later mesh dims splitting tensor dim ", p.dim, " (", later,
                "); DMuon places strided shards as FSDP2 makes them");
  }
  DMUON_CHECK(!rank_coords.empty(), where, ": no ranks");
  bool any = false;
  for (size_t r = 0; r < rank_coords.size(); ++r) {
    const std::vector<int64_t>& c = rank_coords[r];
    if (c.empty()) continue;
    any = true;
    DMUON_CHECK(c.size() == mesh_shape.size(), where, ": rank ", r, " has ", c.size(), " mesh coordinates");
    for (size_t m = 0; m < c.size(); ++m)
      DMUON_CHECK(c[m] >= 0 && c[m] < mesh_shape[m], where, ": rank ", r, "'s coordinate ", c[m], " on mesh dim ", m,
                  " of size ", mesh_shape[m]);
  }
  DMUON_CHECK(any, where, ": no rank of the group is in its mesh");
}

Box box_at(const std::vector<int64_t>& global_shape, const MeshPlacement& mp, const std::vector<int64_t>& coords) {
  Box box;
  if (coords.empty()) return Box(global_shape.size(), DimRange{0, 0});
  for (size_t d = 0; d < global_shape.size(); ++d) {
    DimRange range{0, global_shape[d]};
    for (size_t m : split_order(mp, static_cast<int64_t>(d))) range = chunk_of(range, mp.mesh_shape[m], coords[m]);
    box.push_back(range);
  }
  return box;
}

std::vector<Box> rank_boxes(const std::vector<int64_t>& global_shape, const MeshPlacement& mp,
                            const std::string& what) {
  mp.validate(global_shape, what);
  std::vector<Box> boxes;
  for (const std::vector<int64_t>& coords : mp.rank_coords) boxes.push_back(box_at(global_shape, mp, coords));
  return boxes;
}

}  // namespace dmuon::layout

// dmuon._C.dist.ParamLayout: a parameter's layout across ranks (csrc/layout) from the plain
// data Python passes (dmuon.distributed): row blocks, column blocks, mesh placements.
// NOTE: pybind11 and core headers only (no torch), like every file here.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <tuple>
#include <vector>

#include "common/check.h"
#include "layout/shard_layout.h"
#include "python/bindings.h"

namespace py = pybind11;

namespace dmuon::bindings {
namespace {

// A MeshPlacement from the plain data Python passes (dmuon.distributed.mesh_layout).
layout::MeshPlacement mesh_placement(std::vector<int64_t> mesh_shape,
                                   const std::vector<std::tuple<std::string, int64_t, int64_t>>& placements,
                                   std::vector<std::vector<int64_t>> rank_coords) {
  layout::MeshPlacement mp;
  mp.mesh_shape = std::move(mesh_shape);
  mp.rank_coords = std::move(rank_coords);
  for (const auto& [kind, dim, split] : placements) {
    layout::DimPlacement p;
    if (kind == "replicate") p.kind = layout::PlacementKind::kReplicate;
    else if (kind == "shard") p.kind = layout::PlacementKind::kShard;
    else if (kind == "strided_shard") p.kind = layout::PlacementKind::kStridedShard;
    else DMUON_FAIL("placement kind must be 'replicate', 'shard' or 'strided_shard', got '", kind, "'");
    p.dim = dim;
    p.split_factor = split;
    mp.placements.push_back(p);
  }
  return mp;
}

}  // namespace

void register_layout_bindings(py::module_& m) {
  py::module_ d = m.def_submodule("dist", "parameter layouts and the step runtime's options and statistics");

  py::class_<layout::ParamLayout>(d, "ParamLayout")
      .def(py::init([](std::vector<int64_t> global_shape, int64_t batch_dims, bool sharded,
                       std::vector<int64_t> row_blocks, bool transposed, std::vector<int64_t> mesh_shape,
                       std::vector<std::tuple<std::string, int64_t, int64_t>> placements,
                       std::vector<std::vector<int64_t>> rank_coords, int64_t col_blocks) {
             layout::ParamLayout layout{std::move(global_shape), batch_dims, sharded, std::move(row_blocks),
                                      transposed, col_blocks};
             if (!mesh_shape.empty() || !placements.empty() || !rank_coords.empty())
               layout.mesh = mesh_placement(std::move(mesh_shape), placements, std::move(rank_coords));
             return layout;
           }),
           py::arg("global_shape"), py::arg("batch_dims"), py::arg("sharded"),
           py::arg("row_blocks") = std::vector<int64_t>{}, py::arg("transposed") = false,
           py::arg("mesh_shape") = std::vector<int64_t>{},
           py::arg("placements") = std::vector<std::tuple<std::string, int64_t, int64_t>>{},
           py::arg("rank_coords") = std::vector<std::vector<int64_t>>{}, py::arg("col_blocks") = int64_t{0},
           "col_blocks: equal column blocks, each orthogonalized as a matrix of its own (0: none); "
           "placements: per mesh dim ('replicate' | 'shard' | 'strided_shard', tensor dim, split factor); "
           "rank_coords: per rank of the group its mesh coordinates ([] outside the mesh)")
      .def("rank_boxes", [](const layout::ParamLayout& l, int world, const std::string& what) {
             std::vector<std::vector<std::pair<int64_t, int64_t>>> out;
             for (const layout::Box& box : l.rank_boxes(world, what)) {
               out.emplace_back();
               for (const layout::DimRange& r : box) out.back().emplace_back(r.begin, r.count);
             }
             return out;
           }, py::arg("world_size"), py::arg("what") = std::string("parameter"),
           "every rank's box: per tensor dim (begin, count)")
      .def_readonly("global_shape", &layout::ParamLayout::global_shape)
      .def_readonly("batch_dims", &layout::ParamLayout::batch_dims)
      .def_readonly("sharded", &layout::ParamLayout::sharded)
      .def_readonly("row_blocks", &layout::ParamLayout::row_blocks)
      .def_readonly("transposed", &layout::ParamLayout::transposed)
      .def_readonly("col_blocks", &layout::ParamLayout::col_blocks)
      .def_property_readonly("cols", &layout::ParamLayout::cols)
      .def_property_readonly("num_matrices", &layout::ParamLayout::num_matrices)
      .def_property_readonly("uniform", &layout::ParamLayout::uniform)
      .def("matrix_blocks", [](const layout::ParamLayout& l) {
        std::vector<std::pair<int64_t, int64_t>> out;
        for (const auto& b : l.matrix_blocks()) out.emplace_back(b.begin, b.count);
        return out;
      })
      .def("validate", [](const layout::ParamLayout& l, const std::string& what) { l.validate(what.c_str()); },
           py::arg("what"));
}

}  // namespace dmuon::bindings

// dmuon._C.dist: parameter layouts, the step runtime's statistics, and how
// dmuon treats a process group (the runtime itself: dmuon._C.engine.EngineRuntime).
#include <pybind11/stl.h>
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>
#include <torch/python.h>

#include <array>

#include "bindings.h"
#include "optional_tensors.h"
#include "common/check.h"
#include "dist/shard_layout.h"
#include "dist/world_model.h"
#include "runtime_options.h"
#include "world_detect.h"

namespace py = pybind11;

namespace dmuon::torch_adapter {
namespace {

// Stage phase times as (prepare, ns, return_pack, apply) tuples.
std::vector<std::array<double, sim::kNumPhases>> phase_tuples(const std::vector<sim::BucketTimes>& times) {
  std::vector<std::array<double, sim::kNumPhases>> out;
  for (const auto& t : times) out.push_back(t.seconds);
  return out;
}

// A MeshPlacement from the plain data Python passes (dmuon.distributed.mesh_layout).
dist::MeshPlacement mesh_placement(std::vector<int64_t> mesh_shape,
                                   const std::vector<std::tuple<std::string, int64_t, int64_t>>& placements,
                                   std::vector<std::vector<int64_t>> rank_coords) {
  dist::MeshPlacement mp;
  mp.mesh_shape = std::move(mesh_shape);
  mp.rank_coords = std::move(rank_coords);
  for (const auto& [kind, dim, split] : placements) {
    dist::DimPlacement p;
    if (kind == "replicate") p.kind = dist::PlacementKind::kReplicate;
    else if (kind == "shard") p.kind = dist::PlacementKind::kShard;
    else if (kind == "strided_shard") p.kind = dist::PlacementKind::kStridedShard;
    else DMUON_FAIL("placement kind must be 'replicate', 'shard' or 'strided_shard', got '", kind, "'");
    p.dim = dim;
    p.split_factor = split;
    mp.placements.push_back(p);
  }
  return mp;
}

}  // namespace

void register_dist_bindings(py::module_& m) {
  py::module_ d = m.def_submodule("dist", "parameter layouts and the step runtime's options and statistics");

  py::class_<dist::ParamLayout>(d, "ParamLayout")
      .def(py::init([](std::vector<int64_t> global_shape, int64_t batch_dims, bool sharded,
                       std::vector<int64_t> row_blocks, bool transposed, std::vector<int64_t> mesh_shape,
                       std::vector<std::tuple<std::string, int64_t, int64_t>> placements,
                       std::vector<std::vector<int64_t>> rank_coords, int64_t col_blocks) {
             dist::ParamLayout layout{std::move(global_shape), batch_dims, sharded, std::move(row_blocks),
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
      .def("rank_boxes", [](const dist::ParamLayout& l, int world, const std::string& what) {
             std::vector<std::vector<std::pair<int64_t, int64_t>>> out;
             for (const dist::Box& box : l.rank_boxes(world, what)) {
               out.emplace_back();
               for (const dist::DimRange& r : box) out.back().emplace_back(r.begin, r.count);
             }
             return out;
           }, py::arg("world_size"), py::arg("what") = std::string("parameter"),
           "every rank's box: per tensor dim (begin, count)")
      .def_readonly("global_shape", &dist::ParamLayout::global_shape)
      .def_readonly("batch_dims", &dist::ParamLayout::batch_dims)
      .def_readonly("sharded", &dist::ParamLayout::sharded)
      .def_readonly("row_blocks", &dist::ParamLayout::row_blocks)
      .def_readonly("transposed", &dist::ParamLayout::transposed)
      .def_readonly("col_blocks", &dist::ParamLayout::col_blocks)
      .def_property_readonly("cols", &dist::ParamLayout::cols)
      .def_property_readonly("num_matrices", &dist::ParamLayout::num_matrices)
      .def_property_readonly("uniform", &dist::ParamLayout::uniform)
      .def("matrix_blocks", [](const dist::ParamLayout& l) {
        std::vector<std::pair<int64_t, int64_t>> out;
        for (const auto& b : l.matrix_blocks()) out.emplace_back(b.begin, b.count);
        return out;
      })
      .def("validate", [](const dist::ParamLayout& l, const std::string& what) { l.validate(what.c_str()); },
           py::arg("what"));

  py::class_<StepStats>(d, "StepStats")
      .def_readonly("momentum_s", &StepStats::momentum_s)
      .def_readonly("pack_s", &StepStats::pack_s)
      .def_readonly("comm_wait_s", &StepStats::comm_wait_s)
      .def_readonly("ns_s", &StepStats::ns_s)
      .def_readonly("early_stages", &StepStats::early_stages)
      .def_readonly("early_orthogonalized", &StepStats::early_orthogonalized)
      .def_readonly("early_ns_s", &StepStats::early_ns_s)
      .def_readonly("early_fill_s", &StepStats::early_fill_s)
      .def_readonly("apply_s", &StepStats::apply_s)
      .def_readonly("total_s", &StepStats::total_s)
      .def_readonly("bytes_sent", &StepStats::bytes_sent)
      .def_readonly("bytes_received", &StepStats::bytes_received)
      .def_readonly("num_buckets", &StepStats::num_buckets)
      .def_readonly("num_orthogonalized", &StepStats::num_orthogonalized)
      .def_readonly("num_fused", &StepStats::num_fused)
      .def_property_readonly("num_fused_batches", [](const StepStats& s) { return s.fused_batches.size(); })
      .def_readonly("num_fused_streams", &StepStats::num_fused_streams)
      .def_readonly("fused_batches", &StepStats::fused_batches)
      .def_readonly("pipeline_depth", &StepStats::pipeline_depth)
      .def_readonly("orthogonalized", &StepStats::orthogonalized)
      .def_property_readonly("bucket_times", [](const StepStats& s) { return phase_tuples(s.bucket_times); })
      .def_readonly("model_fill_s", &StepStats::model_fill_s);

  d.def(
      "transport_of",
      [](const std::string& group_name, const std::string& device_type) {
        if (group_name.empty()) return std::string(dist::transport_name(dist::Transport::kSingle));
        return std::string(dist::transport_name(
            detect_world_model(c10d::resolve_process_group(group_name), device_type).transport()));
      },
      py::arg("group_name"), py::arg("device_type") = "cpu",
      "'single' (group_name ''), 'fake' (torch's fake backend) or 'real': how dmuon treats the group");
}

}  // namespace dmuon::torch_adapter

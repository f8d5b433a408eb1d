// dmuon._C.dist: parameter layouts, the step runtime's options and statistics, and how
// dmuon treats a process group (the runtime itself: dmuon._C.engine.EngineRuntime).
#include <pybind11/stl.h>
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>
#include <torch/python.h>

#include <array>

#include "bindings.h"
#include "optional_tensors.h"
#include "common/check.h"
#include "layout/shard_layout.h"
#include "layout/world_model.h"
#include "group_options.h"
#include "optim/update_rule.h"
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

void register_dist_bindings(py::module_& m) {
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
      .def_property_readonly("placed_on_mesh", [](const layout::ParamLayout& l) { return l.mesh.has_value(); })
      .def("describe_placements", [](const layout::ParamLayout& l) { return l.mesh ? l.mesh->describe() : std::string(); })
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
      .def_property_readonly("matrix_cols", &layout::ParamLayout::matrix_cols)
      .def_property_readonly("matrix_rows", &layout::ParamLayout::matrix_rows)
      .def_property_readonly("cols", &layout::ParamLayout::cols)
      .def_property_readonly("num_matrices", &layout::ParamLayout::num_matrices)
      .def_property_readonly("uniform", &layout::ParamLayout::uniform)
      .def("matrix_blocks", [](const layout::ParamLayout& l) {
        std::vector<std::pair<int64_t, int64_t>> out;
        for (const auto& b : l.matrix_blocks()) out.emplace_back(b.begin, b.count);
        return out;
      })
      .def("validate", [](const layout::ParamLayout& l, const std::string& what) { l.validate(what.c_str()); },
           py::arg("what"))
      .def("rank_rows", [](const layout::ParamLayout& l, int world) {
        std::vector<std::pair<int64_t, int64_t>> out;
        for (const auto& b : l.rank_rows(world)) out.emplace_back(b.begin, b.count);
        return out;
      });

  py::class_<RuntimeOptions>(d, "RuntimeOptions")
      .def(py::init([](std::string mode, int64_t bucket_bytes, std::string wire_dtype,
                       std::string solver, std::string device_type, bool profile, std::string cost_model,
                       std::vector<ns::Schedule> cost_schedules, int64_t fused_streams, std::string plan_source,
                       bool record_timeline, std::optional<int64_t> pipeline_depth,
                       std::optional<int64_t> ns_batch_mb, std::optional<bool> cuda_graphs, bool backward_order) {
             return RuntimeOptions{std::move(mode),        bucket_bytes, std::move(wire_dtype),
                                   std::move(solver),      std::move(device_type), profile,
                                   std::move(cost_model),  std::move(cost_schedules), fused_streams,
                                   std::move(plan_source), record_timeline,
                                   pipeline_depth,         ns_batch_mb,  cuda_graphs, backward_order};
           }),
           py::arg("mode") = "owner", py::arg("bucket_bytes") = int64_t{64} << 20,
           py::arg("wire_dtype") = "auto", py::arg("solver") = "milp",
           py::arg("device_type") = "cpu", py::arg("profile") = false, py::arg("cost_model") = "analytic",
           py::arg("cost_schedules") = std::vector<ns::Schedule>{},
           py::arg("fused_streams") = int64_t{0}, py::arg("plan_source") = "auto",
           py::arg("record_timeline") = false, py::arg("pipeline_depth") = py::none(),
           py::arg("ns_batch_mb") = py::none(), py::arg("cuda_graphs") = py::none(),
           py::arg("backward_order") = false)
      .def_readonly("backward_order", &RuntimeOptions::backward_order)
      .def_readonly("plan_source", &RuntimeOptions::plan_source)
      .def_readonly("record_timeline", &RuntimeOptions::record_timeline)
      .def_readonly("cost_model", &RuntimeOptions::cost_model)
      .def_readonly("device_type", &RuntimeOptions::device_type);

  py::class_<MuonGroupOptions>(d, "GroupOptions")
      .def(py::init([](double lr, double weight_decay, double momentum, bool nesterov, std::string adjust_lr,
                       ns::Schedule schedule, bool normuon, double normuon_beta2, double normuon_eps) {
             optim::parse_adjust_lr(adjust_lr);  // NOTE: the error names adjust_lr here, not mid-step
             const optim::NormuonRule rule{normuon, normuon_beta2, normuon_eps};
             if (normuon) rule.validate();  // names normuon_beta2 / normuon_eps
             return MuonGroupOptions{lr, weight_decay, momentum, nesterov, std::move(adjust_lr), std::move(schedule),
                                     rule};
           }),
           py::arg("lr"), py::arg("weight_decay"), py::arg("momentum"), py::arg("nesterov"),
           py::arg("adjust_lr"), py::arg("schedule"), py::arg("normuon") = false, py::arg("normuon_beta2") = 0.95,
           py::arg("normuon_eps") = 1e-8)
      .def_readonly("schedule", &MuonGroupOptions::schedule);

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
        if (group_name.empty()) return std::string(layout::transport_name(layout::Transport::kSingle));
        return std::string(layout::transport_name(
            detect_world_model(c10d::resolve_process_group(group_name), device_type).transport()));
      },
      py::arg("group_name"), py::arg("device_type") = "cpu",
      "'single' (group_name ''), 'fake' (torch's fake backend) or 'real': how dmuon treats the group");
}

}  // namespace dmuon::torch_adapter

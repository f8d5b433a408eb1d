// dmuon._C.dist: the step runtime's statistics, and how dmuon treats a process
// group (parameter layouts: python/layout_bindings.cpp; the runtime itself:
// dmuon._C.engine.EngineRuntime).
#include <pybind11/stl.h>
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>
#include <torch/python.h>

#include <array>

#include "bindings.h"
#include "optional_tensors.h"
#include "common/check.h"
#include "layout/world_model.h"
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

}  // namespace

void register_dist_bindings(py::module_& m) {
  py::module_ d = m.attr("dist");  // NOTE: made by register_layout_bindings

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

// dmuon._C.dist: the step runtime's options and statistics, and how dmuon treats a process
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

}  // namespace

void register_dist_bindings(py::module_& m) {
  py::module_ d = m.attr("dist");  // NOTE: made by register_layout_bindings

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

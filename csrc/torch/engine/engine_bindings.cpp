// dmuon._C.engine: the step engine's torch runtime (EngineRuntime).
#include <pybind11/stl.h>
#include <torch/python.h>

#include "bindings.h"
#include "engine/engine_runtime.h"
#include "python/bindings.h"

namespace py = pybind11;

namespace dmuon::torch_adapter {
namespace {

// Python's None tensors (a parameter without a gradient or buffer this step) as undefined
// at::Tensors.
std::vector<at::Tensor> or_undefined(const std::vector<std::optional<at::Tensor>>& tensors) {
  std::vector<at::Tensor> out;
  for (const auto& t : tensors) out.push_back(t.has_value() ? *t : at::Tensor());
  return out;
}

}  // namespace

void register_engine_bindings(py::module_& m) {
  py::module_ e = m.attr("engine");  // NOTE: made, with the runtime's options, by register_runtime_bindings

  e.def(
      "agree_start",
      [](const std::string& group_name, const py::object& device_type, const step::StartChecks& checks, int64_t step_idx) {
        const step::DeviceKind device = bindings::choice<step::DeviceKind, step::parse_device_kind>(device_type);
        py::gil_scoped_release release;
        EngineRuntime::agree_start(group_name, device, checks, step_idx);
      },
      py::arg("group_name"), py::arg("device_type"), py::arg("checks"), py::arg("step_idx"),
      "the start agreement alone (collective), before a runtime is made: raises as a step does");

  py::class_<EngineRuntime>(e, "EngineRuntime")
      .def(py::init<const std::string&, std::vector<std::string>, std::vector<layout::ParamLayout>,
                    const std::vector<std::string>&, std::vector<int64_t>, step::RuntimeOptions,
                    std::shared_ptr<OwnedExchange>, std::vector<int64_t>>(),
           py::arg("group_name"), py::arg("names"), py::arg("layouts"), py::arg("dtypes"), py::arg("group_slot"),
           py::arg("options"), py::arg("owned") = nullptr, py::arg("owned_group_slot") = std::vector<int64_t>{},
           // NOTE: the plan is agreed here over c10d (see dist_bindings.cpp: Gloo's thread
           // needs the GIL to drop tensors with Python objects).
           py::call_guard<py::gil_scoped_release>())
      .def(
          "step",
          [](EngineRuntime& runtime, std::vector<std::optional<at::Tensor>> params,
             std::vector<std::optional<at::Tensor>> grads, std::vector<std::optional<at::Tensor>> momentum,
             std::vector<step::GroupRule> groups, int64_t step_idx, std::vector<std::string> extra_names,
             std::vector<std::optional<at::Tensor>> extra_grads, std::vector<std::optional<at::Tensor>> row_states,
             bool defer_result_agreement, const step::StartChecks& checks) {
            const std::vector<at::Tensor> p = or_undefined(params), g = or_undefined(grads), b = or_undefined(momentum);
            const std::vector<at::Tensor> e = or_undefined(extra_grads), v = or_undefined(row_states);
            step::StepOutcome out;
            {
              py::gil_scoped_release release;
              out = runtime.step(p, g, b, groups, step_idx, extra_names, e, v, defer_result_agreement, checks);
            }
            return py::dict(py::arg("applied") = out.applied(), py::arg("nonfinite_params") = out.nonfinite_params,
                            py::arg("nonfinite_extra") = out.nonfinite_extra, py::arg("active") = out.active,
                            py::arg("message") = out.message);
          },
          py::arg("params"), py::arg("grads"), py::arg("momentum_buffers"), py::arg("groups"), py::arg("step_idx"),
          py::arg("extra_names"), py::arg("extra_grads"),
          // NorMuon's v per parameter (None: the group has no NorMuon or no gradient).
          py::arg("row_states") = std::vector<std::optional<at::Tensor>>{},
          // True: with several ranks, return before the result agreement (agree_results()).
          py::arg("defer_result_agreement") = false, py::arg("checks") = step::StartChecks{})
      .def("agree_results", &EngineRuntime::agree_results, py::arg("extra_max") = std::vector<int64_t>{},
           py::call_guard<py::gil_scoped_release>(),
           "the result agreement of a step returned with defer_result_agreement=True (every rank); extra_max "
           "(ordered integers) agreed with it (max over the ranks) and returned")
      .def("begin_step", &EngineRuntime::begin_step, py::arg("groups"), py::arg("step_idx"),
           py::call_guard<py::gil_scoped_release>())
      .def(
          "params_ready",
          [](EngineRuntime& runtime, std::vector<int64_t> ready, std::vector<at::Tensor> params,
             std::vector<at::Tensor> grads, std::vector<at::Tensor> momentum) {
            py::gil_scoped_release release;
            runtime.params_ready(ready, params, grads, momentum);
          },
          py::arg("ready"), py::arg("params"), py::arg("grads"), py::arg("momentum_buffers"))
      .def("discard", &EngineRuntime::discard, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("step_open", &EngineRuntime::step_open)
      .def_property_readonly("writes_began", &EngineRuntime::writes_began,
                             "whether the last step's writes on this rank began and its result agreement did not "
                             "complete (after an error: momentum and parameters may be torn)")
      .def_property_readonly("rank", &EngineRuntime::rank)
      .def_property_readonly("world_size", &EngineRuntime::world_size)
      .def_property_readonly("owners", &EngineRuntime::owners)
      .def_property_readonly("item_owners", &EngineRuntime::item_owners)
      .def_property_readonly("item_params", &EngineRuntime::item_params)
      .def_property_readonly("plan_text", &EngineRuntime::plan_text)
      .def_property_readonly("predicted_makespan_s", &EngineRuntime::predicted_makespan_s)
      .def_property_readonly("backward_stage_note", &EngineRuntime::backward_stage_note)
      .def_property_readonly("num_buckets", &EngineRuntime::num_stages)
      .def_property_readonly("last_stats", &EngineRuntime::last_stats)
      .def_property_readonly("transport",
                             [](const EngineRuntime& r) { return layout::transport_name(r.world_model().transport()); })
      .def_property_readonly("options", &EngineRuntime::options)
      .def_property_readonly("stage_layout", &EngineRuntime::stage_layout,
                             "the last step's stages on every rank (dmuon._C.sim.StageLayout) for the projection")
      .def_property_readonly("stage_items", &EngineRuntime::stage_items)
      .def_property_readonly("stage_stats", &EngineRuntime::stage_stats)
      .def_property_readonly("predicted_rank_seconds", &EngineRuntime::predicted_rank_seconds)
      .def_property_readonly("cost_entries", [](const EngineRuntime& r) { return r.measured_costs().entries(); })
      .def_property_readonly("pipeline_depth", &EngineRuntime::pipeline_depth)
      .def_property_readonly(
          "execution",
          [](const EngineRuntime& r) {
            const step::EngineOptions& e = r.engine_options();
            py::dict d;
            d["fused_streams"] = e.num_streams, d["pipeline_depth"] = r.pipeline_depth();
            d["ns_batch_mb"] = e.ns_batch_bytes >> 20, d["cuda_graphs"] = e.graphs;
            d["profile"] = e.timing == step::PhaseTiming::kSynchronized;
            return d;
          },
          "The code-path switches as resolved when the runtime was made (options, else DMUON_* variables)");
}

}  // namespace dmuon::torch_adapter

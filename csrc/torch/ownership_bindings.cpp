// dmuon._C.ownership: the weight-ownership runtime and the storage controls its Python
// hooks use. Every method that may wait on a collective or on the worker thread releases
// the GIL (the worker and c10d's threads may need it to drop tensors).
#include <pybind11/stl.h>
#include <torch/python.h>

#include "bindings.h"
#include "ownership_runtime.h"
#include "storage_control.h"

namespace py = pybind11;

namespace dmuon::torch_adapter {

void register_ownership_bindings(py::module_& m) {
  py::module_ o = m.def_submodule("ownership", "weight-ownership mode");
  using Gil = py::call_guard<py::gil_scoped_release>;

  o.def("storage_is_allocated", &storage_is_allocated, py::arg("tensor"));
  o.def("free_storage", &free_storage, py::arg("tensor"));
  o.def("allocate_storage", &allocate_storage, py::arg("tensor"));

  py::class_<OwnershipOptions>(o, "Options")
      .def(py::init([](int64_t bucket_bytes, std::string reduce_dtype, std::string solver,
                       std::string device_type, bool spread_layers,
                       std::vector<std::tuple<int64_t, int64_t, int64_t, double>> cost_entries) {
             return OwnershipOptions{bucket_bytes, std::move(reduce_dtype), std::move(solver),
                                     std::move(device_type), spread_layers, std::move(cost_entries)};
           }),
           py::arg("bucket_bytes") = int64_t{25} << 20, py::arg("reduce_dtype") = "float32",
           py::arg("solver") = "milp", py::arg("device_type") = "cpu", py::arg("spread_layers") = true,
           py::arg("cost_entries") = std::vector<std::tuple<int64_t, int64_t, int64_t, double>>{});

  py::class_<TimelineEvent>(o, "TimelineEvent")
      .def_readonly("what", &TimelineEvent::what)
      .def_readonly("index", &TimelineEvent::index)
      .def_readonly("seconds", &TimelineEvent::seconds)
      .def("__repr__", [](const TimelineEvent& e) {
        return "TimelineEvent(" + e.what + ", " + std::to_string(e.index) + ", " + std::to_string(e.seconds) + ")";
      });

  py::class_<OwnershipRuntime>(o, "Runtime")
      .def(py::init<const std::string&, const std::string&, const std::string&, std::vector<std::string>,
                    std::vector<dist::ParamLayout>, std::vector<int>, std::vector<std::string>, OwnershipOptions>(),
           py::arg("shard_group"), py::arg("replicate_group"), py::arg("replicate_reduce_group"),
           py::arg("names"), py::arg("layouts"), py::arg("layer_of"), py::arg("dtypes"), py::arg("options"), Gil())
      .def("configure",
           [](OwnershipRuntime& r, std::vector<int64_t> group_idx, std::vector<MuonGroupOptions> groups,
              std::vector<std::optional<at::Tensor>> buffers) {
             std::vector<at::Tensor> defined;
             for (auto& b : buffers) defined.push_back(b.has_value() ? *b : at::Tensor());
             py::gil_scoped_release release;
             r.configure(std::move(group_idx), std::move(groups), std::move(defined));
           },
           py::arg("group_idx"), py::arg("groups"), py::arg("momentum_buffers"))
      .def("publish", &OwnershipRuntime::publish, py::arg("index"), py::arg("compute"), py::arg("master"), Gil())
      .def("wait_published", &OwnershipRuntime::wait_published, py::arg("index"), Gil())
      .def("release", &OwnershipRuntime::release, py::arg("index"), py::arg("compute"), Gil())
      .def("materialize", &OwnershipRuntime::materialize, py::arg("index"), py::arg("tensor"), Gil())
      .def("grad_ready", &OwnershipRuntime::grad_ready, py::arg("index"), py::arg("grad"), py::arg("sync"), Gil())
      .def("flush", &OwnershipRuntime::flush, py::arg("sync"), Gil())
      .def("finish",
           [](OwnershipRuntime& r, int64_t step_idx, const std::vector<at::Tensor>& masters,
              const std::vector<MuonGroupOptions>& groups) {
             OwnershipRuntime::Finished f;
             {
               py::gil_scoped_release release;
               f = r.finish(step_idx, masters, groups);
             }
             return py::make_tuple(f.active, f.nonfinite, f.corrupt);
           },
           py::arg("step_idx"), py::arg("masters"), py::arg("groups"),
           "(active, nonfinite, corrupt): agreed over every rank; see OwnershipRuntime::finish")
      .def("commit", &OwnershipRuntime::commit, py::arg("step_idx"), Gil())
      .def("discard", &OwnershipRuntime::discard, Gil())
      .def_property_readonly("rank", &OwnershipRuntime::rank)
      .def_property_readonly("world_size", &OwnershipRuntime::world_size)
      .def_property_readonly("owners", &OwnershipRuntime::owners)
      .def_property_readonly("plan_text", &OwnershipRuntime::plan_text)
      .def_property_readonly("predicted_makespan_s", &OwnershipRuntime::predicted_makespan_s)
      .def_property_readonly("buckets", &OwnershipRuntime::buckets)
      .def("timeline", &OwnershipRuntime::timeline)
      .def("clear_timeline", &OwnershipRuntime::clear_timeline);
}

}  // namespace dmuon::torch_adapter

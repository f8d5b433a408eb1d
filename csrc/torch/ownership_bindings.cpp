// dmuon._C.ownership: the weight-ownership mode's exchange (engine/owned_exchange.h) and
// the storage controls of its Python hooks. Every method that may wait on a collective
// releases the GIL (c10d's threads may need it to drop tensors).
#include <pybind11/functional.h>
#include <pybind11/stl.h>
#include <torch/python.h>

#include "bindings.h"
#include "common/check.h"
#include "engine/owned_exchange.h"
#include "python/bindings.h"
#include "step/runtime_options.h"
#include "step_tensors.h"
#include "storage_control.h"

namespace py = pybind11;

namespace dmuon::torch_adapter {

void register_ownership_bindings(py::module_& m) {
  py::module_ o = m.def_submodule("ownership", "weight-ownership mode");
  using Gil = py::call_guard<py::gil_scoped_release>;

  o.def("storage_is_allocated", &storage_is_allocated, py::arg("tensor"));
  o.def("free_storage", &free_storage, py::arg("tensor"));

  py::class_<OwnershipOptions>(o, "Options")
      .def(py::init([](int64_t bucket_bytes, const std::string& reduce_dtype, const py::object& solver,
                       const py::object& device_type, bool spread_layers) {
             const step::DType reduce = parse_step_dtype(reduce_dtype, "reduce_dtype");
             DMUON_CHECK(reduce != step::DType::kFloat64, "reduce_dtype must be float32, bfloat16 or float16, got float64");
             return OwnershipOptions{bucket_bytes, reduce, bindings::choice<plan::SolverKind, plan::parse_solver>(solver),
                                     bindings::choice<step::DeviceKind, step::parse_device_kind>(device_type),
                                     spread_layers};
           }),
           py::arg("bucket_bytes") = int64_t{25} << 20, py::arg("reduce_dtype") = "float32",
           py::arg("solver") = "milp", py::arg("device_type") = "cpu", py::arg("spread_layers") = true);

  py::class_<OwnershipGroups>(o, "Groups")
      .def(py::init([](std::string world, std::string row, std::string column, std::string column_reduce, int shards,
                       int replicas, std::vector<int> shard_of, std::vector<int> replica_of) {
             return OwnershipGroups{std::move(world),         std::move(row), std::move(column),
                                    std::move(column_reduce), shards,         replicas,
                                    std::move(shard_of),      std::move(replica_of)};
           }),
           py::arg("world") = "", py::arg("row") = "", py::arg("column") = "", py::arg("column_reduce") = "",
           py::arg("shards") = 1, py::arg("replicas") = 1, py::arg("shard_of") = std::vector<int>{},
           py::arg("replica_of") = std::vector<int>{});

  py::class_<step::ExchangeEvent>(o, "Event")
      .def_readonly("what", &step::ExchangeEvent::what)
      .def_readonly("index", &step::ExchangeEvent::index)
      .def_readonly("seconds", &step::ExchangeEvent::seconds)
      .def("__repr__", [](const step::ExchangeEvent& e) {
        return "Event(" + e.what + ", " + std::to_string(e.index) + ", " + std::to_string(e.seconds) + ")";
      });

  py::class_<OwnedExchange, std::shared_ptr<OwnedExchange>>(o, "Exchange")
      .def(py::init<const OwnershipGroups&, std::vector<std::string>, std::vector<layout::ParamLayout>, std::vector<int>,
                    const std::vector<std::string>&, OwnershipOptions>(),
           py::arg("groups"), py::arg("names"), py::arg("layouts"), py::arg("layer_of"), py::arg("dtypes"),
           py::arg("options"), Gil())
      .def("publish", &OwnedExchange::publish, py::arg("index"), py::arg("compute"), py::arg("master"), Gil())
      .def("wait_published", &OwnedExchange::wait_published, py::arg("index"), Gil())
      .def("release", &OwnedExchange::release, py::arg("index"), py::arg("compute"), Gil())
      .def("materialize", &OwnedExchange::materialize, py::arg("index"), py::arg("tensor"), Gil())
      .def(
          "grad_ready",
          [](OwnedExchange& x, int64_t index, const at::Tensor& grad, std::optional<at::Tensor> momentum, bool sync) {
            py::gil_scoped_release release;
            x.grad_ready(index, grad, momentum.value_or(at::Tensor()), sync);
          },
          py::arg("index"), py::arg("grad"), py::arg("momentum"), py::arg("sync"))
      .def("end_backward", &OwnedExchange::end_backward, py::arg("sync"), Gil())
      .def("end_window", &OwnedExchange::end_window, py::arg("step_idx"), Gil(),
           "closes a step's window that the runtime never reached (collective: every rank)")
      .def_property_readonly("rank", &OwnedExchange::rank)
      .def_property_readonly(
          "step_idx", [](OwnedExchange& x) { return x.exchange().step_idx(); },
          "the step whose window is open (or opens next): named in the collectives' errors")
      .def_property_readonly("world_size", &OwnedExchange::world_size)
      .def_property_readonly("owners", &OwnedExchange::owners)
      .def_property_readonly("plan_text", &OwnedExchange::plan_text)
      .def_property_readonly("predicted_makespan_s", &OwnedExchange::predicted_makespan_s)
      .def_property_readonly("buckets", &OwnedExchange::buckets)
      .def(
          "contributed", [](OwnedExchange& x, int index) { return x.exchange().contributed(index); },
          py::arg("index"), "whether this rank added a gradient of parameter `index` in the current window")
      .def("timeline", [](OwnedExchange& x) { return x.exchange().timeline(); })
      .def("clear_timeline", [](OwnedExchange& x) { x.exchange().clear_timeline(); });
}

}  // namespace dmuon::torch_adapter

// dmuon._C core bindings: the default coefficient schedules, so Python shows users the
// exact numbers the core will use.
#include <pybind11/stl.h>

#include "bindings.h"
#include "common/check.h"
#include "ns/schedule.h"

namespace py = pybind11;

namespace dmuon::torch_adapter {

void register_core_bindings(py::module_& m) {
  py::register_exception<dmuon::Error>(m, "DMuonError", PyExc_RuntimeError);
  m.def(
      "default_schedule",
      [](const std::string& algorithm, int num_steps) {
        const auto schedule = ns::default_schedule(ns::parse_algorithm(algorithm), num_steps, 1e-7);
        std::vector<std::tuple<double, double, double>> steps;
        for (const auto& c : schedule.steps) steps.emplace_back(c.a, c.b, c.c);
        return py::make_tuple(steps, schedule.restart_after);
      },
      py::arg("algorithm"), py::arg("num_steps"),
      "([(a, b, c) per step], [restart iterations]) of the algorithm's default schedule");
}

}  // namespace dmuon::torch_adapter

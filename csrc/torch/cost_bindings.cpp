// dmuon._C.plan.measure_ns_costs: the engine's measured NS costs (step/cost_profile.h) on
// the torch adapter's ops, for the CLI (`python -m dmuon plan --profile`) and benchmarks.
#include <pybind11/stl.h>

#include <string>
#include <tuple>
#include <vector>

#include "bindings.h"
#include "common/env.h"
#include "engine/torch_ops.h"
#include "step/cost_profile.h"
#include "step/runtime_options.h"

namespace py = pybind11;

namespace dmuon::torch_adapter {

void register_cost_bindings(py::module_& m) {
  py::module_ p = m.attr("plan");
  p.def(
      "measure_ns_costs",
      [](const std::vector<std::tuple<int64_t, int64_t, int64_t>>& points, const std::string& device_type,
         const ns::Schedule& schedule, int num_runs, int num_warmup, const std::string& store_path) {
        const step::Device where = torch_step_device(step::parse_device_kind(device_type));
        const std::unique_ptr<step::DeviceOps> ops = make_torch_ops(where);
        std::vector<step::CostPoint> batches;
        for (const auto& [rows, cols, count] : points)
          batches.push_back({rows, cols, count, step::DType::kFloat32, &schedule});
        step::CostOptions options;
        options.num_runs = num_runs;
        options.num_warmup = num_warmup;
        options.store_path = store_path;
        const py::gil_scoped_release release;
        return step::measure_ns_costs(*ops, batches, step::resolve_wire_dtype(step::WireDType::kAuto, where.kind),
                                      env::kCudaGraphs.get(), options);
      },
      py::arg("points"), py::arg("device_type"), py::arg("schedule"), py::arg("num_runs") = 5, py::arg("num_warmup") = 2,
      py::arg("store_path") = "",
      "A CostTable of (rows, cols, num_matrices) float32 NS batches timed as the step engine times its own "
      "(the median of num_runs after num_warmup), read from and kept in the measurement store (store_path; "
      "'': the device's default, the autotuner's on CUDA, this process's memory on the CPU)");
}

}  // namespace dmuon::torch_adapter

// dmuon._C.dist.transport_of: how dmuon treats a process group (parameter layouts:
// python/layout_bindings.cpp; the runtime's statistics: python/runtime_bindings.cpp; the
// runtime itself: dmuon._C.engine.EngineRuntime).
#include <pybind11/stl.h>
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>
#include <torch/python.h>

#include "bindings.h"
#include "layout/world_model.h"
#include "world_detect.h"

namespace py = pybind11;

namespace dmuon::torch_adapter {

void register_dist_bindings(py::module_& m) {
  py::module_ d = m.attr("dist");  // NOTE: made by register_layout_bindings

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

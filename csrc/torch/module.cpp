// dmuon._C module entry: the torch-free core's bindings (csrc/python) and the adapter's. The
// test and bench ops are registered separately through TORCH_LIBRARY (csrc/torch_testing:
// torch.ops.dmuon_testing.*).
// NOTE: pybind11 alone (bindings.h): this file binds no tensor. torch/extension.h (all of the
// C++ frontend) made it one of the build's longest files; the binding files include
// torch/python.h, the tensor casters, for the same reason.
#include <torch/version.h>

#include <string>

#include "bindings.h"
#include "python/bindings.h"

PYBIND11_MODULE(_C, m) {
  m.doc() = "dmuon C++ core and torch ops";
  m.attr("__version__") = DMUON_VERSION;
  // The torch release (major.minor) whose headers this module was compiled against.
  m.attr("torch_version") = std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR);
#ifdef DMUON_WITH_CUDA
  m.attr("built_with_cuda") = true;
#else
  m.attr("built_with_cuda") = false;
#endif
  dmuon::bindings::register_core_bindings(m);
  dmuon::bindings::register_layout_bindings(m);
  dmuon::bindings::register_plan_bindings(m);
  dmuon::bindings::register_sim_bindings(m);
  dmuon::bindings::register_runtime_bindings(m);
  dmuon::torch_adapter::register_cost_bindings(m);
  dmuon::torch_adapter::register_dist_bindings(m);
  // NOTE: the ownership exchange before the engine, whose runtime takes one.
  dmuon::torch_adapter::register_ownership_bindings(m);
  dmuon::torch_adapter::register_engine_bindings(m);
}

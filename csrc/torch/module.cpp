// dmuon._C module entry: pybind11 bindings of the core. Ops are registered separately
// through TORCH_LIBRARY (see ops_*.cpp) and reached as torch.ops.dmuon.*.
#include <torch/extension.h>

#include "bindings.h"

PYBIND11_MODULE(_C, m) {
  m.doc() = "dmuon C++ core and torch ops";
  m.attr("__version__") = DMUON_VERSION;
#ifdef DMUON_WITH_CUDA
  m.attr("built_with_cuda") = true;
#else
  m.attr("built_with_cuda") = false;
#endif
  dmuon::torch_adapter::register_core_bindings(m);
  dmuon::torch_adapter::register_plan_bindings(m);
  dmuon::torch_adapter::register_sim_bindings(m);
  dmuon::torch_adapter::register_dist_bindings(m);
  dmuon::torch_adapter::register_ownership_bindings(m);
}

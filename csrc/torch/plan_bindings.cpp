// Placeholder until the planner lands: registers an empty dmuon._C.plan submodule.
#include "bindings.h"

namespace dmuon::torch_adapter {

void register_plan_bindings(pybind11::module_& m) { m.def_submodule("plan", "owner planner"); }

}  // namespace dmuon::torch_adapter

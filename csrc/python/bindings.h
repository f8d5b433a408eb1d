// dmuon/python/bindings.h — pybind11 bindings of the torch-free core, each file its part of
// dmuon._C (the module entry and the torch adapter's bindings: csrc/torch).
#pragma once

#include <pybind11/pybind11.h>

namespace dmuon::bindings {

/// Errors, env knobs, NS schedules and the fused step's floor (core_bindings.cpp).
void register_core_bindings(pybind11::module_& m);

/// Parameter layouts: dmuon._C.dist.ParamLayout (layout_bindings.cpp; makes dmuon._C.dist).
void register_layout_bindings(pybind11::module_& m);

/// The owner planner: dmuon._C.plan (plan_bindings.cpp).
void register_plan_bindings(pybind11::module_& m);

/// The step projection at any world size: dmuon._C.sim (sim_bindings.cpp).
void register_sim_bindings(pybind11::module_& m);

}  // namespace dmuon::bindings

// dmuon/python/bindings.h — pybind11 bindings of the torch-free core, each file its part of
// dmuon._C (the module entry and the torch adapter's bindings: csrc/torch).
#pragma once

#include <pybind11/pybind11.h>

#include <string>

namespace dmuon::bindings {

/// An option's Python value as the enum E: a str through `Parse` (which names the option in
/// its error), else the bound enum value itself. Every binding that takes an option parses it
/// here, once; past the bindings, options are compared only as enums.
template <typename E, E (*Parse)(const std::string&)>
E choice(const pybind11::handle& value) {
  if (pybind11::isinstance<pybind11::str>(value)) return Parse(value.cast<std::string>());
  return value.cast<E>();
}

/// Errors, env knobs, NS schedules and the fused step's floor (core_bindings.cpp).
void register_core_bindings(pybind11::module_& m);

/// Parameter layouts: dmuon._C.dist.ParamLayout (layout_bindings.cpp; makes dmuon._C.dist).
void register_layout_bindings(pybind11::module_& m);

/// The owner planner: dmuon._C.plan (plan_bindings.cpp).
void register_plan_bindings(pybind11::module_& m);

/// The step projection at any world size: dmuon._C.sim (sim_bindings.cpp).
void register_sim_bindings(pybind11::module_& m);

/// The step runtime's typed options and statistics: dmuon._C.engine's enums, GroupRule,
/// EngineOptions, RuntimeOptions, StepChecks and dmuon._C.dist.StepStats (runtime_bindings.cpp; makes
/// dmuon._C.engine, after register_layout_bindings).
void register_runtime_bindings(pybind11::module_& m);

}  // namespace dmuon::bindings

// dmuon/torch/bindings.h — each binding file registers its part of dmuon._C here.
#pragma once

#include <pybind11/pybind11.h>

namespace dmuon::torch_adapter {

/// Errors, env knobs, NS schedules (module.cpp's neighbours).
void register_core_bindings(pybind11::module_& m);

/// The owner-centric step runtime: dmuon._C.dist (dist_bindings.cpp).
void register_dist_bindings(pybind11::module_& m);

/// The step engine's torch runtime: dmuon._C.engine (engine/engine_bindings.cpp).
void register_engine_bindings(pybind11::module_& m);

/// The weight-ownership mode's exchange: dmuon._C.ownership (ownership_bindings.cpp).
void register_ownership_bindings(pybind11::module_& m);

/// The owner planner: dmuon._C.plan (plan_bindings.cpp).
void register_plan_bindings(pybind11::module_& m);

/// The engine's measured NS costs: dmuon._C.plan.measure_ns_costs (cost_bindings.cpp;
/// after register_plan_bindings).
void register_cost_bindings(pybind11::module_& m);

/// The step projection at any world size: dmuon._C.sim (sim_bindings.cpp).
void register_sim_bindings(pybind11::module_& m);

}  // namespace dmuon::torch_adapter

// dmuon/torch/bindings.h — each binding file of the torch adapter registers its part of
// dmuon._C here (the torch-free core's: python/bindings.h).
#pragma once

#include <pybind11/pybind11.h>

namespace dmuon::torch_adapter {

/// How dmuon treats a process group: dmuon._C.dist.transport_of (dist_bindings.cpp; after
/// bindings::register_layout_bindings).
void register_dist_bindings(pybind11::module_& m);

/// The step engine's torch runtime: dmuon._C.engine (engine/engine_bindings.cpp).
void register_engine_bindings(pybind11::module_& m);

/// The weight-ownership mode's exchange: dmuon._C.ownership (ownership_bindings.cpp).
void register_ownership_bindings(pybind11::module_& m);

/// The engine's measured NS costs: dmuon._C.plan.measure_ns_costs (cost_bindings.cpp;
/// after bindings::register_plan_bindings).
void register_cost_bindings(pybind11::module_& m);

}  // namespace dmuon::torch_adapter

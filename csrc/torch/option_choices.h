// dmuon/torch/option_choices.h — Python's option values as the C++ enums. Each binding that
// takes an option parses it here, once (a string, or the bound enum itself); the errors
// name the option. Past the bindings, options are only compared as enums.
#pragma once

#include <pybind11/pybind11.h>

#include <string>

#include "runtime_options.h"
#include "step/types.h"

namespace dmuon::torch_adapter {

/// `value` as the enum E: a str through `Parse` (which names the option in its error), else
/// the bound enum value itself.
template <typename E, E (*Parse)(const std::string&)>
E choice(const pybind11::handle& value) {
  if (pybind11::isinstance<pybind11::str>(value)) return Parse(value.cast<std::string>());
  return value.cast<E>();
}

/// "cpu" | "cuda"; the error names device_type.
step::DeviceKind parse_device_kind(const std::string& name);
/// "auto" | "analytic" | "profile"; the error names cost_model.
CostModel parse_cost_model(const std::string& name);

/// Binds the option enums (Mode, WireDType, Solver, DeviceKind, AdjustLr, NsAlgorithm,
/// CostModel), GroupRule, EngineOptions and RuntimeOptions into `engine` (dmuon._C.engine).
void register_option_bindings(pybind11::module_& engine);

}  // namespace dmuon::torch_adapter

// dmuon/torch/option_choices.h — Python's option values as the C++ enums. Each binding that
// takes an option parses it here, once (a string, or the bound enum itself); the errors
// name the option. Past the bindings, options are only compared as enums.
#pragma once

#include <pybind11/pybind11.h>

#include <string>

#include "python/bindings.h"
#include "runtime_options.h"
#include "step/types.h"

namespace dmuon::torch_adapter {

using bindings::choice;

/// "cpu" | "cuda"; the error names device_type.
step::DeviceKind parse_device_kind(const std::string& name);
/// "auto" | "analytic" | "profile"; the error names cost_model.
CostModel parse_cost_model(const std::string& name);

/// Binds the option enums (Mode, WireDType, Solver, DeviceKind, AdjustLr, NsAlgorithm,
/// CostModel), GroupRule, EngineOptions and RuntimeOptions into `engine` (dmuon._C.engine).
void register_option_bindings(pybind11::module_& engine);

}  // namespace dmuon::torch_adapter

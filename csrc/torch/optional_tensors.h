// dmuon/torch/optional_tensors.h — Python's None tensors (a parameter without a gradient or
// buffer this step) as undefined at::Tensors, for the runtimes' bindings.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <vector>

namespace dmuon::torch_adapter {

inline std::vector<at::Tensor> or_undefined(const std::vector<std::optional<at::Tensor>>& tensors) {
  std::vector<at::Tensor> out;
  for (const auto& t : tensors) out.push_back(t.has_value() ? *t : at::Tensor());
  return out;
}

}  // namespace dmuon::torch_adapter

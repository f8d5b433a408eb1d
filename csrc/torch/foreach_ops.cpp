// dmuon/torch/foreach_ops.cpp — grouped multi-tensor kernels for checks, momentum, apply.
#include "foreach_ops.h"

#include <limits>
#include <map>
#include <utility>

namespace dmuon::torch_adapter {

at::Tensor nonfinite_flags(at::TensorList tensors) {
  if (tensors.empty()) return at::empty({0}, at::kBool);
  const at::Device device = tensors[0].device();
  // NOTE: max |x| is NaN for a NaN, Inf for an Inf, never overflows, and _foreach_norm
  // computes it for a whole list in a few launches (multi_tensor_apply).
  std::map<std::pair<std::string, at::ScalarType>, std::vector<size_t>> groups;
  for (size_t i = 0; i < tensors.size(); ++i)
    groups[{tensors[i].device().str(), tensors[i].scalar_type()}].push_back(i);
  std::vector<at::Tensor> norms(tensors.size());
  for (const auto& [key, members] : groups) {
    std::vector<at::Tensor> list;
    for (size_t i : members) list.push_back(tensors[i].numel() == 0 ? at::zeros({1}, tensors[i].options()) : tensors[i]);
    const std::vector<at::Tensor> out = at::_foreach_norm(list, std::numeric_limits<double>::infinity());
    for (size_t k = 0; k < members.size(); ++k) norms[members[k]] = out[k].to(device, at::kFloat);
  }
  return at::logical_not(at::isfinite(at::stack(norms)));
}

void apply_updates_(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& updates,
                    const std::vector<double>& scales, const std::vector<double>& decays) {
  std::map<std::pair<double, double>, std::vector<size_t>> groups;
  for (size_t i = 0; i < params.size(); ++i) groups[{scales[i], decays[i]}].push_back(i);
  for (const auto& [key, members] : groups) {
    std::vector<at::Tensor> targets, converted;
    for (size_t i : members) {
      targets.push_back(params[i]);
      converted.push_back(updates[i].reshape(params[i].sizes()).to(params[i].scalar_type()));
    }
    if (key.second != 1.0) at::_foreach_mul_(targets, key.second);
    at::_foreach_add_(targets, converted, key.first);
  }
}

}  // namespace dmuon::torch_adapter

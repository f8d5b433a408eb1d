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

void foreach_lerp_(std::vector<at::Tensor>& buffers, const std::vector<at::Tensor>& grads, double weight) {
  if (buffers.empty()) return;
  at::_foreach_lerp_(buffers, grads, weight);
}

void foreach_apply_(std::vector<at::Tensor>& params, const std::vector<at::Tensor>& updates,
                    double scale, double decay) {
  if (params.empty()) return;
  std::vector<at::Tensor> converted;
  converted.reserve(updates.size());
  for (size_t i = 0; i < updates.size(); ++i)
    converted.push_back(updates[i].reshape(params[i].sizes()).to(params[i].scalar_type()));
  if (decay != 1.0) at::_foreach_mul_(params, decay);
  at::_foreach_add_(params, converted, scale);
}

}  // namespace dmuon::torch_adapter

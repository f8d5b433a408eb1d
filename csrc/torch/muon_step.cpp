// dmuon/torch/muon_step.cpp — momentum, same-shape batching, Newton–Schulz, apply.
#include "muon_step.h"

#include <map>
#include <tuple>
#include <vector>

#include "common/check.h"
#include "optim/update_rule.h"
#include "orthogonalize.h"

namespace dmuon::torch_adapter {

at::Tensor as_matrix_batch(const at::Tensor& t, int64_t batch_dims) {
  DMUON_CHECK(batch_dims == 0 || batch_dims == 1, "batch_dims must be 0 or 1, got ", batch_dims);
  DMUON_CHECK(t.dim() >= 2 + batch_dims, "a Muon parameter needs at least ", 2 + batch_dims,
              " dims, got shape ", t.sizes());
  if (batch_dims == 1) return t.reshape({t.size(0), t.size(1), -1});
  return t.reshape({1, t.size(0), -1});
}

void muon_step(at::TensorList params, at::TensorList grads, at::TensorList momentum_buffers,
               at::IntArrayRef batch_dims, const MuonGroupOptions& options) {
  const size_t num_params = params.size();
  DMUON_CHECK(grads.size() == num_params && momentum_buffers.size() == num_params &&
                  batch_dims.size() == num_params,
              "muon_step: params, grads, momentum_buffers and batch_dims must have equal lengths");
  const ns::Schedule schedule = make_schedule(options.algorithm, options.coefficients,
                                              options.restart_after, options.eps);
  const optim::AdjustLr adjust = optim::parse_adjust_lr(options.adjust_lr);
  const double mu = options.momentum;

  // Momentum into fresh tensors (committed only after every update is known finite),
  // then the matrix view of each update.
  std::vector<at::Tensor> new_buffers(num_params);
  std::vector<at::Tensor> updates(num_params);
  for (size_t i = 0; i < num_params; ++i) {
    DMUON_CHECK(grads[i].sizes() == params[i].sizes() && momentum_buffers[i].sizes() == params[i].sizes(),
                "muon_step: parameter ", i, " has shape ", params[i].sizes(), " but its grad has ",
                grads[i].sizes(), " and its momentum buffer ", momentum_buffers[i].sizes());
    if (params[i].numel() == 0) continue;
    new_buffers[i] = momentum_buffers[i].lerp(grads[i], 1.0 - mu);
    at::Tensor update = options.nesterov ? grads[i].lerp(new_buffers[i], mu) : new_buffers[i];
    updates[i] = as_matrix_batch(update, batch_dims[i]);
  }

  // Group same-shape matrices on the same device, in first-seen order.
  using Key = std::tuple<std::string, int64_t, int64_t>;
  std::map<Key, std::vector<size_t>> groups;
  std::vector<Key> order;
  for (size_t i = 0; i < num_params; ++i) {
    if (!updates[i].defined()) continue;
    Key key{params[i].device().str(), updates[i].size(1), updates[i].size(2)};
    auto [it, inserted] = groups.try_emplace(key);
    if (inserted) order.push_back(key);
    it->second.push_back(i);
  }

  // One batched Newton–Schulz per group; results split back per parameter.
  std::vector<at::Tensor> orthogonalized(num_params);
  for (const Key& key : order) {
    const auto& members = groups[key];
    std::vector<at::Tensor> stack;
    for (size_t i : members) stack.push_back(updates[i].to(at::kFloat));
    at::Tensor out = orthogonalize(at::cat(stack, 0), schedule);
    int64_t offset = 0;
    for (size_t i : members) {
      const int64_t count = updates[i].size(0);
      orthogonalized[i] = out.narrow(0, offset, count);
      offset += count;
    }
  }

  // Every update finite? NOTE: the per-parameter flags stay on the device and are stacked,
  // so the whole check costs one host synchronization per step, not one per parameter.
  {
    std::vector<at::Tensor> device_flags;
    std::vector<size_t> flag_owner;
    for (size_t i = 0; i < num_params; ++i) {
      if (!orthogonalized[i].defined()) continue;
      device_flags.push_back(at::isfinite(orthogonalized[i]).all().to(params[0].device()));
      flag_owner.push_back(i);
    }
    if (!device_flags.empty()) {
      at::Tensor flags = at::stack(device_flags).to(at::kCPU);  // the step's one host sync
      const bool* ok = flags.data_ptr<bool>();
      for (size_t k = 0; k < flag_owner.size(); ++k)
        DMUON_CHECK(ok[k], "the orthogonalized update of parameter ", flag_owner[k],
                    " is not finite (non-finite momentum or gradient)");
    }
  }

  // Commit: momentum buffers, decoupled weight decay, the scaled update.
  for (size_t i = 0; i < num_params; ++i) {
    if (!orthogonalized[i].defined()) continue;
    momentum_buffers[i].copy_(new_buffers[i]);
    const int64_t rows = updates[i].size(1), cols = updates[i].size(2);
    const double ratio = optim::adjusted_lr_ratio(adjust, rows, cols);
    at::Tensor param = params[i];
    if (options.weight_decay != 0.0) param.mul_(1.0 - options.lr * options.weight_decay);
    param.add_(orthogonalized[i].reshape(param.sizes()).to(param.scalar_type()),
               -options.lr * ratio);
  }
}

}  // namespace dmuon::torch_adapter

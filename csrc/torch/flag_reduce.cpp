// dmuon/torch/flag_reduce.cpp — all_reduce of small integer flags over a chain of groups.
#include "flag_reduce.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>

#include "common/check.h"

namespace dmuon::torch_adapter {

at::Device collective_device(const std::string& device_type) {
  if (device_type == "cuda")
    return at::Device(at::kCUDA, c10::impl::getDeviceGuardImpl(at::kCUDA)->getDevice().index());
  return at::Device(at::kCPU);
}

std::vector<int64_t> all_reduce_flags(const std::vector<FlagGroup>& groups, const std::vector<int64_t>& local,
                                      const std::string& op, const at::Device& device, const WaitFn& wait) {
  const dist::FlagOp flag_op = dist::parse_flag_op(op);
  std::vector<int64_t> agreed = local;
  if (local.empty()) return agreed;
  c10d::AllreduceOptions opts;
  opts.reduceOp = flag_op == dist::FlagOp::kSum ? c10d::ReduceOp::SUM : c10d::ReduceOp::MAX;
  // NOTE: the flags stay on the device across consecutive real groups (one host copy).
  std::vector<at::Tensor> tensors;
  auto to_host = [&] {
    if (tensors.empty()) return;
    const at::Tensor host = tensors[0].to(at::kCPU).contiguous();
    agreed.assign(host.data_ptr<int64_t>(), host.data_ptr<int64_t>() + host.numel());
    tensors.clear();
  };
  for (const FlagGroup& g : groups) {
    if (!g.group || g.group->getSize() == 1) continue;
    if (g.transport == dist::Transport::kFake) {
      to_host();
      agreed = dist::WorldModel(g.transport, g.group->getRank(), g.group->getSize()).modelled_agreement(agreed, flag_op);
      continue;
    }
    if (tensors.empty()) tensors.push_back(at::tensor(agreed, at::TensorOptions().dtype(at::kLong)).to(device));
    wait(g.group->allreduce(tensors, opts), g.what);
  }
  to_host();
  return agreed;
}

}  // namespace dmuon::torch_adapter

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
  DMUON_CHECK(op == "sum" || op == "max", "all_reduce_flags: op must be sum or max, got ", op);
  bool any = false;
  for (const FlagGroup& g : groups) any = any || (g.group && g.group->getSize() > 1);
  if (!any || local.empty()) return local;
  std::vector<at::Tensor> tensors{at::tensor(local, at::TensorOptions().dtype(at::kLong)).to(device)};
  c10d::AllreduceOptions opts;
  opts.reduceOp = op == "sum" ? c10d::ReduceOp::SUM : c10d::ReduceOp::MAX;
  for (const FlagGroup& g : groups)
    if (g.group && g.group->getSize() > 1) wait(g.group->allreduce(tensors, opts), g.what);
  const at::Tensor host = tensors[0].to(at::kCPU).contiguous();
  return std::vector<int64_t>(host.data_ptr<int64_t>(), host.data_ptr<int64_t>() + host.numel());
}

}  // namespace dmuon::torch_adapter

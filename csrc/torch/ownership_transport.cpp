// dmuon/torch/ownership_transport.cpp — the ownership mode's agreement transport.
#include "ownership_transport.h"

#include <utility>

#include "common/check.h"

namespace dmuon::torch_adapter {

OwnershipAgreement::OwnershipAgreement(std::vector<FlagGroup> groups, int rank, int world_size, at::Device device,
                                       WaitFn wait)
    : groups_(std::move(groups)), rank_(rank), world_size_(world_size), device_(device), wait_(std::move(wait)) {}

std::unique_ptr<step::Pending> OwnershipAgreement::all_to_all(const step::Buffer&, const std::vector<int64_t>&,
                                                              const step::Buffer&, const std::vector<int64_t>&,
                                                              const std::string& what) {
  DMUON_FAIL("the weight-ownership mode's engine exchanges nothing (its matrices are whole on their owners), "
             "but was asked for ", what);
}

std::vector<int64_t> OwnershipAgreement::all_reduce(const std::vector<int64_t>& local, step::ReduceOp op,
                                                    const std::string& what) {
  std::vector<FlagGroup> named = groups_;
  for (FlagGroup& g : named) g.what = what + " (" + g.what + ")";
  return all_reduce_flags(named, local, op == step::ReduceOp::kSum ? "sum" : "max", device_, wait_);
}

std::string OwnershipAgreement::broadcast(const std::string&, const std::string& what) {
  DMUON_FAIL("the weight-ownership mode's owners are planned by its runtime, but the engine asked for ", what);
}

}  // namespace dmuon::torch_adapter

// dmuon/torch/ownership_transport.h — the step engine's transport in the weight-ownership
// mode: the mode's own collectives (bucket reduction to owners, publish) move the data, so
// the engine only agrees: small all_reduces over the shard group, then the replicas.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "flag_reduce.h"
#include "step/transport.h"

namespace dmuon::torch_adapter {

class OwnershipAgreement : public step::Transport {
 public:
  /// `groups`: the shard group, then the replicate group (null where absent); rank and
  /// world of the grid over them; `device`: where the flags travel; `wait` raises naming
  /// a failed collective.
  OwnershipAgreement(std::vector<FlagGroup> groups, int rank, int world_size, at::Device device, WaitFn wait);

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  /// Never called for items whole on their owners; throws naming `what`.
  std::unique_ptr<step::Pending> all_to_all(const step::Buffer& send, const std::vector<int64_t>& send_counts,
                                            const step::Buffer& recv, const std::vector<int64_t>& recv_counts,
                                            const std::string& what) override;
  std::vector<int64_t> all_reduce(const std::vector<int64_t>& local, step::ReduceOp op,
                                  const std::string& what) override;
  /// Never called (the owners are given, not solved); throws naming `what`.
  std::string broadcast(const std::string& text, const std::string& what) override;

 private:
  std::vector<FlagGroup> groups_;
  int rank_ = 0, world_size_ = 1;
  at::Device device_;
  WaitFn wait_;
};

}  // namespace dmuon::torch_adapter

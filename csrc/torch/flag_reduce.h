// dmuon/torch/flag_reduce.h — agreement on small integer flags (NaN/Inf checks, which
// parameters have gradients) over one or more process groups; shared by both runtimes.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <functional>
#include <string>
#include <vector>

#include "dist/world_model.h"

namespace dmuon::torch_adapter {

/// The device a runtime's collectives use: the current CUDA device for device_type "cuda",
/// else the CPU.
at::Device collective_device(const std::string& device_type);

/// One process group of an agreement, and the collective's name in errors.
struct FlagGroup {
  c10::intrusive_ptr<c10d::ProcessGroup> group;  ///< null or size 1: skipped
  std::string what;
  /// How the group agrees: real groups by an all_reduce; a fake group (the runtime
  /// detected it once, dist::WorldModel) by the model "every rank holds these flags".
  dist::Transport transport = dist::Transport::kReal;
};

/// Waits for one collective; throws the caller's error (naming `what`) when it failed.
using WaitFn = std::function<void(const c10::intrusive_ptr<c10d::Work>& work, const std::string& what)>;

/// Element-wise all_reduce of `local` (op "sum" | "max") over each group in turn (a 2-D
/// mesh: shard group, then replicas), as int64 on `device`; the agreed flags. A fake group
/// contributes its size as a factor of every sum (dist::WorldModel::modelled_agreement).
std::vector<int64_t> all_reduce_flags(const std::vector<FlagGroup>& groups, const std::vector<int64_t>& local,
                                      const std::string& op, const at::Device& device, const WaitFn& wait);

}  // namespace dmuon::torch_adapter

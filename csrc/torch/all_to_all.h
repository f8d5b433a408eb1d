// dmuon/torch/all_to_all.h — c10d's all_to_all over flat tensors (uneven splits), spelled as
// the torch release at hand spells it.
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <cstdint>
#include <vector>

namespace dmuon::torch_adapter {

/// `group`'s all_to_all: `input` split by `input_splits` to the ranks, `output` filled by
/// `output_splits` from them.
// NOTE: torch 2.15 names it ProcessGroup::all_to_all_single and deprecates alltoall_base;
// torch 2.11 has only alltoall_base. The member that exists is called (a template, so the
// other branch is never instantiated).
template <typename Group>
c10::intrusive_ptr<c10d::Work> all_to_all_single(Group& group, at::Tensor& output, at::Tensor& input,
                                                 std::vector<int64_t>& output_splits,
                                                 std::vector<int64_t>& input_splits) {
  if constexpr (requires { group.all_to_all_single(output, input, output_splits, input_splits); }) {
    return group.all_to_all_single(output, input, output_splits, input_splits);
  } else {
    return group.alltoall_base(output, input, output_splits, input_splits);
  }
}

}  // namespace dmuon::torch_adapter

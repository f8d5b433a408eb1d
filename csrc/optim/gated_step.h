// dmuon/optim/gated_step.h — the decisions of the one-GPU gated step (torch-free, no CUDA):
// which parameters the fused path takes, how many streams it runs on, and which stream each
// of its batches gets. The torch side (torch/cuda/fused_local_step.*, torch/dist_runtime.*)
// describes its tensors and batches with these types and follows the answers.
#pragma once

#include <cstdint>
#include <vector>

#include "ns/schedule.h"

namespace dmuon::optim {

/// What the fused path needs to know of one tensor.
struct FusedTensor {
  bool defined = false;
  bool cuda = false;
  bool float32 = false;
  bool contiguous = false;
  int64_t device = -1;
  std::vector<int64_t> sizes;
};

/// Whether a (parameter, gradient, momentum buffer) takes the fused path: `enabled`
/// (the former fused-step switch), a CUDA parameter of at least 2 dimensions, all three contiguous fp32
/// tensors of its shape on its device, and the sm_90a kernel usable there (`kernel_usable`).
/// An undefined momentum buffer stands for one not created yet (it will be made like the
/// parameter).
bool fused_path_takes(const FusedTensor& param, const FusedTensor& grad, const FusedTensor& momentum, bool enabled,
                      bool kernel_usable);

/// The gated step's stream count: `requested` when not 0, else `knob` (DMUON_FUSED_STREAMS);
/// throws dmuon::Error naming the one that is not between 1 and 8.
int gated_stream_count(int64_t requested, int64_t knob);

/// What one fused batch computes: its param group, its matrices' shape and their number.
struct GatedBatch {
  int64_t group = 0, rows = 0, cols = 0, num_matrices = 0;
  bool operator==(const GatedBatch& other) const {
    return group == other.group && rows == other.rows && cols == other.cols && num_matrices == other.num_matrices;
  }
};

/// The stream (0 … num_streams − 1) of each of `batches`. NOTE: the warm-batches rule: they
/// spread over the streams only when they are exactly `warm`, the batches the previous
/// gated step ran (same groups, shapes and sizes, in order), because a batch's first runs
/// tune its kernels (timings that other streams' work would disturb) and capture its CUDA
/// graph; otherwise all run on stream 0. Spread: the batches of one (group, rows, cols)
/// together, the shapes by the floor of their fused step (ns/ns_bound.h) over streams
/// (ns/batch_streams.h). `schedules[group]`: each group's Newton–Schulz schedule.
std::vector<int> gated_batch_streams(const std::vector<GatedBatch>& batches, const std::vector<GatedBatch>& warm,
                                     const std::vector<ns::Schedule>& schedules, int num_streams);

}  // namespace dmuon::optim

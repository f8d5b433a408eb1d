// dmuon/ns/batch_streams.h — which stream each Newton–Schulz batch of a step runs on.
//
// The fused single-GPU step runs its same-shape batches one after another. Each batch is a
// chain of kernels that cannot fill the GPU at its ends (a partial last wave, a launch gap,
// small m×m products); a second chain on another stream fills those holes. The batches of
// one shape stay on one stream, so that a shape's Newton–Schulz workspace and CUDA graph
// (kept per stream) exist once; the shapes are spread over the streams by their cost.
#pragma once

#include <cstdint>
#include <vector>

namespace dmuon::ns {

/// One batch: `key` names its shape (batches with equal keys share a stream), `cost` its
/// expected time in any unit (e.g. its floor, ns_bound.h).
struct StreamJob {
  int64_t key = 0;
  double cost = 0.0;
};

/// The stream (0 … num_streams − 1) of each job: the keys in order of decreasing total cost
/// (ties: first seen first), each on the stream with the least cost so far (ties: the
/// lowest index). Deterministic. Throws dmuon::Error when num_streams < 1 or a cost is
/// negative or not finite.
std::vector<int> assign_streams(const std::vector<StreamJob>& jobs, int num_streams);

}  // namespace dmuon::ns

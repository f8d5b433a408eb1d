// dmuon/step/cuda/stream_set.h — the side streams the NS batches of a stage spread over
// (ns/batch_streams.h assigns them): made once per ops (a batch must find the same stream
// every step, since the graph cache is keyed by stream), forked from the main stream and
// joined back into it (also while an error unwinds).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <functional>
#include <vector>

namespace dmuon::step::cuda {

class StreamSet {
 public:
  /// On the current CUDA device.
  StreamSet() = default;
  ~StreamSet();
  StreamSet(const StreamSet&) = delete;
  StreamSet& operator=(const StreamSet&) = delete;

  /// run(k, stream) for every k in order, on stream_of[k] (0: `main`, i > 0: side stream
  /// i). The side streams start after what `main` holds so far; `main` waits for all of
  /// them before this returns. Returns the number of streams (1 + the largest index).
  int run(const std::vector<int>& stream_of, cudaStream_t main,
          const std::function<void(size_t k, cudaStream_t stream)>& run);

 private:
  cudaStream_t side(int index);
  std::vector<cudaStream_t> side_;  // [index − 1]
};

}  // namespace dmuon::step::cuda

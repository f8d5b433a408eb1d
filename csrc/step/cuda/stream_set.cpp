// dmuon/step/cuda/stream_set.cpp — fork and join of the NS side streams.
#include "step/cuda/stream_set.h"

#include <algorithm>

#include "common/check.h"
#include "ns/cuda/cuda_check.h"

namespace dmuon::step::cuda {
namespace {

// Makes `main` wait for the side streams when it goes out of scope.
// NOTE: it also runs while an error unwinds (buffers freed then must not be in use on the
// side streams), so it never throws: where an event fails it waits on the host instead.
struct Join {
  cudaStream_t main;
  std::vector<cudaStream_t> others;
  ~Join() {
    for (cudaStream_t s : others) {
      cudaEvent_t done = nullptr;
      const bool joined = cudaEventCreateWithFlags(&done, cudaEventDisableTiming) == cudaSuccess &&
                          cudaEventRecord(done, s) == cudaSuccess && cudaStreamWaitEvent(main, done, 0) == cudaSuccess;
      if (done != nullptr) cudaEventDestroy(done);
      if (!joined) {
        cudaGetLastError();
        cudaStreamSynchronize(s);
      }
    }
  }
};

}  // namespace

StreamSet::~StreamSet() {
  for (cudaStream_t s : side_) cudaStreamDestroy(s);
}

cudaStream_t StreamSet::side(int index) {
  while (static_cast<int>(side_.size()) < index) {
    cudaStream_t s = nullptr;
    DMUON_CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    side_.push_back(s);
  }
  return side_[static_cast<size_t>(index - 1)];
}

int StreamSet::run(const std::vector<int>& stream_of, cudaStream_t main,
                   const std::function<void(size_t k, cudaStream_t stream)>& run) {
  for (size_t k = 0; k < stream_of.size(); ++k)
    DMUON_CHECK(stream_of[k] >= 0, "StreamSet::run: stream ", stream_of[k], " of batch ", k, " is negative");
  const int num_streams = stream_of.empty() ? 1 : 1 + *std::max_element(stream_of.begin(), stream_of.end());
  std::vector<cudaStream_t> streams{main};
  Join join{main, {}};
  if (num_streams > 1) {
    cudaEvent_t forked = nullptr;
    DMUON_CHECK_CUDA(cudaEventCreateWithFlags(&forked, cudaEventDisableTiming));
    const cudaError_t recorded = cudaEventRecord(forked, main);
    for (int i = 1; i < num_streams && recorded == cudaSuccess; ++i) {
      streams.push_back(side(i));
      DMUON_CHECK_CUDA(cudaStreamWaitEvent(streams.back(), forked, 0));
      join.others.push_back(streams.back());
    }
    cudaEventDestroy(forked);
    DMUON_CHECK_CUDA(recorded);
  }
  for (size_t k = 0; k < stream_of.size(); ++k) run(k, streams[static_cast<size_t>(stream_of[k])]);
  return num_streams;
}

}  // namespace dmuon::step::cuda

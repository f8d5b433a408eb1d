// dmuon/step/cuda/allocator.cpp — the stream-ordered allocator of the CUDA runtime.
#include "step/cuda/allocator.h"

#include <cuda_runtime.h>

#include "ns/cuda/cuda_check.h"

namespace dmuon::step::cuda {
namespace {

class AsyncAllocator : public Allocator {
 public:
  void* allocate(size_t bytes, void* stream) override {
    void* ptr = nullptr;
    DMUON_CHECK_CUDA(cudaMallocAsync(&ptr, bytes, static_cast<cudaStream_t>(stream)));
    return ptr;
  }
  void release(void* ptr, size_t, void* stream) override {
    // NOTE: never throws (it runs in destructors, also while an error unwinds).
    if (cudaFreeAsync(ptr, static_cast<cudaStream_t>(stream)) != cudaSuccess) cudaGetLastError();
  }
};

}  // namespace

std::unique_ptr<Allocator> make_async_allocator() { return std::make_unique<AsyncAllocator>(); }

}  // namespace dmuon::step::cuda

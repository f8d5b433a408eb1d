// dmuon/torch/cuda/step_cuda_ops.cpp — CudaOps over torch's caching allocator.
#include "step_cuda_ops.h"

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>

#include "step/cuda/cuda_ops.h"

namespace dmuon::torch_adapter {
namespace {

// Stream-ordered device memory from torch's caching allocator: a block is reused once the
// work its stream had enqueued when it was returned is done.
class TorchCachingAllocator : public step::cuda::Allocator {
 public:
  void* allocate(size_t bytes, void* stream) override {
    return c10::cuda::CUDACachingAllocator::raw_alloc_with_stream(bytes, static_cast<cudaStream_t>(stream));
  }
  void release(void* ptr, size_t, void*) override { c10::cuda::CUDACachingAllocator::raw_delete(ptr); }
};

// The allocator first among the bases: made before the ops, released after them (the
// ops return their cached workspaces when they die).
struct AllocatorHolder {
  TorchCachingAllocator allocator;
};

class OwnedCudaOps : private AllocatorHolder, public step::CudaOps {
 public:
  explicit OwnedCudaOps(step::CudaOpsOptions options) : step::CudaOps(with_allocator(options, &allocator)) {}

 private:
  static step::CudaOpsOptions with_allocator(step::CudaOpsOptions options, step::cuda::Allocator* allocator) {
    options.allocator = allocator;
    return options;
  }
};

}  // namespace

std::unique_ptr<step::DeviceOps> make_cuda_step_ops(const c10::Stream& stream) {
  const c10::cuda::CUDAStream cuda_stream(stream);
  step::CudaOpsOptions options;
  options.device = stream.device_index();
  options.stream = cuda_stream.stream();
  return std::make_unique<OwnedCudaOps>(options);
}

}  // namespace dmuon::torch_adapter

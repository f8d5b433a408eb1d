// dmuon/torch/engine/cuda/torch_cuda_ops.cpp — the CUDA step ops on torch's current
// stream (or a stream of the caller's), their memory from torch's caching allocator.
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <optional>

#include "common/check.h"
#include "common/env.h"
#include "engine/torch_ops.h"
#include "step/cuda/allocator.h"
#include "step/cuda/cuda_ops.h"

namespace dmuon::torch_adapter {
namespace {

// The caching allocator, stream-ordered: a block is reusable once the work enqueued on
// the stream it was allocated on is done (the ops enqueue everything on one stream).
class CachingAllocator : public step::cuda::Allocator {
 public:
  void* allocate(size_t bytes, void* stream) override {
    if (bytes == 0) return nullptr;
    void* ptr = c10::cuda::CUDACachingAllocator::raw_alloc_with_stream(bytes, static_cast<cudaStream_t>(stream));
    DMUON_CHECK(ptr != nullptr, "torch's caching allocator returned no memory for ", bytes, " bytes");
    return ptr;
  }
  void release(void* ptr, size_t, void*) override {
    if (ptr != nullptr) c10::cuda::CUDACachingAllocator::raw_delete(ptr);
  }
};

// NOTE: stateless; one instance for every ops object (the ops need it to outlive them).
CachingAllocator& caching_allocator() {
  static CachingAllocator allocator;
  return allocator;
}

}  // namespace

std::unique_ptr<step::DeviceOps> make_torch_cuda_ops(int device, const TorchOpsOptions& o) {
  const std::optional<c10::Stream>& stream = o.stream;
  const auto index = static_cast<c10::DeviceIndex>(device);
  DMUON_CHECK(!stream || (stream->device_type() == at::kCUDA && stream->device_index() == index),
              "the CUDA step ops of cuda:", device, " were given a stream of ", stream->device().str());
  c10::cuda::CUDAGuard guard(index);
  step::CudaOpsOptions options;
  options.device = device;
  options.stream = (stream ? c10::cuda::CUDAStream(*stream) : c10::cuda::getCurrentCUDAStream(index)).stream();
  options.allocator = &caching_allocator();
  options.graph_cache_bytes = std::max<int64_t>(0, env::kGraphCacheMb.get()) << 20;
  options.sym_kernel = o.sym_kernel;
  return std::make_unique<step::CudaOps>(options);
}

std::function<void()> enter_cuda_ops_stream(step::DeviceOps& ops) {
  auto& cuda_ops = dynamic_cast<step::CudaOps&>(ops);
  const auto index = static_cast<c10::DeviceIndex>(ops.device().index);
  const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(index);
  const c10::cuda::CUDAStream mine =
      c10::cuda::getStreamFromExternal(static_cast<cudaStream_t>(cuda_ops.stream()), index);
  if (current == mine) return nullptr;
  at::cuda::CUDAEvent before;
  before.record(current);
  before.block(mine);
  c10::cuda::setCurrentCUDAStream(mine);
  return [current, mine]() {
    at::cuda::CUDAEvent after;
    after.record(mine);
    after.block(current);
    c10::cuda::setCurrentCUDAStream(current);
  };
}

}  // namespace dmuon::torch_adapter

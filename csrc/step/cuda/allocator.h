// dmuon/step/cuda/allocator.h — where the CUDA step ops get their device memory: one small
// stream-ordered interface (no CUDA headers), which the torch adapter implements with
// torch's caching allocator and the GPU tests with cudaMallocAsync.
#pragma once

#include <cstddef>
#include <memory>

namespace dmuon::step::cuda {

class Allocator {
 public:
  virtual ~Allocator() = default;
  /// `bytes` of device memory (at least 256-byte aligned) usable in the order of `stream`
  /// (a cudaStream_t); never null for bytes > 0 (throws dmuon::Error instead).
  virtual void* allocate(size_t bytes, void* stream) = 0;
  /// Returns memory from allocate(): reusable once the work enqueued on `stream` so far is done.
  virtual void release(void* ptr, size_t bytes, void* stream) = 0;
};

/// cudaMallocAsync / cudaFreeAsync on the current device's default memory pool.
std::unique_ptr<Allocator> make_async_allocator();

}  // namespace dmuon::step::cuda

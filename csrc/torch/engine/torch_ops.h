// dmuon/torch/engine/torch_ops.h — the step engine's DeviceOps as the torch adapter makes
// them: memory from c10's allocators (CPU: c10's CPU allocator; CUDA: the caching
// allocator, on the ops' stream), the CUDA ops on torch's current stream, NS batches of
// the CPU ops over ATen's thread pool.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "step/device_ops.h"

namespace dmuon::torch_adapter {

struct TorchOpsOptions {
  int64_t graph_cache_bytes = int64_t{8192} << 20;  ///< CUDA: DMUON_GRAPH_CACHE_MB
};

/// DeviceOps of `device` (CPU, or a CUDA device when this build has torch's CUDA side;
/// else throws naming the device). CUDA: the ops enqueue on torch's current stream of the
/// device at this call.
std::unique_ptr<step::DeviceOps> make_torch_ops(const step::Device& device, const TorchOpsOptions& options = {});

/// While alive, torch's current stream of the ops' device is the ops' stream, ordered
/// after the work on the stream that was current; at its end that stream waits for the
/// ops' (no host sync). A no-op on the CPU or when the two are the same stream.
class OpsStreamScope {
 public:
  OpsStreamScope(step::DeviceOps& ops);
  ~OpsStreamScope();
  OpsStreamScope(const OpsStreamScope&) = delete;
  OpsStreamScope& operator=(const OpsStreamScope&) = delete;

 private:
  std::function<void()> exit_;
};

}  // namespace dmuon::torch_adapter

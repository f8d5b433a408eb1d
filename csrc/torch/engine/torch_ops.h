// dmuon/torch/engine/torch_ops.h — the step engine's DeviceOps as the torch adapter makes
// them (the one factory of both runtimes): memory from c10's allocators (CPU: c10's CPU
// allocator; CUDA: the caching allocator, on the ops' stream), the CUDA ops on torch's
// current stream or on a stream of the caller's, NS batches of the CPU ops over ATen's
// thread pool.
#pragma once

#include <c10/core/Stream.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "step/device_ops.h"

namespace dmuon::torch_adapter {

/// NOTE: the CUDA ops' graph cache is bounded by DMUON_GRAPH_CACHE_MB, read when the ops are made.
struct TorchOpsOptions {
  /// CUDA: the stream every pass is enqueued on (a stream of `device`); none: torch's
  /// current stream of the device at the make_torch_ops call.
  std::optional<c10::Stream> stream;
  /// float64 parameters through ATen (engine/aten_float64_ops.h). NOTE: its passes go to
  /// torch's current stream, so a runtime that steps off the ops' stream (the ownership
  /// runtime's commit on the caller's thread) keeps the device ops' own float64 (CPU only).
  bool aten_float64 = true;
  /// CUDA: the sm_90a symmetric kernel where usable; false: dense cuBLASLt products, mirrored.
  bool sym_kernel = true;
};

/// The engine's device of a runtime's device kind: the CPU, or torch's current CUDA device.
step::Device torch_step_device(step::DeviceKind kind);

/// A stream of torch's pool for work beside the compute stream (GPU); none on the CPU.
std::optional<c10::Stream> stream_of_its_own(const step::Device& device);

/// DeviceOps of `device` (CPU, or a CUDA device when this build has torch's CUDA side;
/// else throws naming the device).
std::unique_ptr<step::DeviceOps> make_torch_ops(const step::Device& device, const TorchOpsOptions& options = {});

/// `job`, to run on another thread: with this thread's torch state (grad mode, the
/// profiler's callbacks, dispatch keys) and, on a GPU, with `stream` (a stream of `device`;
/// none: this thread's current one) current, ordered after what this thread had enqueued on
/// its current stream when this was called (another stream waits for an event recorded now).
/// Nothing waits for the job's stream afterwards.
std::function<void()> with_this_threads_state(const step::Device& device, const std::optional<c10::Stream>& stream,
                                              std::function<void()> job);
/// `job` here and now, on `stream` as with_this_threads_state orders it (no thread state
/// captured: for calls on backward's own thread).
void run_after_current_stream(const step::Device& device, const std::optional<c10::Stream>& stream,
                              const std::function<void()>& job);

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

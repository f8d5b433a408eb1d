// dmuon/torch/engine/torch_ops.cpp — CPU ops over c10's allocator and ATen's thread pool;
// the CUDA ops come from engine/cuda/torch_cuda_ops.cpp when torch's CUDA side is built.
#include "engine/torch_ops.h"

#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <memory>
#include <optional>
#include <utility>

#include "common/check.h"
#include "engine/aten_float64_ops.h"
#include "step/cpu/cpu_ops.h"

namespace dmuon::torch_adapter {

#ifdef DMUON_WITH_CUDA
// engine/cuda/torch_cuda_ops.cpp
std::unique_ptr<step::DeviceOps> make_torch_cuda_ops(int device, const TorchOpsOptions& options);
std::function<void()> enter_cuda_ops_stream(step::DeviceOps& ops);
#endif

namespace {

// CpuOps whose memory comes from c10's CPU allocator (what torch's CPU tensors use).
class TorchCpuOps : public step::CpuOps {
 public:
  TorchCpuOps() : step::CpuOps(options()) {}

  step::OwnedBuffer allocate(step::DType dtype, int64_t numel) override {
    DMUON_CHECK(numel >= 0, "TorchCpuOps::allocate: ", numel, " elements");
    step::Buffer buffer{nullptr, dtype, numel, device()};
    if (numel == 0) return step::OwnedBuffer(buffer, nullptr);
    auto memory = std::make_shared<c10::DataPtr>(
        c10::GetCPUAllocator()->allocate(static_cast<size_t>(numel * step::dtype_size(dtype))));
    buffer.data = memory->get();
    DMUON_CHECK(buffer.data != nullptr, "TorchCpuOps::allocate: out of memory for ", buffer.bytes(), " bytes");
    return step::OwnedBuffer(buffer, [memory](const step::Buffer&) mutable { memory.reset(); });
  }

 private:
  static step::CpuOpsOptions options() {
    step::CpuOpsOptions o;
    o.parallel_for = [](int64_t n, const std::function<void(int64_t, int64_t)>& body) {
      at::parallel_for(0, n, 1, body);
    };
    return o;
  }
};

}  // namespace

step::Device torch_step_device(step::DeviceKind kind) {
  if (kind == step::DeviceKind::kCpu) return {};
  return {step::DeviceKind::kCuda, c10::impl::getDeviceGuardImpl(at::kCUDA)->getDevice().index()};
}

std::optional<c10::Stream> stream_of_its_own(const step::Device& device) {
  if (device.kind != step::DeviceKind::kCuda) return std::nullopt;
  return c10::impl::getDeviceGuardImpl(at::kCUDA)->getStreamFromGlobalPool(
      c10::Device(at::kCUDA, static_cast<c10::DeviceIndex>(device.index)), /*isHighPriority=*/false);
}

// NOTE: float64 parameters through ATen on every device (engine/aten_float64_ops.h): the
// CUDA ops have no float64 passes, and the CPU runtime takes the same path so that the CPU
// tests cover it.
std::unique_ptr<step::DeviceOps> make_torch_ops(const step::Device& device, const TorchOpsOptions& options) {
  std::unique_ptr<step::DeviceOps> ops;
  if (device.kind == step::DeviceKind::kCpu) {
    ops = std::make_unique<TorchCpuOps>();
  } else {
#ifdef DMUON_WITH_CUDA
    ops = make_torch_cuda_ops(device.index, options);
#else
    DMUON_FAIL("this build of dmuon has no CUDA side of torch: no step ops for ", step::device_name(device));
#endif
  }
  if (!options.aten_float64) return ops;
  return with_aten_float64(std::move(ops));
}

namespace {

// `stream` (none: this thread's current one) ordered after what this thread has enqueued on
// its current stream so far (GPU; nothing on the CPU): an event recorded now, which the
// stream waits for when run() enters it.
struct StreamHandOff {
  std::optional<c10::Stream> run_on;
  std::shared_ptr<c10::Event> handed;  // NOTE: shared: the hand-off is copied into a std::function

  StreamHandOff(const step::Device& device, const std::optional<c10::Stream>& stream) {
    if (device.kind != step::DeviceKind::kCuda) return;
    const c10::Stream current = c10::impl::getDeviceGuardImpl(at::kCUDA)->getStream(
        c10::Device(at::kCUDA, static_cast<c10::DeviceIndex>(device.index)));
    run_on = stream.value_or(current);
    if (*run_on == current) return;
    handed = std::make_shared<c10::Event>(at::kCUDA);
    handed->record(current);
  }
  void run(const std::function<void()>& job) const {
    std::optional<c10::StreamGuard> on_stream;
    if (run_on) on_stream.emplace(*run_on);
    if (handed) handed->block(*run_on);
    job();
  }
};

}  // namespace

std::function<void()> with_this_threads_state(const step::Device& device, const std::optional<c10::Stream>& stream,
                                              std::function<void()> job) {
  return [state = at::ThreadLocalState(), off = StreamHandOff(device, stream), job = std::move(job)] {
    const at::ThreadLocalStateGuard tls(state);
    off.run(job);
  };
}

void run_after_current_stream(const step::Device& device, const std::optional<c10::Stream>& stream,
                              const std::function<void()>& job) {
  StreamHandOff(device, stream).run(job);
}

OpsStreamScope::OpsStreamScope(step::DeviceOps& ops) {
#ifdef DMUON_WITH_CUDA
  if (ops.device().kind == step::DeviceKind::kCuda) exit_ = enter_cuda_ops_stream(device_ops_of(ops));
#else
  (void)ops;
#endif
}

OpsStreamScope::~OpsStreamScope() {
  if (exit_) exit_();
}

}  // namespace dmuon::torch_adapter

// dmuon/torch/phase_recorder.cpp — timing events (CUDA) or host clocks (CPU) per phase.
#include "phase_recorder.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>

#include "common/check.h"

namespace dmuon::torch_adapter {

PhaseRecorder::PhaseRecorder(bool enabled, const at::Device& device) : enabled_(enabled), device_(device) {}

void PhaseRecorder::open(size_t bucket, int phase) {
  if (!enabled_) return;
  DMUON_CHECK(!is_open_, "internal: PhaseRecorder: a phase is still open");
  Span span;
  span.bucket = bucket;
  span.phase = phase;
  if (device_.is_cuda()) {
    // NOTE: BACKEND_DEFAULT is a timing event (PYTORCH_DEFAULT disables timing).
    span.start = std::make_unique<c10::Event>(c10::DeviceType::CUDA, c10::EventFlag::BACKEND_DEFAULT);
    span.start->record(c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(device_));
  } else {
    span.host_start = std::chrono::steady_clock::now();
  }
  spans_.push_back(std::move(span));
  is_open_ = true;
}

void PhaseRecorder::begin(size_t bucket, sim::Phase phase) { open(bucket, static_cast<int>(phase)); }

void PhaseRecorder::begin_outside() { open(0, -1); }

void PhaseRecorder::end() {
  // NOTE: no check here: ScopedPhase calls it from a destructor, also while unwinding.
  if (!enabled_ || !is_open_) return;
  Span& span = spans_.back();
  if (device_.is_cuda()) {
    span.stop = std::make_unique<c10::Event>(c10::DeviceType::CUDA, c10::EventFlag::BACKEND_DEFAULT);
    span.stop->record(c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(device_));
  } else {
    span.host_stop = std::chrono::steady_clock::now();
  }
  is_open_ = false;
}

PhaseRecorder::Result PhaseRecorder::finish(size_t num_buckets) {
  Result out;
  if (!enabled_) return out;
  out.buckets.assign(num_buckets, {});
  DMUON_CHECK(!is_open_, "internal: PhaseRecorder: a phase is still open at the end of the step");
  if (!spans_.empty() && spans_.back().stop) spans_.back().stop->synchronize();
  for (const Span& span : spans_) {
    const double seconds = span.start ? span.start->elapsedTime(*span.stop) * 1e-3
                                      : std::chrono::duration<double>(span.host_stop - span.host_start).count();
    if (span.phase < 0) {
      out.outside_s += seconds;
      continue;
    }
    DMUON_CHECK(span.bucket < num_buckets, "internal: PhaseRecorder: bucket ", span.bucket, " of ", num_buckets);
    out.buckets[span.bucket].seconds[static_cast<size_t>(span.phase)] += seconds;
  }
  spans_.clear();
  return out;
}

}  // namespace dmuon::torch_adapter

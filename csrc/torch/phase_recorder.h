// dmuon/torch/phase_recorder.h — the device time of each compute phase of each bucket of a
// step (sim::Phase), for the projection of the step at other world sizes.
//
// CUDA: a pair of timing events per phase on the current stream, read once after the step
// (one synchronization; the step itself is not slowed down by waits). CPU: the host clock
// (every phase is synchronous there).
#pragma once

#include <ATen/ATen.h>
#include <c10/core/Event.h>

#include <chrono>
#include <memory>
#include <vector>

#include "sim/pipeline.h"

namespace dmuon::torch_adapter {

class PhaseRecorder {
 public:
  /// Records nothing (every call a no-op) unless `enabled`.
  PhaseRecorder(bool enabled, const at::Device& device);

  /// Opens `phase` of `bucket`; end() closes it (a no-op when none is open). One phase is
  /// open at a time.
  void begin(size_t bucket, sim::Phase phase);
  /// Opens a span of work that belongs to no phase (the fake world's synthetic receive data).
  void begin_outside();
  void end();

  struct Result {
    std::vector<sim::BucketTimes> buckets;  ///< [bucket]
    double outside_s = 0.0;                 ///< Σ of the spans outside the phases
  };
  /// Waits for the device, then sums every span into its bucket and phase (nothing when
  /// not enabled).
  Result finish(size_t num_buckets);

 private:
  struct Span {
    size_t bucket = 0;
    int phase = -1;  // -1: outside
    std::unique_ptr<c10::Event> start, stop;
    std::chrono::steady_clock::time_point host_start, host_stop;
  };
  void open(size_t bucket, int phase);

  bool enabled_ = false;
  at::Device device_;
  std::vector<Span> spans_;
  bool is_open_ = false;
};

}  // namespace dmuon::torch_adapter

// dmuon/step/phase_clock.h — the step engine's phase times (StepStats and its per-stage
// timeline), taken as EngineOptions::timing says: the host time to enqueue a phase, that
// time after a device synchronization at the phase's end, or the device time between two
// marks on the ops' stream, read only when the step resolves them (its end, or finish()).
//
// NOTE: why device marks: the fake-world e2e benchmark needs the timeline of a step begun
// inside backward, and a synchronization at every early phase drains the queue that
// backward's kernels were launched into, so that the device idles while the host launches
// again; the synchronized timeline then charges backward with time no real rank spends.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <vector>

#include "step/device_ops.h"
#include "step/options.h"

namespace dmuon::step {

/// Where a phase's seconds go (the engine's add function looks each one up when they are
/// known; one whose owner is gone by then, e.g. a discarded early step, is skipped).
enum class PhaseField {
  kMomentum, kModelFill, kNs, kApply,  // StepStats totals
  kEarlyNs, kEarlyLocalNs,             // the open step's early work
  kStagePrepare, kStageNs, kStageApply  // StepStats::stages[stage]
};

struct PhaseTarget {
  PhaseField field;
  size_t stage = 0;  ///< the stage of kStage* fields
};

class PhaseClock {
 public:
  using Clock = std::chrono::steady_clock;
  using AddSeconds = std::function<void(const PhaseTarget&, double seconds)>;

  /// The start of a phase: a host time and, with device marks, a mark id.
  struct Mark {
    Clock::time_point host;
    int64_t device = -1;
    uint64_t generation = 0;  ///< marks cleared since (resolve, drop): its device mark is gone
  };

  PhaseClock(DeviceOps& ops, PhaseTiming timing, AddSeconds add);

  /// Whether phases are timed on the device (kDevice on ops that make marks).
  bool on_device() const { return on_device_; }
  /// Whether a phase's end waits for the device (kSynchronized).
  bool synchronizes() const { return timing_ == PhaseTiming::kSynchronized; }

  Mark start();
  /// The phase begun at `from` ends here: its seconds to each of `targets`, at once (host
  /// time) or at resolve() (device marks; host time when its mark was cleared since).
  void stop(const Mark& from, std::initializer_list<PhaseTarget> targets);
  /// The device intervals stopped so far, added (waits for the last mark); marks cleared.
  void resolve();
  /// The intervals stopped so far, forgotten (a fresh step's stats).
  void drop();

 private:
  struct Interval {
    int64_t from = -1, to = -1;
    std::vector<PhaseTarget> targets;
  };
  DeviceOps& ops_;
  PhaseTiming timing_;
  bool on_device_ = false;
  AddSeconds add_;
  std::vector<Interval> pending_;
  uint64_t generation_ = 0;
};

}  // namespace dmuon::step

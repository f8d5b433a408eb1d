// dmuon/step/phase_clock.cpp — phase times on the host, synchronized, or between device marks.
#include "step/phase_clock.h"

#include <utility>

namespace dmuon::step {

PhaseClock::PhaseClock(DeviceOps& ops, PhaseTiming timing, AddSeconds add)
    : ops_(ops), timing_(timing), on_device_(timing == PhaseTiming::kDevice && ops.device_marks()), add_(std::move(add)) {}

PhaseClock::Mark PhaseClock::start() {
  Mark mark;
  mark.host = Clock::now();
  if (on_device_) mark.device = ops_.record_mark();
  mark.generation = generation_;
  return mark;
}

void PhaseClock::stop(const Mark& from, std::initializer_list<PhaseTarget> targets) {
  if (on_device_ && from.device >= 0 && from.generation == generation_) {
    pending_.push_back({from.device, ops_.record_mark(), std::vector<PhaseTarget>(targets)});
    return;
  }
  if (synchronizes()) ops_.synchronize();
  const double seconds = std::chrono::duration<double>(Clock::now() - from.host).count();
  for (const PhaseTarget& t : targets) add_(t, seconds);
}

void PhaseClock::resolve() {
  if (!on_device_) return;
  std::vector<Interval> pending = std::move(pending_);
  pending_.clear();
  // NOTE: the last mark was recorded last on the ops' stream: one wait covers them all.
  for (const Interval& i : pending) {
    const double seconds = ops_.mark_seconds(i.from, i.to);
    for (const PhaseTarget& t : i.targets) add_(t, seconds);
  }
  ops_.clear_marks();
  ++generation_;
}

void PhaseClock::drop() {
  if (!on_device_) return;
  pending_.clear();
  ops_.clear_marks();
  ++generation_;
}

}  // namespace dmuon::step

// The engine's phase times (step/phase_clock.h): the clock on its own (host, synchronized,
// device marks resolved later, dropped, a mark cleared while its phase ran), and the
// engine's early exchange timed by device marks: no device wait while items are made
// ready (inside backward, on a GPU), every stage's phases filled in at the step's end, and
// the same results as untimed.
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "step/phase_clock.h"
#include "step_world.h"

namespace {

using dmuon::step::DeviceOps;
using dmuon::step::EngineOptions;
using dmuon::step::PhaseClock;
using dmuon::step::PhaseField;
using dmuon::step::PhaseTarget;
using dmuon::step::PhaseTiming;
using dmuon::testing::ModelParam;
using dmuon::testing::RankTensors;
using dmuon::testing::World;

// CPU ops with pretend device marks: mark k lies at k milliseconds of device time, so that
// an interval's seconds tell how many marks it spans; counts the waits the engine makes.
class MarkingOps : public dmuon::step::ForwardingOps {
 public:
  explicit MarkingOps(DeviceOps& inner, bool marks = true) : ForwardingOps(inner), marks_(marks) {}
  bool device_marks() const override { return marks_; }
  int64_t record_mark() override { return next_mark++; }
  double mark_seconds(int64_t from, int64_t to) override {
    EXPECT_LT(from, next_mark);
    EXPECT_LT(to, next_mark);
    ++mark_reads;
    return static_cast<double>(to - from) * 1e-3;
  }
  void clear_marks() override {
    next_mark = 0;
    ++clears;
  }
  void synchronize() override {
    ++syncs;
    inner_.synchronize();
  }
  int64_t next_mark = 0;
  int syncs = 0, mark_reads = 0, clears = 0;

 private:
  bool marks_;
};

struct Sums {
  std::map<std::pair<int, size_t>, double> seconds;
  PhaseClock::AddSeconds add() {
    return [this](const PhaseTarget& t, double s) { seconds[{static_cast<int>(t.field), t.stage}] += s; };
  }
  double at(PhaseField f, size_t stage = 0) const {
    auto it = seconds.find({static_cast<int>(f), stage});
    return it == seconds.end() ? 0.0 : it->second;
  }
};

TEST(PhaseClock, DeviceMarksAreReadOnlyWhenResolved) {
  dmuon::step::CpuOps cpu;
  MarkingOps ops(cpu);
  Sums sums;
  PhaseClock clock(ops, PhaseTiming::kDevice, sums.add());
  ASSERT_TRUE(clock.on_device());
  const PhaseClock::Mark a = clock.start();                                // mark 0
  clock.stop(a, {{PhaseField::kNs}, {PhaseField::kStageNs, 2}});           // mark 1
  const PhaseClock::Mark b = clock.start();                                // mark 2
  ops.record_mark();                                                       // mark 3 (work inside)
  clock.stop(b, {{PhaseField::kApply}});                                   // mark 4
  EXPECT_EQ(sums.seconds.size(), 0u) << "nothing is added before resolve()";
  EXPECT_EQ(ops.syncs, 0);
  EXPECT_EQ(ops.mark_reads, 0);
  clock.resolve();
  EXPECT_DOUBLE_EQ(sums.at(PhaseField::kNs), 1e-3);
  EXPECT_DOUBLE_EQ(sums.at(PhaseField::kStageNs, 2), 1e-3);
  EXPECT_DOUBLE_EQ(sums.at(PhaseField::kApply), 2e-3);
  EXPECT_EQ(ops.next_mark, 0) << "resolve() clears the marks";
  EXPECT_EQ(ops.syncs, 0);
  // Resolved once: a second resolve() adds nothing.
  clock.resolve();
  EXPECT_DOUBLE_EQ(sums.at(PhaseField::kApply), 2e-3);
}

TEST(PhaseClock, DroppedIntervalsAreNeverAddedAndAClearedMarkFallsBackToTheHost) {
  dmuon::step::CpuOps cpu;
  MarkingOps ops(cpu);
  Sums sums;
  PhaseClock clock(ops, PhaseTiming::kDevice, sums.add());
  clock.stop(clock.start(), {{PhaseField::kMomentum}});
  clock.drop();
  clock.resolve();
  EXPECT_EQ(sums.at(PhaseField::kMomentum), 0.0);
  // A phase that spans a resolve(): its start mark was cleared (its id may be given again),
  // so it is timed on the host, at once.
  const PhaseClock::Mark open = clock.start();
  clock.resolve();
  ops.record_mark();
  ops.record_mark();
  clock.stop(open, {{PhaseField::kModelFill}});
  EXPECT_EQ(sums.seconds.count({static_cast<int>(PhaseField::kModelFill), 0}), 1u);
  EXPECT_LT(sums.at(PhaseField::kModelFill), 1e-3) << "host time, not the 2 ms the reused mark ids would give";
}

TEST(PhaseClock, HostTimingsAddAtOnceAndOnlySynchronizedOnesWait) {
  dmuon::step::CpuOps cpu;
  for (PhaseTiming timing : {PhaseTiming::kEnqueue, PhaseTiming::kSynchronized, PhaseTiming::kDevice}) {
    MarkingOps ops(cpu, /*marks=*/false);  // NOTE: kDevice on ops without marks: host time
    Sums sums;
    PhaseClock clock(ops, timing, sums.add());
    EXPECT_FALSE(clock.on_device());
    clock.stop(clock.start(), {{PhaseField::kNs}, {PhaseField::kStageApply, 1}});
    EXPECT_EQ(sums.seconds.size(), 2u) << static_cast<int>(timing);
    EXPECT_EQ(ops.syncs, timing == PhaseTiming::kSynchronized ? 1 : 0) << static_cast<int>(timing);
    EXPECT_EQ(ops.next_mark, 0);
  }
}

// ---------------------------------------------------------------- in the engine
struct TimedRun : dmuon::testing::EngineRun {
  std::vector<int> syncs_while_ready, marks_read_while_ready;  // [rank]
};

// Two steps begun early (every item made ready one at a time in backward order, then
// step()), each rank's ops a MarkingOps with `marks`, timed as `timing`.
TimedRun run_early(const World& world, PhaseTiming timing, bool marks) {
  const int n = world.world_size();
  std::vector<int> syncs(static_cast<size_t>(n), 0), reads(static_cast<size_t>(n), 0);
  const std::vector<dmuon::step::GroupRule> rules = {dmuon::testing::gram_rule(0.3, 0.05, true, "original")};
  std::vector<std::unique_ptr<MarkingOps>> ops;
  dmuon::testing::RunHooks hooks;
  hooks.ops = dmuon::testing::per_rank_ops(ops, n, marks);
  hooks.step = [&](int r, int s, dmuon::step::StepEngine& engine, RankTensors& t) {
    const MarkingOps& o = *ops[static_cast<size_t>(r)];
    engine.begin_step(rules, s);
    const int syncs_before = o.syncs, reads_before = o.mark_reads;
    for (int item = world.table().num_items() - 1; item >= 0; --item) engine.items_ready({item}, t.views());
    syncs[static_cast<size_t>(r)] += o.syncs - syncs_before;
    reads[static_cast<size_t>(r)] += o.mark_reads - reads_before;
    return engine.step(t.views(), rules, s);
  };
  EngineOptions options;
  options.solver = dmuon::plan::SolverKind::kLpt;
  options.stage_bytes = 512;  // NOTE: a few items per stage: many stages leave early
  options.backward_order = true;
  options.timing = timing;
  // NOTE: braced initialization runs left to right: the counts are moved after the run.
  return {dmuon::testing::run_engine(world, options, rules, 2, hooks), std::move(syncs), std::move(reads)};
}

TEST(PhaseClock, EarlyStagesTimedByDeviceMarksWaitForNothingInsideBackward) {
  constexpr int kWorld = 3;
  std::vector<ModelParam> model = {{"wide", {6, 10}}, {"tall", {10, 6}}};
  for (int k = 0; k < 8; ++k) model.push_back({"layers." + std::to_string(k), {8, 8}});
  const World world(model, kWorld, 2, 57);
  const TimedRun untimed = run_early(world, PhaseTiming::kEnqueue, /*marks=*/true);
  const TimedRun device = run_early(world, PhaseTiming::kDevice, /*marks=*/true);
  const TimedRun synced = run_early(world, PhaseTiming::kSynchronized, /*marks=*/true);
  for (const TimedRun* run : {&untimed, &device, &synced})
    for (const std::string& e : run->errors) ASSERT_EQ(e, "");
  for (int r = 0; r < kWorld; ++r) {
    const std::string where = "rank " + std::to_string(r);
    // The same step whatever the timing.
    for (size_t p = 0; p < model.size(); ++p) {
      EXPECT_EQ(device.tensors[static_cast<size_t>(r)].param[p].bytes(), untimed.tensors[static_cast<size_t>(r)].param[p].bytes())
          << where << ", parameter " << model[p].name;
      EXPECT_EQ(synced.tensors[static_cast<size_t>(r)].param[p].bytes(), untimed.tensors[static_cast<size_t>(r)].param[p].bytes())
          << where << ", parameter " << model[p].name;
    }
    const dmuon::step::StepStats& s = device.stats[static_cast<size_t>(r)];
    ASSERT_GT(s.num_stages, 2) << where;
    ASSERT_GT(s.early_stages, 1) << where;
    // Inside "backward": no device wait and no mark read with device marks; synchronized
    // timing waits there (what the fake-world benchmark used to do).
    EXPECT_EQ(device.syncs_while_ready[static_cast<size_t>(r)], 0) << where;
    EXPECT_EQ(device.marks_read_while_ready[static_cast<size_t>(r)], 0) << where;
    EXPECT_GT(synced.syncs_while_ready[static_cast<size_t>(r)], 0) << where;
    // Every stage's phases resolved from the marks: whole milliseconds of pretend device
    // time, prepare and apply positive on every stage, the totals their sums.
    double prepare = 0, ns = 0, apply = 0;
    for (const dmuon::step::StageTimeline& line : s.stages) {
      for (double v : {line.prepare_s, line.ns_s, line.apply_s})
        EXPECT_NEAR(v * 1e3, static_cast<double>(static_cast<int64_t>(v * 1e3 + 0.5)), 1e-9) << where;
      EXPECT_GT(line.prepare_s, 0.0) << where << ", stage " << line.stage_idx;
      EXPECT_GT(line.apply_s, 0.0) << where << ", stage " << line.stage_idx;
      prepare += line.prepare_s;
      ns += line.ns_s;
      apply += line.apply_s;
    }
    EXPECT_NEAR(s.momentum_s, prepare, 1e-12) << where;
    EXPECT_NEAR(s.ns_s, ns, 1e-12) << where;
    EXPECT_GE(s.apply_s, apply) << where;  // NOTE: commit's own span covers its lands too
    // The early NS (a span around the stages' NS inside items_ready) was resolved too.
    if (s.early_orthogonalized > 0) EXPECT_GT(s.early_ns_s, 0.0) << where;
  }
}

}  // namespace

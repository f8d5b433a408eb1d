// dmuon/sim/pipeline.h — the step engine's stage pipeline over every rank, with each wait
// for a collective replaced by its modelled time.
//
// A program is the engine's sequence of operations, the same on every rank: compute
// phases of stages (their measured or predicted durations differ by rank), collectives
// issued and collectives waited for. The simulation runs it on all ranks at once:
//   - compute advances the rank's stream by the phase's duration;
//   - a rank's collectives run one at a time, in issue order (one communicator), each
//     starting once the rank has issued it and its previous collective is done;
//   - a collective completes on every rank at the latest start over all ranks plus its
//     modelled time (it completes only once every rank reached it);
//   - a wait stalls the rank's stream until the collective has completed.
// NOTE: compute and transfers are assumed not to slow each other (no SM or memory
// contention) and the host is assumed to stay ahead of the device.
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <vector>

#include "sim/topology.h"
#include "sim/traffic.h"

namespace dmuon::sim {

/// The compute phases of one stage on one rank (the engine's StageTimeline, step/stats.h;
/// the engine packs its returns inside "ns": its return_pack is 0).
enum class Phase { kPrepare = 0, kNs, kReturnPack, kApply };
constexpr size_t kNumPhases = 4;

/// "prepare" (momentum + packing the forward) | "ns" (assembling + Newton–Schulz) |
/// "return_pack" | "apply" (unpacking the return + apply).
const char* phase_name(Phase phase);

/// Seconds of each phase of one stage (bucket) on one rank.
struct BucketTimes {
  std::array<double, kNumPhases> seconds{};
  double& operator[](Phase phase) { return seconds[static_cast<size_t>(phase)]; }
  double operator[](Phase phase) const { return seconds[static_cast<size_t>(phase)]; }
  double total() const;
};
using RankTimeline = std::vector<BucketTimes>;  ///< [bucket]

/// What every rank runs, in order.
struct Program {
  enum class Kind { kCompute, kIssue, kWait };
  struct Op {
    Kind kind = Kind::kCompute;
    size_t bucket = 0;            ///< kCompute
    Phase phase = Phase::kPrepare;
    size_t collective = 0;        ///< kIssue / kWait
  };
  std::vector<Op> ops;
  std::vector<double> collective_seconds;      ///< modelled time of each collective
  std::vector<std::string> collective_names;

  size_t add_collective(std::string name, double seconds);
  void compute(size_t bucket, Phase phase) { ops.push_back({Kind::kCompute, bucket, phase, 0}); }
  void issue(size_t collective) { ops.push_back({Kind::kIssue, 0, Phase::kPrepare, collective}); }
  void wait(size_t collective) { ops.push_back({Kind::kWait, 0, Phase::kPrepare, collective}); }
};

/// The step engine's program (step/engine_step.cpp run_pipeline): an agreement on the
/// gradient checks, the forwards of stages 0..depth issued (each after its prepare), then
/// for each stage k: wait for its forward and run its NS, pack and issue its return, issue
/// the next forward that keeps `depth` stages of slack, and once k ≥ depth land stage
/// k − depth (wait for its return, apply); the last `depth` stages land at the end, then
/// the agreement on the results. The two agreements take `agreement_seconds` each (0: none).
Program stage_pipeline_program(const StepTraffic& traffic, const Topology& topology, size_t depth,
                                double agreement_seconds);

struct RankProjection {
  double end_s = 0.0;      ///< when the rank's last operation ends
  double compute_s = 0.0;  ///< Σ of its compute phases
  double wait_s = 0.0;     ///< time its stream stood waiting for collectives
};

struct CollectiveSpan {
  double start_s = 0.0;  ///< the latest start over the ranks
  double end_s = 0.0;
};

struct Projection {
  std::vector<RankProjection> ranks;
  std::vector<CollectiveSpan> collectives;  ///< in Program::collective_seconds' order
  double step_s = 0.0;                      ///< the last rank's end
  int slowest_rank = 0;                     ///< the rank with the most compute (lowest on ties)
};

/// Runs `program` on every rank; times[r][bucket] gives rank r's phases. Throws
/// dmuon::Error naming the rank and bucket when a timeline is missing or negative.
Projection simulate(const Program& program, const std::vector<RankTimeline>& times);

}  // namespace dmuon::sim

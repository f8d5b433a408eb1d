// dmuon/sim/pipeline.cpp — the runtime's operation order and its simulation over ranks.
#include "sim/pipeline.h"

#include <algorithm>
#include <cmath>

#include "common/check.h"
#include "sim/collective_cost.h"

namespace dmuon::sim {

const char* phase_name(Phase phase) {
  switch (phase) {
    case Phase::kPrepare: return "prepare";
    case Phase::kNs: return "ns";
    case Phase::kReturnPack: return "return_pack";
    case Phase::kApply: return "apply";
  }
  return "unknown";
}

double BucketTimes::total() const {
  double sum = 0.0;
  for (double s : seconds) sum += s;
  return sum;
}

size_t Program::add_collective(std::string name, double seconds) {
  DMUON_CHECK(std::isfinite(seconds) && seconds >= 0, "collective ", name, ": modelled time must be >= 0, got ",
              seconds);
  collective_seconds.push_back(seconds);
  collective_names.push_back(std::move(name));
  return collective_seconds.size() - 1;
}

Program stage_pipeline_program(const StepTraffic& traffic, const Topology& topology, size_t depth,
                                double agreement_seconds) {
  DMUON_CHECK(traffic.forward.size() == traffic.back.size(), "stage_pipeline_program: ", traffic.forward.size(),
              " forwards, ", traffic.back.size(), " returns");
  DMUON_CHECK(depth >= 1, "stage_pipeline_program: depth must be >= 1, got ", depth);
  const size_t num_buckets = traffic.forward.size();
  Program program;
  // Collective ids of each bucket's forward and return (none when not issued).
  constexpr size_t kNone = static_cast<size_t>(-1);
  std::vector<size_t> forward(num_buckets, kNone), back(num_buckets, kNone);
  auto agreement = [&](const char* name) {
    if (agreement_seconds <= 0) return;
    const size_t id = program.add_collective(name, agreement_seconds);
    program.issue(id);
    program.wait(id);
  };

  agreement("all_reduce of the gradient checks");
  size_t num_issued = 0;
  auto issue_forwards_before = [&](size_t end) {
    for (; num_issued < std::min(end, num_buckets); ++num_issued) {
      program.compute(num_issued, Phase::kPrepare);
      const Exchange& e = traffic.forward[num_issued];
      if (!e.issued) continue;
      forward[num_issued] = program.add_collective("forward " + std::to_string(num_issued),
                                                   all_to_all_seconds(e, topology));
      program.issue(forward[num_issued]);
    }
  };
  auto land = [&](size_t j) {
    if (back[j] != kNone) program.wait(back[j]);
    program.compute(j, Phase::kApply);
  };
  issue_forwards_before(depth + 1);
  for (size_t k = 0; k < num_buckets; ++k) {
    if (forward[k] != kNone) program.wait(forward[k]);
    program.compute(k, Phase::kNs);
    program.compute(k, Phase::kReturnPack);
    if (traffic.back[k].issued) {
      back[k] = program.add_collective("return " + std::to_string(k), all_to_all_seconds(traffic.back[k], topology));
      program.issue(back[k]);
    }
    issue_forwards_before(k + depth + 2);
    if (k >= depth) land(k - depth);
  }
  for (size_t j = num_buckets > depth ? num_buckets - depth : 0; j < num_buckets; ++j) land(j);
  agreement("all_reduce of the finite check");
  return program;
}

Projection simulate(const Program& program, const std::vector<RankTimeline>& times) {
  DMUON_CHECK(!times.empty(), "simulate: no rank timelines");
  const size_t world = times.size();
  for (size_t r = 0; r < world; ++r)
    for (size_t b = 0; b < times[r].size(); ++b)
      for (double s : times[r][b].seconds)
        DMUON_CHECK(std::isfinite(s) && s >= 0, "simulate: rank ", r, " bucket ", b,
                    " has a phase time that is negative or not finite (", s, " s)");
  Projection out;
  out.ranks.assign(world, {});
  out.collectives.assign(program.collective_seconds.size(), {});
  std::vector<double> clock(world, 0.0), comm_free(world, 0.0);
  for (const Program::Op& op : program.ops) {
    switch (op.kind) {
      case Program::Kind::kCompute:
        for (size_t r = 0; r < world; ++r) {
          DMUON_CHECK(op.bucket < times[r].size(), "simulate: rank ", r, " has ", times[r].size(),
                      " buckets of times, the program needs bucket ", op.bucket);
          const double s = times[r][op.bucket][op.phase];
          clock[r] += s;
          out.ranks[r].compute_s += s;
        }
        break;
      case Program::Kind::kIssue: {
        double start = 0.0;
        for (size_t r = 0; r < world; ++r) start = std::max(start, std::max(clock[r], comm_free[r]));
        CollectiveSpan& span = out.collectives[op.collective];
        span.start_s = start;
        span.end_s = start + program.collective_seconds[op.collective];
        for (size_t r = 0; r < world; ++r) comm_free[r] = span.end_s;
        break;
      }
      case Program::Kind::kWait: {
        const double end = out.collectives[op.collective].end_s;
        for (size_t r = 0; r < world; ++r)
          if (clock[r] < end) {
            out.ranks[r].wait_s += end - clock[r];
            clock[r] = end;
          }
        break;
      }
    }
  }
  for (size_t r = 0; r < world; ++r) {
    out.ranks[r].end_s = clock[r];
    out.step_s = std::max(out.step_s, clock[r]);
    if (out.ranks[r].compute_s > out.ranks[static_cast<size_t>(out.slowest_rank)].compute_s)
      out.slowest_rank = static_cast<int>(r);
  }
  return out;
}

}  // namespace dmuon::sim

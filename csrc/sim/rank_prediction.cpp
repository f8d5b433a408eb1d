// dmuon/sim/rank_prediction.cpp — work per stage, the per-phase fit, predicted timelines.
#include "sim/rank_prediction.h"

#include <algorithm>

#include "common/check.h"

namespace dmuon::sim {

namespace {

// Least squares of t = fixed + rate·x, both ≥ 0 (the better one-parameter fit when the
// two-parameter one goes negative or x does not vary).
PhaseFit fit_work(const std::vector<double>& x, const std::vector<double>& t) {
  PhaseFit out;
  if (x.empty()) return out;
  const double n = static_cast<double>(x.size());
  double sx = 0, st = 0, sxx = 0, sxt = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    sx += x[i];
    st += t[i];
    sxx += x[i] * x[i];
    sxt += x[i] * t[i];
  }
  const double det = n * sxx - sx * sx;
  // NOTE: relative test: work is in elements (~1e8) or seconds (~1e-3), so an absolute
  // threshold would not mean the same for both.
  const bool varies = det > 1e-12 * n * sxx;
  if (varies) {
    out.rate = (n * sxt - sx * st) / det;
    out.fixed_s = (st - out.rate * sx) / n;
  }
  if (!varies || out.rate < 0 || out.fixed_s < 0) {
    const PhaseFit rate_only{0.0, sxx > 0 ? std::max(0.0, sxt / sxx) : 0.0, 0.0};
    const PhaseFit fixed_only{std::max(0.0, st / n), 0.0, 0.0};
    auto residual = [&](const PhaseFit& f) {
      double sum = 0;
      for (size_t i = 0; i < x.size(); ++i) sum += (f.at(x[i]) - t[i]) * (f.at(x[i]) - t[i]);
      return sum;
    };
    out = residual(rate_only) <= residual(fixed_only) ? rate_only : fixed_only;
  }
  return out;
}

// fit_work over the samples with work (x > 0); idle: the mean t of the others.
PhaseFit fit(const std::vector<double>& all_x, const std::vector<double>& all_t) {
  std::vector<double> x, t;
  double idle_sum = 0;
  size_t num_idle = 0;
  for (size_t i = 0; i < all_x.size(); ++i) {
    if (all_x[i] > 0) {
      x.push_back(all_x[i]);
      t.push_back(all_t[i]);
    } else {
      idle_sum += all_t[i];
      ++num_idle;
    }
  }
  PhaseFit out = fit_work(x, t);
  out.idle_s = num_idle > 0 ? idle_sum / static_cast<double>(num_idle) : 0.0;
  return out;
}

void check_timeline(const StageLayout& layout, int rank, const RankTimeline& timeline) {
  DMUON_CHECK(rank >= 0 && rank < layout.world_size, "measured rank ", rank, " is outside a world of ",
              layout.world_size);
  DMUON_CHECK(timeline.size() == layout.num_stages(), "the timeline of rank ", rank, " has ", timeline.size(),
              " stages, the step layout ", layout.num_stages());
}

}  // namespace

RankWork rank_work(const StageLayout& layout, int rank, const plan::CostFn& cost) {
  layout.validate();
  DMUON_CHECK(rank >= 0 && rank < layout.world_size, "rank_work: rank ", rank, " is outside a world of ",
              layout.world_size);
  RankWork work(layout.num_stages());
  for (size_t s = 0; s < layout.num_stages(); ++s) {
    const RankStageWork& w = layout.work[s][static_cast<size_t>(rank)];
    auto& out = work[s];
    out.fill(0.0);
    out[static_cast<size_t>(Phase::kPrepare)] = w.prepare_elements;
    out[static_cast<size_t>(Phase::kApply)] = w.apply_elements;
    for (const NsBatchShape& b : w.ns_batches)
      if (b.count > 0) out[static_cast<size_t>(Phase::kNs)] += cost(b.rows, b.cols, b.count);
  }
  return work;
}

Calibration calibrate(const StageLayout& layout, const std::vector<std::pair<int, RankTimeline>>& measured,
                      const plan::CostFn& cost) {
  DMUON_CHECK(!measured.empty(), "calibrate: at least one measured rank is needed");
  std::array<std::vector<double>, kNumPhases> xs, ts;
  for (const auto& [rank, timeline] : measured) {
    check_timeline(layout, rank, timeline);
    const RankWork work = rank_work(layout, rank, cost);
    for (size_t s = 0; s < timeline.size(); ++s)
      for (size_t p = 0; p < kNumPhases; ++p) {
        xs[p].push_back(work[s][p]);
        ts[p].push_back(timeline[s].seconds[p]);
      }
  }
  Calibration out;
  for (size_t p = 0; p < kNumPhases; ++p) out.phases[p] = fit(xs[p], ts[p]);
  return out;
}

std::vector<RankTimeline> complete_timelines(const StageLayout& layout,
                                             const std::vector<std::pair<int, RankTimeline>>& measured,
                                             const plan::CostFn& cost) {
  std::vector<RankTimeline> out(static_cast<size_t>(layout.world_size));
  std::vector<bool> known(static_cast<size_t>(layout.world_size), false);
  for (const auto& [rank, timeline] : measured) {
    check_timeline(layout, rank, timeline);
    DMUON_CHECK(!known[static_cast<size_t>(rank)], "rank ", rank, " is measured twice");
    out[static_cast<size_t>(rank)] = timeline;
    known[static_cast<size_t>(rank)] = true;
  }
  if (std::all_of(known.begin(), known.end(), [](bool k) { return k; })) return out;
  const Calibration calibration = calibrate(layout, measured, cost);
  for (int r = 0; r < layout.world_size; ++r) {
    if (known[static_cast<size_t>(r)]) continue;
    const RankWork work = rank_work(layout, r, cost);
    RankTimeline& timeline = out[static_cast<size_t>(r)];
    timeline.resize(work.size());
    for (size_t s = 0; s < work.size(); ++s)
      for (size_t p = 0; p < kNumPhases; ++p) timeline[s].seconds[p] = calibration.phases[p].at(work[s][p]);
  }
  return out;
}

}  // namespace dmuon::sim

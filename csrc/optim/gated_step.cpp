// dmuon/optim/gated_step.cpp — the one-GPU gated step's decisions (see gated_step.h).
#include "optim/gated_step.h"

#include <map>
#include <tuple>
#include <utility>

#include "common/check.h"
#include "ns/batch_streams.h"
#include "ns/ns_bound.h"

namespace dmuon::optim {

bool fused_path_takes(const FusedTensor& param, const FusedTensor& grad, const FusedTensor& momentum, bool enabled,
                      bool kernel_usable) {
  if (!enabled || !param.defined || !param.cuda || param.sizes.size() < 2) return false;
  for (const FusedTensor* t : {&param, &grad, &momentum}) {
    if (t == &momentum && !t->defined) continue;
    if (!t->defined || !t->float32 || !t->contiguous || !t->cuda || t->device != param.device ||
        t->sizes != param.sizes)
      return false;
  }
  return kernel_usable;
}

int gated_stream_count(int64_t requested, int64_t knob) {
  if (requested != 0) {
    DMUON_CHECK(requested >= 1 && requested <= 8, "fused_streams must be between 1 and 8 (0: DMUON_FUSED_STREAMS), got ",
                requested);
    return static_cast<int>(requested);
  }
  DMUON_CHECK(knob >= 1 && knob <= 8, "DMUON_FUSED_STREAMS must be between 1 and 8, got ", knob);
  return static_cast<int>(knob);
}

std::vector<int> gated_batch_streams(const std::vector<GatedBatch>& batches, const std::vector<GatedBatch>& warm,
                                     const std::vector<ns::Schedule>& schedules, int num_streams) {
  if (batches != warm) return std::vector<int>(batches.size(), 0);
  // NOTE: the floor at nominal H200 rates: only the costs' ratios matter here.
  constexpr double kFlopsPerSecond = 775e12, kBytesPerSecond = 4.0e12;
  std::vector<ns::StreamJob> jobs;
  std::map<std::tuple<int64_t, int64_t, int64_t>, int64_t> key_of;
  for (const GatedBatch& batch : batches) {
    DMUON_CHECK(batch.group >= 0 && static_cast<size_t>(batch.group) < schedules.size(), "gated step: batch group ",
                batch.group, " has no schedule (", schedules.size(), " groups)");
    const int64_t key = key_of.emplace(std::make_tuple(batch.group, batch.rows, batch.cols),
                                       static_cast<int64_t>(key_of.size())).first->second;
    const std::vector<std::pair<int64_t, int64_t>> shapes(static_cast<size_t>(batch.num_matrices),
                                                          {batch.rows, batch.cols});
    const ns::StepBound bound = ns::fused_step_bound(shapes, schedules[static_cast<size_t>(batch.group)],
                                                     kFlopsPerSecond, kBytesPerSecond);
    jobs.push_back({key, bound.seconds()});
  }
  return ns::assign_streams(jobs, num_streams);
}

}  // namespace dmuon::optim

// dmuon/step/runtime_options.cpp — the runtime's options resolved into the engine's, and the
// engine's statistics as the runtime reports them (see the header).
#include "step/runtime_options.h"

#include <set>

#include "common/check.h"
#include "common/env.h"
#include "step/engine.h"

namespace dmuon::step {
namespace {

// The NS streams: `requested` when set, else DMUON_FUSED_STREAMS; the error names the one
// that is not between 1 and 8.
int stream_count(std::optional<int64_t> requested) {
  if (requested) {
    DMUON_CHECK(*requested >= 1 && *requested <= 8,
                "fused_streams must be between 1 and 8 (None: DMUON_FUSED_STREAMS), got ", *requested);
    return static_cast<int>(*requested);
  }
  const int64_t knob = env::kFusedStreams.get();
  DMUON_CHECK(knob >= 1 && knob <= 8, "DMUON_FUSED_STREAMS must be between 1 and 8, got ", knob);
  return static_cast<int>(knob);
}

}  // namespace

CostModel parse_cost_model(const std::string& name) {
  if (name == "auto") return CostModel::kAuto;
  if (name == "analytic") return CostModel::kAnalytic;
  if (name == "profile") return CostModel::kProfile;
  DMUON_FAIL("cost_model must be 'auto', 'analytic' or 'profile', got '", name, "'");
}

DeviceKind parse_device_kind(const std::string& name) {
  if (name == "cpu") return DeviceKind::kCpu;
  if (name == "cuda") return DeviceKind::kCuda;
  DMUON_FAIL("device_type must be 'cpu' or 'cuda', got '", name, "'");
}

EngineOptions RuntimeOptions::resolve() const {
  EngineOptions e = engine;
  const int64_t depth = env::resolve(pipeline_depth, env::kPipelineDepth);
  DMUON_CHECK(depth >= 0, "DMUON_PIPELINE_DEPTH must be >= 0 (0: twice the world size), got ", depth);
  e.pipeline_depth = static_cast<int>(depth);
  e.num_streams = stream_count(fused_streams);
  const int64_t batch_mb = env::resolve(ns_batch_mb, env::kNsBatchMb);
  DMUON_CHECK(batch_mb >= 1, "DMUON_NS_BATCH_MB must be at least 1, got ", batch_mb);
  e.ns_batch_bytes = batch_mb << 20;
  e.graphs = env::resolve(cuda_graphs, env::kCudaGraphs);
  // NOTE: profiling synchronizes every phase; a recorded timeline takes device time
  // between marks instead, so that work begun inside backward does not stall it.
  e.timing = profile || env::kProfile.get() ? PhaseTiming::kSynchronized
             : record_timeline              ? PhaseTiming::kDevice
                                            : PhaseTiming::kEnqueue;
  e.milp = plan::MilpOptions::from_env();
  e.cost.measure = cost_model == CostModel::kProfile || (cost_model == CostModel::kAuto && device == DeviceKind::kCuda);
  return e;
}

RuntimeStats runtime_stats(const StepEngine& engine, int rank, int world_size, DeviceKind device,
                           const std::vector<bool>& active, bool record_timeline) {
  const StepStats& e = engine.last_stats();
  const ItemTable& table = engine.items();
  RuntimeStats s;
  s.momentum_s = e.momentum_s + e.check_s;
  s.pack_s = e.pack_s;
  s.comm_wait_s = e.comm_wait_s;
  s.ns_s = e.ns_s;
  s.apply_s = e.apply_s;
  s.total_s = e.total_s;
  s.bytes_sent = e.bytes_sent;
  s.bytes_received = e.bytes_received;
  s.num_buckets = e.num_stages;
  s.num_orthogonalized = e.num_orthogonalized;
  s.pipeline_depth = e.pipeline_depth;
  s.model_fill_s = e.model_fill_s;
  s.early_stages = e.early_stages;
  s.early_orthogonalized = e.early_orthogonalized;
  s.early_ns_s = e.early_ns_s;
  s.early_fill_s = e.early_fill_s;
  s.begun_stale = e.begun_stale;
  // The matrices (items) this rank orthogonalized, in stage order.
  for (const Stage& stage : engine.stages())
    for (const NsBatch& batch : stage.batches)
      if (batch.computed_by(rank))
        for (int item : batch.items) {
          const size_t p = static_cast<size_t>(table.item(item).param_idx);
          if (active.empty() || p >= active.size() || active[p]) s.orthogonalized.push_back(item);
        }
  // NOTE: one process on a GPU is the fused one-GPU step (today's names for its figures).
  if (world_size == 1 && device == DeviceKind::kCuda) {
    std::set<int> params;
    for (int64_t item : s.orthogonalized) params.insert(table.item(static_cast<int>(item)).param_idx);
    s.num_fused = static_cast<int64_t>(params.size());
    s.fused_batches = e.ns_batches;
    s.num_fused_streams = e.num_streams;
  }
  if (record_timeline)
    for (const StageTimeline& line : e.stages) {
      sim::BucketTimes t;
      t.seconds = {line.prepare_s, line.ns_s, 0.0, line.apply_s};
      s.bucket_times.push_back(t);
    }
  return s;
}

}  // namespace dmuon::step

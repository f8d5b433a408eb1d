// dmuon/step/cost_profile.h — the owner planner's NS costs, measured by the engine on its
// own ops (torch-free).
//
// A point is an NS batch as the step runs it: `count` matrices of one shape under their
// group's schedule, the iterate filled from wire pieces as an owner's is
// (DeviceOps::iterate_from_pieces), CUDA graphs as the step's. It is timed through the
// ops (device marks where they make them, else the host clock around a synchronized run):
// the median of CostOptions::num_runs after num_warmup runs. Times live in the one
// measurement store (DeviceOps::measurement_store(); on CUDA the autotuner's file, so that
// a time is trusted exactly as long as the configurations it was measured with) under
// "ns_time" keys. The engine times the batches its stages can form (make_stages' bounds),
// on rank 0, and broadcasts the table so that every rank plans the same problem; over a
// transport that moves no data (a fake world) every rank times alone.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ns/schedule.h"
#include "plan/cost_model.h"
#include "step/device_ops.h"
#include "step/items.h"
#include "step/options.h"
#include "step/transport.h"

namespace dmuon::step {

/// One NS batch to time: `count` rows×cols matrices of `dtype` parameters under `schedule`.
struct CostPoint {
  int64_t rows = 0, cols = 0, count = 0;
  DType dtype = DType::kFloat32;
  const ns::Schedule* schedule = nullptr;
};

/// The seconds of every point on `ops`, its pieces on a wire of `wire` dtype, replayed as
/// CUDA graphs when `graphs`: read from the store where it holds the point, else timed and
/// kept there (the store's file, if any, rewritten once: tmp → fsync → rename, merged with
/// what other processes wrote; a corrupt or stale file is ignored with one warning).
/// Throws dmuon::Error naming a bad point or a failed run.
plan::CostTable measure_ns_costs(DeviceOps& ops, const std::vector<CostPoint>& points, DType wire, bool graphs,
                                 const CostOptions& options);

/// The cost the engine plans `table`'s items with (wire: the step's wire dtype): with
/// options.cost.measure the table of the NS batches the step's stages form (a larger
/// batch is priced as the batches make_stages cuts it into), else the analytic model of
/// the ops' device; the table measured goes to `measured`. Collective where the transport
/// moves data between several ranks: rank 0's table, or its choice of the analytic
/// model, is broadcast. Throws only when that broadcast fails: a failure on any rank, or
/// a rank whose cost option differs from rank 0's, sets `error` and returns the analytic
/// model, for the plan's agreement to raise on every rank.
plan::CostFn planning_cost(const ItemTable& table, DeviceOps& ops, Transport& transport, const EngineOptions& options,
                           DType wire, plan::CostTable& measured, std::string& error);

}  // namespace dmuon::step

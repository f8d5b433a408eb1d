// dmuon/step/cost_profile.cpp — NS batches timed through DeviceOps, the measurement store,
// and rank 0's table shared with every rank.
#include "step/cost_profile.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <utility>

#include "common/check.h"
#include "plan/hash.h"
#include "step/stages.h"

namespace dmuon::step {
namespace {

// NOTE: a timed run shorter than the clock can tell still costs something (costs must be
// positive for the planner).
constexpr double kMinSeconds = 1e-9;
// NOTE: NS time is about linear in the batch after the launch overhead, so batches of
// 1, 2, 4, … up to the largest bound the interpolation error by one octave; 12 sizes
// reach batches of 1024 before the largest.
constexpr int kMaxSizes = 12;
constexpr uint64_t kSyntheticSeed = 0x6e735f74696d65ull;
// The broadcast text: the analytic model, a failure, or a measured table.
constexpr const char* kAnalytic = "analytic";
constexpr const char* kFailed = "failed ";
constexpr const char* kMeasured = "measured";

// This process's stores: one per (file, environment), read from its file once.
autotune::TuneCache& store_of(const std::string& path, const autotune::TuneEnvironment& environment) {
  static std::mutex mutex;
  static std::map<std::pair<std::string, std::string>, std::unique_ptr<autotune::TuneCache>> stores;
  std::lock_guard<std::mutex> lock(mutex);
  std::unique_ptr<autotune::TuneCache>& store = stores[{path, environment.describe()}];
  if (!store) {
    store = std::make_unique<autotune::TuneCache>(environment);
    if (!path.empty()) store->load(path);
  }
  return *store;
}

// What a point's time depends on besides the store's environment: shape, batch, parameter
// and wire dtype, the schedule (its algorithm, coefficients and restarts), graphs.
autotune::TuneKey point_key(const CostPoint& p, DType wire, bool graphs) {
  plan::Hasher hasher;
  for (const ns::Coefficients& c : p.schedule->steps) hasher.f64(c.a), hasher.f64(c.b), hasher.f64(c.c);
  for (int r : p.schedule->restart_after) hasher.i64(r);
  hasher.f64(p.schedule->eps);
  std::ostringstream extra;
  extra << ns::algorithm_name(p.schedule->algorithm) << ":x" << p.schedule->steps.size() << ":" << std::hex
        << hasher.digest() << ":" << dtype_name(wire) << (graphs ? ":graphs" : ":eager");
  return {"ns_time", p.rows, p.cols, 0, p.count, dtype_name(p.dtype), extra.str()};
}

// Seconds of one run of `batch`, its iterate filled from `pieces`.
double run_seconds(DeviceOps& ops, const NsBatchDesc& batch, const std::vector<WirePiece>& pieces) {
  const auto fill = [&](const NsView& iterate, bool) { ops.iterate_from_pieces(pieces, batch, iterate, Buffer{}); };
  const auto consume = [](const NsView&) {};
  if (ops.device_marks()) {
    const int64_t begin = ops.record_mark();
    ops.orthogonalize(batch, fill, consume);
    const double seconds = ops.mark_seconds(begin, ops.record_mark());
    // NOTE: the engine plans before its first step: no mark of its own is pending.
    ops.clear_marks();
    return seconds;
  }
  ops.synchronize();
  const auto begin = std::chrono::steady_clock::now();
  ops.orthogonalize(batch, fill, consume);
  ops.synchronize();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
}

// The median of num_runs runs after num_warmup, on synthetic full-rank pieces (the
// autotuner compares iterations on them as on real updates).
double time_point(DeviceOps& ops, const CostPoint& p, DType wire, bool graphs, const CostOptions& options) {
  const NsBatchDesc batch{p.rows, p.cols, p.count, p.dtype, p.schedule, graphs};
  const int64_t numel = p.rows * p.cols;
  OwnedBuffer input = ops.allocate(wire, p.count * numel);
  ops.fill_synthetic(input.get(), kSyntheticSeed);
  std::vector<WirePiece> pieces;
  for (int64_t k = 0; k < p.count; ++k)
    pieces.push_back({input.get().slice(k * numel, numel, "measuring NS costs"), k, 0, p.rows});
  for (int i = 0; i < options.num_warmup; ++i) run_seconds(ops, batch, pieces);
  std::vector<double> runs;
  for (int i = 0; i < options.num_runs; ++i) runs.push_back(run_seconds(ops, batch, pieces));
  std::sort(runs.begin(), runs.end());
  // NOTE: the lower middle for an even count, so that it is always a measured value.
  return std::max(runs[static_cast<size_t>((runs.size() - 1) / 2)], kMinSeconds);
}

// Per shape of the items, the NS batches the step's stages form of it (make_stages'
// bounds: the NS workspace and, over several ranks, the owner's share of a stage), priced
// by the run of (group, dtype) that holds most of its items.
struct ShapeBatches {
  int64_t capacity = 1;  // the largest batch a stage forms
  int64_t largest = 1;   // the largest batch of this model: what the table times up to
  DType dtype = DType::kFloat32;
  const ns::Schedule* schedule = nullptr;
};
using ShapeKey = std::pair<int64_t, int64_t>;

std::map<ShapeKey, ShapeBatches> step_batches(const ItemTable& table, DeviceOps& ops, const EngineOptions& options,
                                              DType wire) {
  std::map<ShapeKey, std::map<std::pair<int, DType>, int64_t>> runs;
  for (const Item& it : table.items()) ++runs[{it.rows, it.cols}][{it.group, it.dtype}];
  const NsBytesFn ns_bytes = [&](int64_t rows, int64_t cols, int64_t count, DType dtype, ns::Algorithm algorithm) {
    return ops.ns_workspace_bytes(rows, cols, count, dtype, algorithm);
  };
  const int world = table.world_size();
  std::map<ShapeKey, ShapeBatches> out;
  for (const auto& [shape, by_run] : runs) {
    const auto most = std::max_element(by_run.begin(), by_run.end(),
                                       [](const auto& a, const auto& b) { return a.second < b.second; });
    const auto [group, dtype] = most->first;
    DMUON_CHECK(group >= 0 && static_cast<size_t>(group) < options.cost.schedules.size(), "measuring NS costs: ",
                options.cost.schedules.size(), " group schedules, but items of group ", group);
    ShapeBatches& s = out[shape];
    s.dtype = dtype;
    s.schedule = &options.cost.schedules[static_cast<size_t>(group)];
    const auto [rows, cols] = shape;
    s.capacity = ns_batch_capacity(rows, cols, dtype, s.schedule->algorithm, options.ns_batch_bytes, ns_bytes);
    const int64_t item_wire = rows * cols * dtype_size(wire);
    if (world > 1 && options.stage_bytes > 0)
      s.capacity = std::min(s.capacity, std::max<int64_t>(1, options.stage_bytes / world / item_wire));
    int64_t count = 0;
    for (const auto& run : by_run) count += run.second;
    s.largest = std::min(s.capacity, count);
  }
  return out;
}

std::vector<CostPoint> points_of(const std::map<ShapeKey, ShapeBatches>& shapes) {
  std::vector<CostPoint> points;
  for (const auto& [shape, s] : shapes) {
    int num_sizes = 0;
    for (int64_t b = 1; b < s.largest && num_sizes < kMaxSizes - 1; b *= 2, ++num_sizes)
      points.push_back({shape.first, shape.second, b, s.dtype, s.schedule});
    points.push_back({shape.first, shape.second, s.largest, s.dtype, s.schedule});
  }
  return points;
}

// t(n): the batches make_stages cuts n matrices into (split_near_equal: ⌈n/capacity⌉
// runs of ⌈n/runs⌉, the last one the rest), each at its measured time.
plan::CostFn batched_cost(plan::CostTable table, std::map<ShapeKey, ShapeBatches> shapes) {
  return [table = std::move(table), shapes = std::move(shapes)](int64_t rows, int64_t cols, int64_t n) {
    const auto it = shapes.find({rows, cols});
    const int64_t capacity = it == shapes.end() ? n : it->second.capacity;
    const int64_t num_runs = (n + capacity - 1) / capacity, per_run = (n + num_runs - 1) / num_runs;
    const int64_t rest = n % per_run;
    double seconds = static_cast<double>(n / per_run) * table.seconds(rows, cols, per_run);
    if (rest > 0) seconds += table.seconds(rows, cols, rest);
    return seconds;
  };
}

std::string encode(const plan::CostTable& table) {
  std::ostringstream out;
  out.precision(17);
  out << kMeasured << "\n";
  for (const auto& [rows, cols, count, seconds] : table.entries())
    out << rows << " " << cols << " " << count << " " << seconds << "\n";
  return out.str();
}

plan::CostTable decode(const std::string& text) {
  std::istringstream in(text);
  std::string head;
  std::getline(in, head);
  DMUON_CHECK(head == kMeasured, "the broadcast NS cost table starts with '", head, "'");
  plan::CostTable table;
  int64_t rows = 0, cols = 0, count = 0;
  double seconds = 0.0;
  while (in >> rows >> cols >> count >> seconds) table.set(rows, cols, count, seconds);
  DMUON_CHECK(in.eof(), "the broadcast NS cost table is malformed after ", table.size(), " entries");
  return table;
}

}  // namespace

plan::CostTable measure_ns_costs(DeviceOps& ops, const std::vector<CostPoint>& points, DType wire, bool graphs,
                                 const CostOptions& options) {
  options.validate();
  MeasurementStore where = ops.measurement_store();
  if (!options.store_path.empty()) where.path = options.store_path;
  autotune::TuneCache& store = store_of(where.path, where.environment);
  plan::CostTable table;
  bool added = false;
  for (const CostPoint& p : points) {
    DMUON_CHECK(p.rows >= 1 && p.cols >= 1 && p.count >= 1 && p.schedule != nullptr, "measuring NS costs: a batch of ",
                p.count, " ", p.rows, "x", p.cols, " matrices", p.schedule == nullptr ? " without a schedule" : "");
    const autotune::TuneKey key = point_key(p, wire, graphs);
    std::optional<autotune::TuneEntry> entry = store.get(key);
    // NOTE: a time that is not positive and finite is measured again, never planned with.
    if (!entry || !(std::isfinite(entry->time_ms) && entry->time_ms > 0.0)) {
      entry = autotune::TuneEntry{"median", 1e3 * time_point(ops, p, wire, graphs, options)};
      store.put(key, *entry);
      added = true;
    }
    table.set(p.rows, p.cols, p.count, entry->time_ms * 1e-3);
  }
  if (added && !where.path.empty()) store.save_or_warn(where.path);
  return table;
}

plan::CostFn planning_cost(const ItemTable& table, DeviceOps& ops, Transport& transport, const EngineOptions& options,
                           DType wire, plan::CostTable& measured, std::string& error) {
  const plan::CostFn analytic = (ops.device().kind == DeviceKind::kCuda ? plan::AnalyticCostModel::gpu_default()
                                                                       : plan::AnalyticCostModel::cpu_default())
                                    .as_cost_fn();
  // NOTE: every rank of a world that moves data takes part in the broadcast whatever its
  // own option says, so that a rank whose option differs fails by name instead of
  // meeting its peers in another collective.
  const bool shared = transport.world_size() > 1 && transport.moves_data();
  if (!shared && !options.cost.measure) return analytic;
  std::map<ShapeKey, ShapeBatches> shapes;
  std::string text = kAnalytic, failure;
  if (options.cost.measure && (!shared || transport.rank() == 0)) {
    try {
      shapes = step_batches(table, ops, options, wire);
      text = encode(measure_ns_costs(ops, points_of(shapes), wire, options.graphs, options.cost));
    } catch (const std::exception& e) {
      failure = e.what();
      text = std::string(kFailed) + failure;
    }
  }
  if (shared) text = transport.broadcast(text, "broadcast of the measured NS cost table");
  const std::string rank = "rank " + std::to_string(transport.rank());
  const bool measures = text != kAnalytic && text.rfind(kFailed, 0) != 0;
  if (!failure.empty()) {
    error = "measuring the NS cost table failed on " + rank + ": " + failure;
  } else if (text.rfind(kFailed, 0) == 0) {
    error = "measuring the NS cost table failed on rank 0: " + text.substr(std::string(kFailed).size());
  } else if (measures != options.cost.measure) {
    error = std::string("the cost model differs between ranks: rank 0 ") +
            (measures ? "measures NS times" : "plans with the analytic model") + ", " + rank +
            (options.cost.measure ? " measures them" : " plans with the analytic model") +
            " (every rank must pass the same cost_model)";
  } else if (measures) {
    try {
      if (shapes.empty()) shapes = step_batches(table, ops, options, wire);
      measured = decode(text);
      return batched_cost(measured, std::move(shapes));
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  return analytic;
}

}  // namespace dmuon::step

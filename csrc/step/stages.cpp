// dmuon/step/stages.cpp — plan batches → NS batches → stages.
#include "step/stages.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <map>
#include <tuple>

#include "common/check.h"

namespace dmuon::step {

std::vector<std::vector<int>> split_near_equal(const std::vector<int64_t>& counts, int64_t capacity) {
  DMUON_CHECK(capacity >= 1, "split_near_equal: capacity must be at least 1, got ", capacity);
  int64_t total = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    DMUON_CHECK(counts[i] >= 1, "split_near_equal: item ", i, " holds ", counts[i], " matrices");
    total += counts[i];
  }
  std::vector<std::vector<int>> runs;
  if (counts.empty()) return runs;
  const int64_t num_runs = (total + capacity - 1) / capacity;
  const int64_t per_run = (total + num_runs - 1) / num_runs;
  int64_t in_run = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (runs.empty() || (in_run > 0 && in_run + counts[i] > per_run)) {
      runs.emplace_back();
      in_run = 0;
    }
    runs.back().push_back(static_cast<int>(i));
    in_run += counts[i];
  }
  return runs;
}

int64_t ns_batch_capacity(int64_t rows, int64_t cols, DType dtype, ns::Algorithm algorithm, int64_t limit,
                          const NsBytesFn& ns_bytes) {
  if (limit <= 0) return std::numeric_limits<int64_t>::max();
  // NOTE: workspaces grow linearly in the batch (the backends carve per-matrix regions),
  // so the difference of two sizes is the cost of one more matrix.
  const int64_t one = ns_bytes(rows, cols, 1, dtype, algorithm);
  const int64_t per_matrix = std::max<int64_t>(1, ns_bytes(rows, cols, 2, dtype, algorithm) - one);
  if (one >= limit) return 1;
  return 1 + (limit - one) / per_matrix;
}

std::vector<std::vector<int>> shape_batches(const ItemTable& table, const std::vector<int>& items) {
  std::map<std::pair<int64_t, int64_t>, size_t> slot;
  std::vector<std::vector<int>> batches;
  for (int idx : items) {
    const Item& it = table.item(idx);
    const auto [pos, added] = slot.emplace(std::make_pair(it.rows, it.cols), batches.size());
    if (added) batches.emplace_back();
    batches[pos->second].push_back(idx);
  }
  return batches;
}

std::vector<Stage> make_stages(const ItemTable& table, const std::vector<OwnerBatches>& owners,
                               const std::vector<ns::Algorithm>& group_algorithms, const StageLimits& limits,
                               const NsBytesFn& ns_bytes) {
  const int world = table.world_size();
  const bool gather = owners.size() == 1 && owners[0].owner == kEveryRank;
  const bool windowed = limits.backward_order && !limits.window_of.empty();
  DMUON_CHECK(limits.window_of.empty() || static_cast<int>(limits.window_of.size()) == table.num_items(),
              "make_stages: window_of has ", limits.window_of.size(), " entries for ", table.num_items(), " items");
  int num_windows = 0;
  for (int w : limits.window_of) {
    DMUON_CHECK(w >= 0, "make_stages: window ids must be >= 0, got ", w);
    num_windows = std::max(num_windows, w + 1);
  }
  std::vector<bool> seen(static_cast<size_t>(table.num_items()), false);
  std::vector<std::vector<NsBatch>> per_owner;
  for (const OwnerBatches& owner : owners) {
    DMUON_CHECK(owner.owner == kEveryRank || (owner.owner >= 0 && owner.owner < world), "make_stages: owner ",
                owner.owner, " outside a world of ", world);
    std::vector<NsBatch> list;
    for (const std::vector<int>& plan_batch : owner.batches) {
      // Split by (group, dtype), each run in plan order, runs in order of first appearance.
      std::vector<std::pair<std::tuple<int, DType>, std::vector<int>>> runs;
      for (int idx : plan_batch) {
        DMUON_CHECK(idx >= 0 && idx < table.num_items(), "make_stages: item ", idx, " out of range");
        DMUON_CHECK(!seen[static_cast<size_t>(idx)], "make_stages: item ", idx, " (", table.item_name(idx),
                    ") is listed twice");
        seen[static_cast<size_t>(idx)] = true;
        const Item& it = table.item(idx);
        const Item& first = table.item(plan_batch.front());
        DMUON_CHECK(it.rows == first.rows && it.cols == first.cols, "make_stages: a plan batch mixes ", first.rows,
                    "x", first.cols, " and ", it.rows, "x", it.cols, " (item ", table.item_name(idx), ")");
        const auto key = std::make_tuple(it.group, it.dtype);
        auto run = std::find_if(runs.begin(), runs.end(), [&](const auto& r) { return r.first == key; });
        if (run == runs.end()) run = runs.insert(runs.end(), {key, {}});
        run->second.push_back(idx);
      }
      for (auto& [key, members] : runs) {
        if (limits.backward_order) std::sort(members.begin(), members.end(), std::greater<int>());
        const auto [group, dtype] = key;
        DMUON_CHECK(group >= 0 && static_cast<size_t>(group) < group_algorithms.size(), "parameter '",
                    table.param(table.item(members.front()).param_idx).name, "': group index ", group, " but ",
                    group_algorithms.size(), " groups");
        const ns::Algorithm algorithm = group_algorithms[static_cast<size_t>(group)];
        const Item& it = table.item(members.front());
        const int64_t item_wire = it.numel() * limits.wire_element_bytes;
        int64_t capacity = ns_batch_capacity(it.rows, it.cols, dtype, algorithm, limits.ns_batch_bytes, ns_bytes);
        // NOTE: one process moves nothing, nor does an item whole on its owner (the
        // weight-ownership mode), so only the NS workspace bounds their batches.
        const bool travels = table.param(it.param_idx).whole_on_rank < 0;
        if (world > 1 && limits.stage_bytes > 0 && travels) {
          const int64_t share = gather ? limits.stage_bytes : limits.stage_bytes / world;
          capacity = std::min(capacity, std::max<int64_t>(1, share / std::max<int64_t>(1, item_wire)));
        }
        // NOTE: no more than the run holds (split_near_equal's arithmetic must not overflow).
        capacity = std::min<int64_t>(capacity, static_cast<int64_t>(members.size()));
        // Windowed: runs of one window each (members are in descending order), each split alone.
        std::vector<std::vector<int>> parts;
        for (size_t begin = 0; begin < members.size();) {
          size_t end = begin + 1;
          while (windowed && end < members.size() &&
                 limits.window_of[static_cast<size_t>(members[end])] ==
                     limits.window_of[static_cast<size_t>(members[begin])])
            ++end;
          if (!windowed) end = members.size();
          const int64_t size = static_cast<int64_t>(end - begin);
          const std::vector<int64_t> ones(static_cast<size_t>(size), 1);
          for (std::vector<int> part : split_near_equal(ones, std::min(capacity, size))) {
            for (int& k : part) k += static_cast<int>(begin);
            parts.push_back(std::move(part));
          }
          begin = end;
        }
        for (const std::vector<int>& part : parts) {
          NsBatch batch;
          batch.owner = owner.owner;
          batch.group = group;
          batch.dtype = dtype;
          batch.rows = it.rows;
          batch.cols = it.cols;
          for (int k : part) batch.items.push_back(members[static_cast<size_t>(k)]);
          const int64_t count = static_cast<int64_t>(batch.items.size());
          batch.wire_bytes = count * item_wire;
          batch.ns_bytes = ns_bytes(it.rows, it.cols, count, dtype, algorithm);
          list.push_back(std::move(batch));
        }
      }
    }
    // NOTE: stable: batches of one layer keep their plan order.
    if (limits.backward_order)
      std::stable_sort(list.begin(), list.end(),
                       [](const NsBatch& a, const NsBatch& b) { return a.items.front() > b.items.front(); });
    per_owner.push_back(std::move(list));
  }
  for (int idx = 0; idx < table.num_items(); ++idx)
    DMUON_CHECK(seen[static_cast<size_t>(idx)], "make_stages: item ", idx, " (", table.item_name(idx),
                ") is in no plan batch");

  std::vector<Stage> stages;
  auto add = [](Stage& stage, NsBatch batch) {
    stage.wire_bytes += batch.wire_bytes;
    stage.batches.push_back(std::move(batch));
  };
  if (world == 1) {
    Stage only;
    for (auto& list : per_owner)
      for (auto& batch : list) add(only, std::move(batch));
    if (!only.batches.empty()) stages.push_back(std::move(only));
    return stages;
  }
  if (windowed) {
    // Stage w: every owner's batches of window w, owners in order.
    stages.resize(static_cast<size_t>(num_windows));
    for (auto& list : per_owner)
      for (auto& batch : list) {
        const int w = limits.window_of[static_cast<size_t>(batch.items.front())];
        add(stages[static_cast<size_t>(w)], std::move(batch));
      }
    stages.erase(std::remove_if(stages.begin(), stages.end(), [](const Stage& st) { return st.batches.empty(); }),
                 stages.end());
    return stages;
  }
  size_t longest = 0;
  for (const auto& list : per_owner) longest = std::max(longest, list.size());
  for (size_t s = 0; s < longest; ++s) {
    Stage stage;
    for (auto& list : per_owner)
      if (s < list.size()) add(stage, std::move(list[s]));
    stages.push_back(std::move(stage));
  }
  return stages;
}

}  // namespace dmuon::step

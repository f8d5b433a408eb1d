// dmuon/torch/owner_planning.h — owner planning shared by both runtimes: rank 0 solves
// the planning problem and broadcasts the plan's text; every rank deserializes it.
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "dist/shard_layout.h"
#include "plan/plan.h"
#include "plan/problem.h"

namespace dmuon::torch_adapter {

struct OwnerPlanInput {
  std::vector<std::string> names;
  std::vector<dist::ParamLayout> layouts;
  std::vector<int64_t> wire_bytes;  ///< bytes each matrix moves to its owner
  int world_size = 1;
  std::string solver = "milp";
  std::string device_type = "cpu";  ///< analytic cost model when cost_entries is empty
  std::vector<std::tuple<int64_t, int64_t, int64_t, double>> cost_entries;
};

struct OwnerPlan {
  plan::Problem problem;
  plan::Plan plan;
  std::string text;  ///< the plan as broadcast by rank 0
};

/// The planning problem of `input` (identical on every rank).
plan::Problem build_owner_problem(const OwnerPlanInput& input);

/// Solves `problem` with `solver`, applies `adjust` (e.g. layer spreading) when given, and
/// returns the plan's text (what rank 0 broadcasts).
std::string solve_owner_plan(const plan::Problem& problem, const std::string& solver,
                             const std::function<void(const plan::Problem&, plan::Plan&)>& adjust = {});

/// Solves on rank 0 (after `adjust`, e.g. layer spreading, when given) and broadcasts
/// the text over `group` (null: one process). `what` names the runtime in errors.
OwnerPlan plan_owners(const OwnerPlanInput& input, const c10::intrusive_ptr<c10d::ProcessGroup>& group,
                      int rank, const at::Device& device,
                      const std::function<void(const plan::Problem&, plan::Plan&)>& adjust = {});

/// Broadcasts `text` from group rank 0 (length first); returns it on every rank.
std::string broadcast_text(const c10::intrusive_ptr<c10d::ProcessGroup>& group, int rank,
                           const std::string& text, const at::Device& device, const std::string& what);

}  // namespace dmuon::torch_adapter

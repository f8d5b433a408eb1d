// dmuon/torch/owner_planning.h — owner planning shared by both runtimes: rank 0 solves
// the planning problem and broadcasts the plan's text, every rank deserializes it; or every
// rank solves it itself with a deterministic solve (a fake world, where nothing can be
// broadcast), and real ranks then agree on a hash of what they decided.
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

/// Where a rank's plan comes from.
enum class PlanSource {
  kBroadcast,  ///< rank 0 solves and broadcasts the text
  kLocal,      ///< every rank solves the same problem deterministically
};

/// Parses "broadcast" | "local"; errors name the option plan_source.
PlanSource parse_plan_source(const std::string& name);

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

/// The deterministic solve every rank can make itself: the MILP stopped only by its node
/// cap (DMUON_PLAN_MAX_NODES; CBC single-threaded), LPT and round robin as they are. Plans
/// are remembered per process by their inputs' hash, so that the ranks one process plays
/// in turn (fake worlds) solve once. Throws dmuon::Error if the solve was not deterministic.
std::string solve_owner_plan_locally(const plan::Problem& problem, const std::string& solver,
                                     const std::function<void(const plan::Problem&, plan::Plan&)>& adjust = {});

/// The plan of `input` from `source`: kBroadcast solves on rank 0 (after `adjust`, e.g.
/// layer spreading, when given) and broadcasts the text over `group` (null: one process);
/// kLocal solves on every rank (solve_owner_plan_locally) without communicating. With
/// agree_on_problem, the ranks of `group` first agree on the problem's hash (agree_on_hash),
/// so that ranks with other inputs (e.g. another cost table) fail by name on every rank.
OwnerPlan plan_owners(const OwnerPlanInput& input, const c10::intrusive_ptr<c10d::ProcessGroup>& group,
                      int rank, const at::Device& device,
                      const std::function<void(const plan::Problem&, plan::Plan&)>& adjust = {},
                      PlanSource source = PlanSource::kBroadcast, bool agree_on_problem = false);

/// Every rank of `group` passes the hash of what it decided; throws dmuon::Error on every
/// rank, naming `what` and the first rank whose hash differs from rank 0's, unless all are
/// equal (one all_gather of one int64 per rank).
void agree_on_hash(const c10::intrusive_ptr<c10d::ProcessGroup>& group, int rank, uint64_t hash,
                   const at::Device& device, const std::string& what);

/// Broadcasts `text` from group rank 0 (length first); returns it on every rank.
std::string broadcast_text(const c10::intrusive_ptr<c10d::ProcessGroup>& group, int rank,
                           const std::string& text, const at::Device& device, const std::string& what);

}  // namespace dmuon::torch_adapter

// dmuon/step/engine_plan.cpp — the one planner driver: the engine's plan (made and agreed
// when the engine is made), the owners of the weight-ownership mode's parameters (planned
// before any optimizer exists), and the stages made from a plan.
#include <algorithm>
#include <functional>
#include <map>
#include <utility>

#include "common/check.h"
#include "plan/cost_model.h"
#include "plan/hash.h"
#include "plan/layer_spread.h"
#include "plan/planner.h"
#include "plan/stage_windows.h"
#include "step/cost_profile.h"
#include "step/engine.h"

namespace dmuon::step {
namespace {

// The planning problem of `items`: one matrix each (MoE experts are planned one by one),
// each with its home (home_ranks()).
plan::Problem planning_problem(const ItemTable& table, const std::vector<int>& items, const std::vector<int>& homes,
                               int64_t wire_size, const EngineOptions& options, const plan::CostFn& cost) {
  std::vector<plan::MatrixSpec> matrices;
  for (int i : items) {
    const Item& it = table.item(i);
    matrices.push_back({table.item_name(i), it.rows, it.cols, 1, it.numel() * wire_size, 0, homes[static_cast<size_t>(i)]});
  }
  plan::ProblemOptions problem_options;
  problem_options.world_size = table.world_size();
  problem_options.bandwidth_bytes_per_s = options.bandwidth_bytes_per_s;
  return plan::build_problem(std::move(matrices), problem_options, cost);
}

// What makes two plans the same step: the problem, every owner and every batch.
// NOTE: not the text, which carries the solve time of the rank that solved it.
uint64_t plan_fingerprint(const plan::Plan& plan) {
  plan::Hasher hasher;
  hasher.i64(static_cast<int64_t>(plan.problem_hash));
  for (int owner : plan.owner) hasher.i64(owner);
  for (const plan::RankPlan& rank : plan.ranks) {
    hasher.i64(static_cast<int64_t>(rank.batches.size()));
    for (const plan::Batch& batch : rank.batches) {
      hasher.i64(static_cast<int64_t>(batch.matrix_idx.size()));
      for (int idx : batch.matrix_idx) hasher.i64(idx);
    }
  }
  return hasher.digest();
}

// What makes two given-owner plans the same step: every item's shape, group and owner,
// and every owner's batches.
uint64_t given_fingerprint(const ItemTable& table, const std::vector<int>& owners,
                           const std::vector<OwnerBatches>& batches) {
  plan::Hasher hasher;
  for (int i = 0; i < table.num_items(); ++i) {
    const Item& it = table.item(i);
    for (int64_t v : {it.rows, it.cols, static_cast<int64_t>(it.group), static_cast<int64_t>(it.dtype),
                      static_cast<int64_t>(owners[static_cast<size_t>(i)])})
      hasher.i64(v);
  }
  for (const OwnerBatches& owner : batches) {
    hasher.i64(owner.owner);
    for (const std::vector<int>& batch : owner.batches) {
      hasher.i64(static_cast<int64_t>(batch.size()));
      for (int idx : batch) hasher.i64(idx);
    }
  }
  return hasher.digest();
}

// The home of every item that some ranks, not all, hold whole (an expert under FSDP2's
// Shard(0) on the expert dim or of an EP group, a matrix replicated over part of a mesh):
// owned there, nothing travels forward, so the planner counts no receive time there
// (plan::MatrixSpec::home). Items with several whole holders take them in turn (round
// robin per holder set), so replicas share the work. −1: no home (held whole by every
// rank or by none). NOTE: the same on every rank: it depends on the table only.
std::vector<int> home_ranks(const ItemTable& table) {
  std::vector<int> home(static_cast<size_t>(table.num_items()), -1);
  std::map<std::vector<int>, int64_t> turn;  // holder set → items homed on it so far
  for (int i = 0; i < table.num_items(); ++i) {
    std::vector<int> holders;
    for (int r = 0; r < table.world_size(); ++r)
      if (table.whole_on(i, r)) holders.push_back(r);
    if (holders.empty() || static_cast<int>(holders.size()) == table.world_size()) continue;
    const int64_t k = turn[holders]++;
    home[static_cast<size_t>(i)] = holders[static_cast<size_t>(k % static_cast<int64_t>(holders.size()))];
  }
  return home;
}

// What else makes the ranks' exchanges the same: the options the stages and the
// pipeline's order of collectives are made from. NOTE: a rank with another stage size or
// depth would issue other all_to_alls than its peers: a hang, not an error.
uint64_t with_step_options(uint64_t hash, const EngineOptions& options, DType wire, int depth) {
  plan::Hasher hasher;
  hasher.i64(static_cast<int64_t>(hash));
  for (int64_t v : {static_cast<int64_t>(options.mode), static_cast<int64_t>(wire), options.stage_bytes,
                    options.ns_batch_bytes, static_cast<int64_t>(depth), int64_t{options.backward_order ? 1 : 0}})
    hasher.i64(v);
  // NOTE: the stages of a step begun from backward are runs of these groups.
  hasher.i64(static_cast<int64_t>(options.backward_groups.size()));
  for (int g : options.backward_groups) hasher.i64(g);
  return hasher.digest();
}

// The backward_stage_note() of `windows` (plan/stage_windows.h) over `problem`: said where
// the last window, which leaves only when backward has ended, holds more than half the
// wire bytes.
std::string late_stage_note(const plan::Problem& problem, const std::vector<int>& windows) {
  const int last = windows.empty() ? 0 : *std::max_element(windows.begin(), windows.end());
  int64_t total = 0, late = 0, late_matrices = 0;
  for (size_t k = 0; k < windows.size(); ++k) {
    total += problem.matrices[k].wire_bytes;
    if (windows[k] == last) {
      late += problem.matrices[k].wire_bytes;
      ++late_matrices;
    }
  }
  if (total == 0 || 2 * late <= total) return "";
  // NOTE: what to change: a stage holds a matrix per rank (plan/stage_windows.h), so a model
  // of fewer than two matrices per rank makes two stages at most however it is sharded.
  const int world = problem.world_size();
  const std::string cause =
      plan::matrices_per_backward_window(world, static_cast<int64_t>(windows.size())) < world
          ? "; a stage holds at least one matrix per rank, and " + std::to_string(windows.size()) +
                " matrices over " + std::to_string(world) + " ranks make few stages: set backward_step=False"
          : "; the stages are runs of what backward hands over together (each fully_shard unit): apply "
            "fully_shard to each block, or set backward_step=False";
  return "the last of its " + std::to_string(last + 1) + " backward stages holds " + std::to_string(late_matrices) +
         " of " + std::to_string(windows.size()) + " matrices (" + std::to_string(100 * late / total) +
         "% of their wire bytes), and it starts only when backward has ended" + cause;
}

// One all_reduce: no rank failed to make its plan and every rank holds the same hash.
void agree_plan(Transport& transport, uint64_t hash, const std::string& error) {
  const int64_t hi = static_cast<int64_t>(hash >> 32), lo = static_cast<int64_t>(hash & 0xffffffffu);
  // NOTE: max of (x, −x) over the ranks gives max and −min: every rank agrees iff both are its own.
  const std::vector<int64_t> agreed = transport.all_reduce({error.empty() ? 0 : 1, hi, lo, -hi, -lo}, ReduceOp::kMax,
                                                           "all_reduce of the owner plan's hash");
  DMUON_CHECK(error.empty(), "planning owners failed on rank ", transport.rank(), ": ", error);
  DMUON_CHECK(agreed[0] == 0, "planning owners failed on another rank (its error names the cause)");
  DMUON_CHECK(agreed[1] == hi && agreed[2] == lo && agreed[3] == -hi && agreed[4] == -lo,
              "the owner plan differs between ranks (rank ", transport.rank(), " holds plan hash ", hash,
              "): every rank must pass the same parameters and options");
}

// A plan of `problem` every rank holds: rank 0 solves and broadcasts, or (deterministic
// solvers, `local`, or a transport that moves nothing) every rank solves; `finish` adjusts
// the solved plan where it is made (layer spreading, backward windows). Then one
// all_reduce agrees that every rank holds the same plan (its fingerprint, `salted` with
// what else must agree) and that none failed (`error`: this rank failed already).
struct AgreedPlan {
  plan::Plan plan;
  std::string text;
  uint64_t hash = 0;
};
AgreedPlan solve_agreed(Transport& transport, const plan::Problem& problem, const EngineOptions& options,
                        const std::function<void(plan::Plan&)>& finish, const std::function<uint64_t(uint64_t)>& salted,
                        std::string error = "") {
  // NOTE: LPT and round robin are deterministic; the MILP may stop at a wall-clock limit,
  // so its plan is made once and broadcast. A transport that moves nothing cannot
  // broadcast, so every rank solves (the fake world's ranks are one process each).
  const bool local = options.solver != plan::SolverKind::kMilp || !transport.moves_data() || options.plan_locally;
  const auto finished = [&](plan::Plan solved) {
    if (finish) finish(solved);
    return solved.serialize();
  };
  AgreedPlan out;
  try {
    if (!error.empty()) {
      // Nothing to solve: the problem could not be made (its costs failed).
    } else if (local && options.solver == plan::SolverKind::kMilp) {
      // NOTE: ranks that each solve alone must solve alike: no wall-clock limit in effect
      // (1e7 s; the MILP turns it into a steady_clock deadline, so not infinity), only the
      // node cap; memoized per process (a fake world's ranks, one process, solve once).
      plan::MilpOptions milp = options.milp;
      milp.time_limit_s = 1e7;
      static plan::PlanCache cache;  // NOTE: in memory; thread-safe
      const plan::Plan solved = cache.get_or_solve(problem, options.solver, milp);
      DMUON_CHECK(solved.deterministic, "planning owners locally: the MILP stopped on its time limit (",
                  solved.status, "), so ranks that each solve alone could disagree");
      out.text = finished(solved);
    } else if (local || transport.rank() == 0) {
      out.text = finished(plan::solve(problem, options.solver, options.milp));
    }
  } catch (const std::exception& e) {
    error = e.what();
  }
  if (!local) out.text = transport.broadcast(out.text, "broadcast of the owner plan");
  if (error.empty()) {
    try {
      out.plan = plan::deserialize_plan(problem, out.text);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  // NOTE: the problem hash (inside the fingerprint) covers every matrix's home.
  out.hash = error.empty() ? salted(plan_fingerprint(out.plan)) : 0;
  agree_plan(transport, out.hash, error);
  return out;
}

}  // namespace

// Owners: given (parameters "whole on rank r"), solved for the rest; each owner's items in
// batches; agreed by one all_reduce of the whole plan's fingerprint.
void StepEngine::make_plan() {
  const int num_items = table_.num_items();
  if (num_items == 0) return;
  std::vector<int> given, rest;
  for (int i = 0; i < num_items; ++i) (table_.param(table_.item(i).param_idx).whole_on_rank >= 0 ? given : rest).push_back(i);
  DMUON_CHECK(given.empty() || options_.mode == Mode::kOwner, "parameters whole on one rank need mode 'owner', not '",
              mode_name(options_.mode), "'");
  owners_.assign(static_cast<size_t>(num_items), 0);
  // The given owners' items, batched by shape on each owner.
  std::vector<std::vector<int>> mine(static_cast<size_t>(world_));
  for (int i : given) {
    owners_[static_cast<size_t>(i)] = table_.param(table_.item(i).param_idx).whole_on_rank;
    mine[static_cast<size_t>(owners_[static_cast<size_t>(i)])].push_back(i);
  }
  std::vector<OwnerBatches> given_batches;
  for (int r = 0; r < world_ && !given.empty(); ++r)
    given_batches.push_back({r, shape_batches(table_, mine[static_cast<size_t>(r)])});
  if (rest.empty()) plan_text_ = "owners given by the caller";
  // Without a planner: one process, or every rank computing everything (gather mode).
  if (rest.empty() || options_.mode == Mode::kGather || world_ == 1) {
    const int owner = options_.mode == Mode::kGather ? kEveryRank : 0;
    for (int i : rest) owners_[static_cast<size_t>(i)] = owner;
    if (!rest.empty()) owner_batches_ = {{owner, shape_batches(table_, rest)}};
    owner_batches_.insert(owner_batches_.end(), given_batches.begin(), given_batches.end());
    plan_hash_ = with_step_options(given_fingerprint(table_, owners_, owner_batches_), options_, wire_dtype_, depth_);
    if (world_ > 1) agree_plan(transport_, plan_hash_, "");
    return;
  }
  const int64_t wire_size = dtype_size(wire_dtype_);
  // NOTE: every item is planned; one whole on some ranks has its home there, and the
  // planner keeps it there unless moving it balances the loads better.
  // NOTE: collective over a transport that moves data (rank 0's table); a failure is
  // raised on every rank by the agreement below.
  std::string error;
  const plan::CostFn cost = planning_cost(table_, ops_, transport_, options_, wire_dtype_, measured_costs_, error);
  const plan::Problem problem = planning_problem(table_, rest, home_ranks(table_), wire_size, options_, cost);
  // NOTE: a step begun from backward issues stage s once backward is through it: each
  // backward window of about one stage is spread over the owners (same loads, other
  // same-shape matrices; plan/stage_windows.h), where the plan is made (rank 0 before the
  // broadcast, or every rank alike: the spreading is deterministic). Stage w is then
  // window w (make_stages), so that it leaves once backward is through it. Given owners
  // keep their own batches: windows are for planned items only.
  const bool windows = options_.backward_order && given.empty();
  std::vector<int> group_of;
  if (windows && !options_.backward_groups.empty()) {
    DMUON_CHECK(static_cast<int>(options_.backward_groups.size()) == table_.num_params(), "backward_groups has ",
                options_.backward_groups.size(), " entries for ", table_.num_params(), " parameters");
    for (int i : rest) group_of.push_back(options_.backward_groups[static_cast<size_t>(table_.item(i).param_idx)]);
  }
  if (windows && plan::uses_backward_windows(problem)) {
    stage_windows_ = plan::backward_stage_windows(problem, group_of);
    backward_stage_note_ = late_stage_note(problem, stage_windows_);
  }
  const AgreedPlan agreed = solve_agreed(
      transport_, problem, options_,
      [&](plan::Plan& solved) {
        if (windows) plan::spread_backward_stages(problem, group_of, solved);
      },
      [&](uint64_t fingerprint) {
        plan::Hasher hasher;
        hasher.i64(static_cast<int64_t>(fingerprint));
        hasher.i64(static_cast<int64_t>(given_fingerprint(table_, owners_, given_batches)));
        return with_step_options(hasher.digest(), options_, wire_dtype_, depth_);
      },
      error);
  // Owners and batches: the plan's matrices are `rest`, in order.
  for (size_t m = 0; m < rest.size(); ++m) owners_[static_cast<size_t>(rest[m])] = agreed.plan.owner[m];
  for (int r = 0; r < world_; ++r) {
    OwnerBatches batches{r, {}};
    for (const plan::Batch& b : agreed.plan.ranks[static_cast<size_t>(r)].batches) {
      std::vector<int> items;
      for (int m : b.matrix_idx) items.push_back(rest[static_cast<size_t>(m)]);
      batches.batches.push_back(std::move(items));
    }
    owner_batches_.push_back(std::move(batches));
    predicted_rank_s_.push_back(agreed.plan.ranks[static_cast<size_t>(r)].compute_seconds);
  }
  owner_batches_.insert(owner_batches_.end(), given_batches.begin(), given_batches.end());
  plan_text_ = agreed.text;
  plan_hash_ = agreed.hash;
  predicted_makespan_s_ = agreed.plan.makespan;
}

OwnerPlan plan_whole_owners(Transport& transport, const std::vector<ParamSpec>& params,
                            const std::vector<int>& layer_of, const EngineOptions& options, DeviceKind device,
                            int64_t wire_element_bytes, bool spread_layers) {
  DMUON_CHECK(layer_of.size() == params.size(), "plan_whole_owners: ", layer_of.size(), " layer ids for ",
              params.size(), " parameters");
  OwnerPlan out;
  if (params.empty()) return out;
  if (transport.world_size() == 1) {
    out.owners.assign(params.size(), 0);
    out.text = "one rank owns every parameter";
    return out;
  }
  // NOTE: one unit per parameter (it lives whole on one owner): its matrices as a batch;
  // row blocks of different sizes are planned as blocks of the largest (an upper bound of
  // their cost); a parameter of no element costs nothing and is planned as a 1×1 matrix
  // so that it still gets an owner.
  std::vector<plan::MatrixSpec> matrices;
  for (const ParamSpec& p : params) {
    const layout::ParamLayout& layout = p.layout;
    int64_t rows = layout.matrix_rows();
    for (const layout::RowBlock& block : layout.matrix_blocks()) rows = std::max(rows, block.count);
    const int64_t numel = layout.numel();
    matrices.push_back({p.name, std::max<int64_t>(1, rows), std::max<int64_t>(1, layout.matrix_cols()),
                        std::max<int64_t>(1, layout.num_matrices()), std::max<int64_t>(1, numel * wire_element_bytes),
                        0, -1});
  }
  plan::ProblemOptions problem_options;
  problem_options.world_size = transport.world_size();
  problem_options.bandwidth_bytes_per_s = options.bandwidth_bytes_per_s;
  const plan::Problem problem = plan::build_problem(
      std::move(matrices), problem_options,
      plan::runtime_cost_fn({}, device == DeviceKind::kCuda ? "cuda" : "cpu"));
  const AgreedPlan agreed = solve_agreed(
      transport, problem, options,
      [&](plan::Plan& solved) {
        if (spread_layers) plan::spread_layers(problem, layer_of, solved);
      },
      [](uint64_t fingerprint) { return fingerprint; });
  out.owners = agreed.plan.owner;
  out.text = agreed.text;
  out.makespan_s = agreed.plan.makespan;
  return out;
}

void StepEngine::make_stages_for(const std::vector<GroupRule>& rules) {
  std::vector<ns::Algorithm> algorithms;
  for (const GroupRule& rule : rules) algorithms.push_back(rule.schedule.algorithm);
  if (algorithms == stage_algorithms_ && (!stages_.empty() || table_.num_items() == 0)) return;
  StageLimits limits{dtype_size(wire_dtype_), options_.stage_bytes, options_.ns_batch_bytes, options_.backward_order,
                     stage_windows_};
  stages_ = make_stages(table_, owner_batches_, algorithms, limits,
                        [&](int64_t rows, int64_t cols, int64_t count, DType dtype, ns::Algorithm algorithm) {
                          return ops_.ns_workspace_bytes(rows, cols, count, dtype, algorithm);
                        });
  stage_algorithms_ = std::move(algorithms);
  // The exchange plans of the old stages go; the one of every item active comes with the new.
  plans_.clear();
  plan_order_.clear();
  plan_for(std::vector<bool>(static_cast<size_t>(table_.num_items()), true));
}

std::shared_ptr<const ExchangePlan> StepEngine::plan_for(const std::vector<bool>& active) {
  const auto found = plans_.find(active);
  if (found != plans_.end()) return found->second;
  if (plans_.size() >= kMaxExchangePlans) {
    plans_.erase(plan_order_.front());
    plan_order_.pop_front();
  }
  auto plan = std::make_shared<const ExchangePlan>(plan_exchange(table_, stages_, options_.mode, rank_, active));
  plans_.emplace(active, plan);
  plan_order_.push_back(active);
  return plan;
}

}  // namespace dmuon::step

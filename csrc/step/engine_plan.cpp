// dmuon/step/engine_plan.cpp — the engine's plan (made and agreed when the engine is made)
// and the stages made from it.
#include <map>
#include <utility>

#include "common/check.h"
#include "plan/cost_model.h"
#include "plan/hash.h"
#include "plan/planner.h"
#include "plan/stage_windows.h"
#include "step/cost_profile.h"
#include "step/engine.h"

namespace dmuon::step {
namespace {

// The planning problem: one matrix per item (MoE experts are planned one by one), each
// with its home (home_ranks()).
plan::Problem planning_problem(const ItemTable& table, const std::vector<int>& homes, int64_t wire_size,
                               const EngineOptions& options, const plan::CostFn& cost) {
  std::vector<plan::MatrixSpec> matrices;
  for (int i = 0; i < table.num_items(); ++i) {
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
  return hasher.digest();
}

}  // namespace

// One all_reduce: no rank failed to make its plan and every rank holds the same hash.
void StepEngine::agree_plan(uint64_t hash, const std::string& error) {
  const int64_t hi = static_cast<int64_t>(hash >> 32), lo = static_cast<int64_t>(hash & 0xffffffffu);
  // NOTE: max of (x, −x) over the ranks gives max and −min: every rank agrees iff both are its own.
  const std::vector<int64_t> agreed = transport_.all_reduce({error.empty() ? 0 : 1, hi, lo, -hi, -lo}, ReduceOp::kMax,
                                                            "all_reduce of the owner plan's hash");
  DMUON_CHECK(error.empty(), "planning owners failed on rank ", rank_, ": ", error);
  DMUON_CHECK(agreed[0] == 0, "planning owners failed on another rank (its error names the cause)");
  DMUON_CHECK(agreed[1] == hi && agreed[2] == lo && agreed[3] == -hi && agreed[4] == -lo,
              "the owner plan differs between ranks (rank ", rank_, " holds plan hash ", hash,
              "): every rank must pass the same parameters and options");
}

// Owners given by the caller (parameters "whole on rank r"): each owner's items in
// same-shape batches, agreed by hash like a solved plan.
void StepEngine::take_given_owners() {
  const int num_items = table_.num_items();
  for (int p = 0; p < table_.num_params(); ++p)
    DMUON_CHECK(table_.param(p).whole_on_rank >= 0, "parameter '", table_.param(p).name,
                "' has a layout while other parameters are whole on one rank: one engine takes either owners "
                "given for every parameter or none (the weight-ownership mode has its own engine)");
  DMUON_CHECK(options_.mode == Mode::kOwner, "parameters whole on one rank need mode 'owner', not '",
              mode_name(options_.mode), "'");
  owners_.resize(static_cast<size_t>(num_items));
  std::vector<std::vector<int>> mine(static_cast<size_t>(world_));
  for (int i = 0; i < num_items; ++i) {
    owners_[static_cast<size_t>(i)] = table_.param(table_.item(i).param_idx).whole_on_rank;
    mine[static_cast<size_t>(owners_[static_cast<size_t>(i)])].push_back(i);
  }
  for (int r = 0; r < world_; ++r) owner_batches_.push_back({r, shape_batches(table_, mine[static_cast<size_t>(r)])});
  plan_hash_ = with_step_options(given_fingerprint(table_, owners_, owner_batches_), options_, wire_dtype_, depth_);
  plan_text_ = "owners given by the caller";
  if (world_ > 1) agree_plan(plan_hash_, "");
}

// Owners and their batches. Rank 0 solves and broadcasts, or (deterministic solvers, or a
// transport that moves nothing) every rank solves; then one all_reduce agrees that every
// rank holds the same plan (and that none failed to make it).
void StepEngine::make_plan() {
  const int num_items = table_.num_items();
  std::vector<int> all(static_cast<size_t>(num_items));
  for (int i = 0; i < num_items; ++i) all[static_cast<size_t>(i)] = i;
  if (num_items == 0) return;
  bool given = false;
  for (int p = 0; p < table_.num_params() && !given; ++p) given = table_.param(p).whole_on_rank >= 0;
  if (given) return take_given_owners();
  if (options_.mode == Mode::kGather || world_ == 1) {
    const int owner = options_.mode == Mode::kGather ? kEveryRank : 0;
    owners_.assign(static_cast<size_t>(num_items), owner);
    owner_batches_ = {{owner, shape_batches(table_, all)}};
    plan_hash_ = with_step_options(given_fingerprint(table_, owners_, owner_batches_), options_, wire_dtype_, depth_);
    if (world_ > 1) agree_plan(plan_hash_, "");
    return;
  }
  const int64_t wire_size = dtype_size(wire_dtype_);
  // NOTE: every item is planned; one whole on some ranks has its home there, and the
  // planner keeps it there unless moving it balances the loads better (issue 27).
  // NOTE: collective over a transport that moves data (rank 0's table); a failure is
  // raised on every rank by the agreement below.
  std::string text, error;
  const plan::CostFn cost = planning_cost(table_, ops_, transport_, options_, wire_dtype_, measured_costs_, error);
  const plan::Problem problem = planning_problem(table_, home_ranks(table_), wire_size, options_, cost);
  // NOTE: LPT and round robin are deterministic; the MILP may stop at a wall-clock limit,
  // so its plan is made once and broadcast. A transport that moves nothing cannot
  // broadcast, so every rank solves (the fake world's ranks are one process each).
  const bool local = options_.solver != plan::SolverKind::kMilp || !transport_.moves_data() || options_.plan_locally;
  // NOTE: a step begun from backward issues stage s once backward is through it: each
  // backward window of about one stage is spread over the owners (same loads, other
  // same-shape matrices; plan/stage_windows.h), where the plan is made (rank 0 before the
  // broadcast, or every rank alike: the spreading is deterministic).
  const auto finished = [&](plan::Plan solved) {
    if (options_.backward_order) plan::spread_backward_stages(problem, options_.stage_bytes, solved);
    return solved.serialize();
  };
  // NOTE: stage w is then window w (make_stages), so that it leaves once backward is through it.
  if (options_.backward_order && plan::uses_backward_windows(problem))
    stage_windows_ = plan::backward_stage_windows(problem, options_.stage_bytes);
  try {
    if (!error.empty()) {
      // Nothing to solve: the costs failed.
    } else if (local && options_.solver == plan::SolverKind::kMilp) {
      // NOTE: ranks that each solve alone must solve alike: no wall-clock limit in effect
      // (1e7 s; the MILP turns it into a steady_clock deadline, so not infinity), only the
      // node cap; memoized per process (a fake world's ranks, one process, solve once).
      plan::MilpOptions milp = options_.milp;
      milp.time_limit_s = 1e7;
      static plan::PlanCache cache;  // NOTE: in memory; thread-safe
      const plan::Plan solved = cache.get_or_solve(problem, options_.solver, milp);
      DMUON_CHECK(solved.deterministic, "planning owners locally: the MILP stopped on its time limit (",
                  solved.status, "), so ranks that each solve alone could disagree");
      text = finished(solved);
    } else if (local || rank_ == 0) {
      text = finished(plan::solve(problem, options_.solver, options_.milp));
    }
  } catch (const std::exception& e) {
    error = e.what();
  }
  if (!local) text = transport_.broadcast(text, "broadcast of the owner plan");
  plan::Plan solved;
  if (error.empty()) {
    try {
      solved = plan::deserialize_plan(problem, text);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  // NOTE: the problem hash (inside the fingerprint) covers every item's home.
  const uint64_t hash = error.empty() ? with_step_options(plan_fingerprint(solved), options_, wire_dtype_, depth_) : 0;
  agree_plan(hash, error);
  // Owners and batches: the plan's matrices are the items, in order.
  owners_ = solved.owner;
  for (int r = 0; r < world_; ++r) {
    OwnerBatches batches{r, {}};
    for (const plan::Batch& b : solved.ranks[static_cast<size_t>(r)].batches) batches.batches.push_back(b.matrix_idx);
    owner_batches_.push_back(std::move(batches));
    predicted_rank_s_.push_back(solved.ranks[static_cast<size_t>(r)].compute_seconds);
  }
  plan_text_ = text;
  plan_hash_ = hash;
  predicted_makespan_s_ = solved.makespan;
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

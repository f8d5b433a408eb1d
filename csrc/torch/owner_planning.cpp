// dmuon/torch/owner_planning.cpp — problem construction, solving on rank 0, broadcast.
#include "owner_planning.h"

#include <algorithm>
#include <cstring>
#include <iomanip>
#include <sstream>

#include "common/check.h"
#include "plan/cost_model.h"
#include "plan/planner.h"

namespace dmuon::torch_adapter {
namespace {

constexpr double kLocalSolveTimeLimitS = 1e7;

}  // namespace

std::string broadcast_text(const c10::intrusive_ptr<c10d::ProcessGroup>& group, int rank,
                           const std::string& text, const at::Device& device, const std::string& what) {
  if (!group || group->getSize() == 1) return text;
  const at::TensorOptions opts = at::TensorOptions().device(device);
  auto wait = [&](const c10::intrusive_ptr<c10d::Work>& work, const std::string& step) {
    try {
      work->wait();
    } catch (const std::exception& error) {
      DMUON_FAIL(what, ": broadcast of ", step, " failed on rank ", rank, ": ", error.what());
    }
  };
  std::vector<at::Tensor> length{at::tensor({static_cast<int64_t>(text.size())}, opts.dtype(at::kLong))};
  wait(group->broadcast(length), "the plan's length");
  const int64_t num_bytes = length[0].item<int64_t>();
  at::Tensor bytes = at::empty({num_bytes}, at::TensorOptions().dtype(at::kByte));
  if (rank == 0) std::memcpy(bytes.data_ptr<uint8_t>(), text.data(), text.size());
  std::vector<at::Tensor> payload{bytes.to(device)};
  wait(group->broadcast(payload), "the plan");
  at::Tensor host = payload[0].to(at::kCPU);
  return std::string(reinterpret_cast<const char*>(host.data_ptr<uint8_t>()), static_cast<size_t>(num_bytes));
}

plan::Problem build_owner_problem(const OwnerPlanInput& input) {
  DMUON_CHECK(input.names.size() == input.layouts.size() && input.names.size() == input.wire_bytes.size(),
              "plan_owners: ", input.names.size(), " names, ", input.layouts.size(), " layouts, ",
              input.wire_bytes.size(), " wire sizes");
  std::vector<plan::MatrixSpec> matrices;
  for (size_t i = 0; i < input.layouts.size(); ++i) {
    const auto& layout = input.layouts[i];
    // NOTE: the planner rejects empty matrices; a zero-size parameter costs nothing and
    // is planned as a 1x1 matrix so that it still gets an owner. Row blocks of different
    // rows are planned as blocks of the largest (an upper bound of their cost).
    int64_t rows = layout.matrix_rows();
    for (const dist::RowBlock& block : layout.matrix_blocks()) rows = std::max(rows, block.count);
    matrices.push_back({input.names[i], std::max<int64_t>(1, rows),
                        std::max<int64_t>(1, layout.matrix_cols()), std::max<int64_t>(1, layout.num_matrices()),
                        std::max<int64_t>(1, input.wire_bytes[i]), 0});
  }
  plan::ProblemOptions problem_options;
  problem_options.world_size = input.world_size;
  // Costs: measured NS times when given (identical on every rank), else the analytic model.
  const plan::CostFn cost_fn = plan::runtime_cost_fn(input.cost_entries, input.device_type);
  return plan::build_problem(matrices, problem_options, cost_fn);
}

std::string solve_owner_plan(const plan::Problem& problem, const std::string& solver,
                             const std::function<void(const plan::Problem&, plan::Plan&)>& adjust) {
  plan::Plan solved = plan::solve(problem, plan::parse_solver(solver), plan::MilpOptions::from_env());
  if (adjust) adjust(problem, solved);
  return solved.serialize();
}

PlanSource parse_plan_source(const std::string& name) {
  if (name == "broadcast") return PlanSource::kBroadcast;
  if (name == "local") return PlanSource::kLocal;
  DMUON_FAIL("plan_source must be 'broadcast' or 'local', got '", name, "'");
}

std::string solve_owner_plan_locally(const plan::Problem& problem, const std::string& solver,
                                     const std::function<void(const plan::Problem&, plan::Plan&)>& adjust) {
  plan::MilpOptions options = plan::MilpOptions::from_env();
  // NOTE: no wall-clock limit in effect (1e7 s; the MILP turns it into a steady_clock
  // deadline, so not infinity): a limit that fires makes the plan depend on the machine's
  // speed, and ranks that solve alone could disagree. The node cap still bounds the solve.
  options.time_limit_s = kLocalSolveTimeLimitS;
  static plan::PlanCache cache;  // NOTE: in memory; PlanCache is thread-safe
  plan::Plan solved = cache.get_or_solve(problem, plan::parse_solver(solver), options);
  DMUON_CHECK(solved.deterministic, "planning owners locally: the ", solver, " solve stopped on its time limit (",
              solved.status, "), so ranks that each solve alone could disagree");
  if (adjust) adjust(problem, solved);
  return solved.serialize();
}

OwnerPlan plan_owners(const OwnerPlanInput& input, const c10::intrusive_ptr<c10d::ProcessGroup>& group,
                      int rank, const at::Device& device,
                      const std::function<void(const plan::Problem&, plan::Plan&)>& adjust, PlanSource source,
                      bool agree_on_problem) {
  OwnerPlan out{build_owner_problem(input), {}, {}};
  if (agree_on_problem)
    agree_on_hash(group, rank, out.problem.hash, device,
                  "planning owners: the planning problem (parameters, world size, cost table)");
  if (source == PlanSource::kLocal) {
    out.text = solve_owner_plan_locally(out.problem, input.solver, adjust);
  } else {
    const std::string text = rank == 0 ? solve_owner_plan(out.problem, input.solver, adjust) : std::string();
    out.text = broadcast_text(group, rank, text, device, "planning owners");
  }
  out.plan = plan::deserialize_plan(out.problem, out.text);
  return out;
}

void agree_on_hash(const c10::intrusive_ptr<c10d::ProcessGroup>& group, int rank, uint64_t hash,
                   const at::Device& device, const std::string& what) {
  if (!group || group->getSize() == 1) return;
  const int world = group->getSize();
  int64_t mine = 0;
  std::memcpy(&mine, &hash, sizeof(mine));
  std::vector<at::Tensor> input{at::tensor({mine}, at::TensorOptions().dtype(at::kLong)).to(device)};
  std::vector<std::vector<at::Tensor>> output(1);
  for (int r = 0; r < world; ++r) output[0].push_back(at::empty({1}, input[0].options()));
  try {
    group->allgather(output, input)->wait();
  } catch (const std::exception& error) {
    DMUON_FAIL(what, ": all_gather of the ranks' hashes failed on rank ", rank, ": ", error.what());
  }
  std::vector<int64_t> hashes;
  for (const at::Tensor& t : output[0]) hashes.push_back(t.to(at::kCPU).item<int64_t>());
  for (int r = 1; r < world; ++r) {
    if (hashes[static_cast<size_t>(r)] == hashes[0]) continue;
    std::ostringstream message;
    message << what << ": the ranks decided differently: rank " << r << " has hash 0x" << std::hex
            << static_cast<uint64_t>(hashes[static_cast<size_t>(r)]) << ", rank 0 has 0x"
            << static_cast<uint64_t>(hashes[0]) << std::dec << " (this is rank " << rank
            << "; every rank must build the same Muon parameters with the same options and cost table)";
    DMUON_FAIL(message.str());
  }
}

}  // namespace dmuon::torch_adapter

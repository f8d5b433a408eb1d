// dmuon/torch/owner_planning.cpp — problem construction, solving on rank 0, broadcast.
#include "owner_planning.h"

#include <algorithm>
#include <cstring>

#include "common/check.h"
#include "plan/cost_model.h"
#include "plan/planner.h"

namespace dmuon::torch_adapter {

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
                        std::max<int64_t>(1, layout.cols()), std::max<int64_t>(1, layout.num_matrices()),
                        std::max<int64_t>(1, input.wire_bytes[i]), 0});
  }
  plan::ProblemOptions problem_options;
  problem_options.world_size = input.world_size;
  // Costs: measured NS times when given (identical on every rank), else the analytic model.
  plan::CostFn cost_fn;
  if (!input.cost_entries.empty()) {
    plan::CostTable table;
    for (const auto& [rows, cols, count, seconds] : input.cost_entries) table.set(rows, cols, count, seconds);
    cost_fn = table.as_cost_fn();
  } else {
    cost_fn = (input.device_type == "cuda" ? plan::AnalyticCostModel::gpu_default()
                                           : plan::AnalyticCostModel::cpu_default())
                  .as_cost_fn();
  }
  return plan::build_problem(matrices, problem_options, cost_fn);
}

std::string solve_owner_plan(const plan::Problem& problem, const std::string& solver,
                             const std::function<void(const plan::Problem&, plan::Plan&)>& adjust) {
  plan::Plan solved = plan::solve(problem, plan::parse_solver(solver), plan::MilpOptions::from_env());
  if (adjust) adjust(problem, solved);
  return solved.serialize();
}

OwnerPlan plan_owners(const OwnerPlanInput& input, const c10::intrusive_ptr<c10d::ProcessGroup>& group,
                      int rank, const at::Device& device,
                      const std::function<void(const plan::Problem&, plan::Plan&)>& adjust) {
  OwnerPlan out{build_owner_problem(input), {}, {}};
  const std::string text = rank == 0 ? solve_owner_plan(out.problem, input.solver, adjust) : std::string();
  out.text = broadcast_text(group, rank, text, device, "planning owners");
  out.plan = plan::deserialize_plan(out.problem, out.text);
  return out;
}

}  // namespace dmuon::torch_adapter

// dmuon._C.plan: the owner planner (csrc/plan) for Python — the CLI and the runtime's
// Python side build problems, run solvers and read plans through these bindings.
// NOTE: pybind11 and core headers only (no torch), so this file compiles quickly.
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "python/bindings.h"
#include "plan/layer_spread.h"
#include "plan/planner.h"
#include "plan/stage_windows.h"
#include "step/stage_loads.h"

namespace py = pybind11;

namespace dmuon::bindings {

void register_plan_bindings(py::module_& m) {
  using namespace dmuon::plan;
  py::module_ p = m.def_submodule("plan", "owner planner: which rank orthogonalizes which matrix");

  // Inputs.
  py::class_<MatrixSpec>(p, "MatrixSpec")
      .def(py::init([](std::string name, int64_t rows, int64_t cols, int64_t batch, int64_t wire_bytes,
                       int64_t memory_bytes, int home) {
             return MatrixSpec{std::move(name), rows, cols, batch, wire_bytes, memory_bytes, home};
           }),
           py::arg("name"), py::arg("rows"), py::arg("cols"), py::arg("batch") = 1,
           py::arg("wire_bytes") = 0, py::arg("memory_bytes") = 0, py::arg("home") = -1)
      .def_readwrite("name", &MatrixSpec::name)
      .def_readwrite("rows", &MatrixSpec::rows)
      .def_readwrite("cols", &MatrixSpec::cols)
      .def_readwrite("batch", &MatrixSpec::batch)
      .def_readwrite("wire_bytes", &MatrixSpec::wire_bytes)
      .def_readwrite("memory_bytes", &MatrixSpec::memory_bytes)
      .def_readwrite("home", &MatrixSpec::home)
      .def("__repr__", [](const MatrixSpec& s) {
        return "MatrixSpec('" + s.name + "', " + std::to_string(s.rows) + ", " + std::to_string(s.cols) +
               ", batch=" + std::to_string(s.batch) + ")";
      });
  py::class_<ProblemOptions>(p, "ProblemOptions")
      .def(py::init([](int world_size, double bandwidth_bytes_per_s, int64_t memory_cap_bytes, int64_t max_batch) {
             return ProblemOptions{world_size, bandwidth_bytes_per_s, memory_cap_bytes, max_batch};
           }),
           py::kw_only(), py::arg("world_size"), py::arg("bandwidth_bytes_per_s") = 50e9,
           py::arg("memory_cap_bytes") = 0, py::arg("max_batch") = 0)
      .def_readwrite("world_size", &ProblemOptions::world_size)
      .def_readwrite("bandwidth_bytes_per_s", &ProblemOptions::bandwidth_bytes_per_s)
      .def_readwrite("memory_cap_bytes", &ProblemOptions::memory_cap_bytes)
      .def_readwrite("max_batch", &ProblemOptions::max_batch);

  // Cost models.
  p.def(
      "ns_flops",
      [](int64_t rows, int64_t cols, const std::string& algorithm, bool symmetric) {
        return ns_flops(rows, cols, parse_ns_flavor(algorithm), symmetric);
      },
      py::arg("rows"), py::arg("cols"), py::arg("algorithm") = "auto", py::arg("symmetric") = true);
  py::class_<AnalyticCostModel>(p, "AnalyticCostModel")
      .def(py::init([](double flops_per_second, double launch_overhead_s, const std::string& algorithm,
                       bool symmetric) {
             AnalyticCostModel model{flops_per_second, launch_overhead_s, parse_ns_flavor(algorithm), symmetric};
             model.validate();
             return model;
           }),
           py::kw_only(), py::arg("flops_per_second") = 400e12, py::arg("launch_overhead_s") = 20e-6,
           py::arg("algorithm") = "auto", py::arg("symmetric") = true)
      .def_static("gpu_default", &AnalyticCostModel::gpu_default)
      .def_static("cpu_default", &AnalyticCostModel::cpu_default)
      .def_readonly("flops_per_second", &AnalyticCostModel::flops_per_second)
      .def_readonly("launch_overhead_s", &AnalyticCostModel::launch_overhead_s)
      .def_readonly("symmetric", &AnalyticCostModel::symmetric)
      .def("seconds", &AnalyticCostModel::seconds, py::arg("rows"), py::arg("cols"), py::arg("num_matrices"));
  py::class_<CostTable>(p, "CostTable")
      .def(py::init<>())
      .def("set", &CostTable::set, py::arg("rows"), py::arg("cols"), py::arg("num_matrices"), py::arg("seconds"))
      .def("seconds", &CostTable::seconds, py::arg("rows"), py::arg("cols"), py::arg("num_matrices"))
      .def("entries", &CostTable::entries)
      .def("__len__", &CostTable::size);

  // The problem.
  py::class_<ShapeClass>(p, "ShapeClass")
      .def_readonly("rows", &ShapeClass::rows)
      .def_readonly("cols", &ShapeClass::cols)
      .def_readonly("stack", &ShapeClass::stack)
      .def_readonly("wire_bytes", &ShapeClass::wire_bytes)
      .def_readonly("memory_bytes", &ShapeClass::memory_bytes)
      .def_readonly("matrix_idx", &ShapeClass::matrix_idx)
      .def_readonly("recv_seconds", &ShapeClass::recv_seconds)
      .def_readonly("batch_seconds", &ShapeClass::batch_seconds)
      .def_readonly("home_count", &ShapeClass::home_count);
  py::class_<Problem>(p, "Problem")
      .def_readonly("matrices", &Problem::matrices)
      .def_readonly("shapes", &Problem::shapes)
      .def_readonly("options", &Problem::options)
      .def_readonly("hash", &Problem::hash)
      .def_property_readonly("world_size", &Problem::world_size)
      .def("lower_bound", [](const Problem& problem) { return lower_bound(problem); });
  p.def("build_problem",
        [](std::vector<MatrixSpec> matrices, const ProblemOptions& options, const AnalyticCostModel& model) {
          return build_problem(std::move(matrices), options, model.as_cost_fn());
        },
        py::arg("matrices"), py::arg("options"), py::arg("cost"));
  p.def("build_problem",
        [](std::vector<MatrixSpec> matrices, const ProblemOptions& options, const CostTable& table) {
          return build_problem(std::move(matrices), options, table.as_cost_fn());
        },
        py::arg("matrices"), py::arg("options"), py::arg("cost"));
  p.def("build_problem",
        [](std::vector<MatrixSpec> matrices, const ProblemOptions& options,
           const std::function<double(int64_t, int64_t, int64_t)>& cost) {
          return build_problem(std::move(matrices), options, cost);
        },
        py::arg("matrices"), py::arg("options"), py::arg("cost"),
        "cost: AnalyticCostModel, CostTable, or a callable (rows, cols, num_matrices) -> seconds");

  // Solving.
  py::class_<MilpOptions>(p, "MilpOptions")
      .def(py::init([](double time_limit_s, int64_t max_nodes, double stage2_tolerance, double relative_gap) {
             MilpOptions options{time_limit_s, max_nodes, stage2_tolerance, relative_gap};
             options.validate();
             return options;
           }),
           py::kw_only(), py::arg("time_limit_s") = 2.0, py::arg("max_nodes") = 20000,
           py::arg("stage2_tolerance") = 1e-6, py::arg("relative_gap") = 1e-4)
      .def_static("from_env", &MilpOptions::from_env)
      .def_readonly("time_limit_s", &MilpOptions::time_limit_s)
      .def_readonly("max_nodes", &MilpOptions::max_nodes)
      .def_readonly("relative_gap", &MilpOptions::relative_gap);
  py::class_<Batch>(p, "Batch")
      .def_readonly("shape_idx", &Batch::shape_idx)
      .def_readonly("matrix_idx", &Batch::matrix_idx)
      .def_readonly("num_matrices", &Batch::num_matrices)
      .def_readonly("compute_seconds", &Batch::compute_seconds)
      .def_readonly("recv_seconds", &Batch::recv_seconds);
  py::class_<RankPlan>(p, "RankPlan")
      .def_readonly("batches", &RankPlan::batches)
      .def_readonly("compute_seconds", &RankPlan::compute_seconds)
      .def_readonly("recv_seconds", &RankPlan::recv_seconds)
      .def_readonly("load_seconds", &RankPlan::load_seconds)
      .def_readonly("recv_bytes", &RankPlan::recv_bytes)
      .def_readonly("memory_bytes", &RankPlan::memory_bytes);
  py::class_<Plan>(p, "Plan")
      .def_readonly("solver", &Plan::solver)
      .def_readonly("status", &Plan::status)
      .def_readonly("problem_hash", &Plan::problem_hash)
      .def_readonly("owner", &Plan::owner)
      .def_readonly("ranks", &Plan::ranks)
      .def_readonly("makespan", &Plan::makespan)
      .def_readonly("lower_bound", &Plan::lower_bound)
      .def_readonly("solver_bound", &Plan::solver_bound)
      .def_readonly("solve_seconds", &Plan::solve_seconds)
      .def_readonly("deterministic", &Plan::deterministic)
      .def_property_readonly("gap", &Plan::gap)
      .def_property_readonly("imbalance", &Plan::imbalance)
      .def("serialize", &Plan::serialize);
  p.def(
      "solve",
      [](const Problem& problem, const std::string& solver, const MilpOptions& options) {
        const SolverKind kind = parse_solver(solver);
        py::gil_scoped_release release;
        return solve(problem, kind, options);
      },
      py::arg("problem"), py::arg("solver") = "milp", py::arg("milp_options") = MilpOptions{},
      "solver: 'round_robin' | 'lpt' | 'milp'");
  p.def("deserialize_plan", &deserialize_plan, py::arg("problem"), py::arg("text"));

  // Layer spreading (weight-ownership mode): same loads, one layer's matrices on different owners.
  py::class_<LayerSpreadStats>(p, "LayerSpreadStats")
      .def_readonly("num_layers", &LayerSpreadStats::num_layers)
      .def_readonly("worst_layer", &LayerSpreadStats::worst_layer)
      .def_readonly("max_matrices_per_owner", &LayerSpreadStats::max_matrices_per_owner)
      .def_readonly("max_collisions", &LayerSpreadStats::max_collisions)
      .def_readonly("total_collisions", &LayerSpreadStats::total_collisions)
      .def_readonly("max_bytes_per_owner", &LayerSpreadStats::max_bytes_per_owner)
      .def_readonly("matrices_bound", &LayerSpreadStats::matrices_bound)
      .def_readonly("collisions_bound", &LayerSpreadStats::collisions_bound)
      .def_readonly("bytes_bound", &LayerSpreadStats::bytes_bound)
      .def_readonly("matrices_bound_for_counts", &LayerSpreadStats::matrices_bound_for_counts)
      .def_readonly("bytes_bound_for_counts", &LayerSpreadStats::bytes_bound_for_counts);
  p.def(
      "spread_layers",
      [](const Problem& problem, const std::vector<int>& layer_of, Plan plan) {
        py::gil_scoped_release release;
        spread_layers(problem, layer_of, plan);
        return plan;
      },
      py::arg("problem"), py::arg("layer_of"), py::arg("plan"),
      "a copy of plan with each layer's matrices spread over owners (layer_of[i]: layer id, -1: none); "
      "loads, batch sizes and makespan unchanged");
  p.def("layer_spread_stats", &layer_spread_stats, py::arg("problem"), py::arg("layer_of"), py::arg("plan"));

  // Stage spreading (a step begun from backward): backward windows spread, their stages measured.
  p.def(
      "spread_backward_stages",
      [](const Problem& problem, const std::vector<int>& group_of, Plan plan) {
        py::gil_scoped_release release;
        spread_backward_stages(problem, group_of, plan);
        return plan;
      },
      py::arg("problem"), py::arg("group_of"), py::arg("plan"),
      "a copy of plan with each backward window spread over owners, as the step engine plans a step "
      "begun from backward; loads, batch sizes and makespan unchanged");
  py::class_<step::StageLoad>(p, "StageLoad")
      .def_readonly("first_matrix", &step::StageLoad::first_matrix)
      .def_readonly("last_matrix", &step::StageLoad::last_matrix)
      .def_readonly("num_matrices", &step::StageLoad::num_matrices)
      .def_readonly("wire_bytes", &step::StageLoad::wire_bytes)
      .def_readonly("rank_seconds", &step::StageLoad::rank_seconds)
      .def_readonly("max_seconds", &step::StageLoad::max_seconds)
      .def_readonly("mean_seconds", &step::StageLoad::mean_seconds);
  p.def("plan_stage_loads", &step::plan_stage_loads, py::arg("problem"), py::arg("plan"), py::arg("stage_bytes"),
        py::arg("wire_element_bytes") = 2, py::arg("backward_order") = true, py::arg("windowed") = true,
        py::arg("group_of") = std::vector<int>{},
        "the engine's stages of plan and each rank's NS seconds in them (step/stage_loads.h)");
  py::class_<PlanCache>(p, "PlanCache")
      .def(py::init<std::string>(), py::arg("directory") = "")
      .def(
          "get_or_solve",
          [](PlanCache& cache, const Problem& problem, const std::string& solver, const MilpOptions& options) {
            const SolverKind kind = parse_solver(solver);
            py::gil_scoped_release release;
            return cache.get_or_solve(problem, kind, options);
          },
          py::arg("problem"), py::arg("solver") = "milp", py::arg("milp_options") = MilpOptions{})
      .def_property_readonly("num_hits", &PlanCache::num_hits)
      .def_property_readonly("num_misses", &PlanCache::num_misses);
}

}  // namespace dmuon::bindings

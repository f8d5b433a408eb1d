// dmuon._C core bindings: the default coefficient schedules, so Python shows users the
// exact numbers the core will use; the floor of the fused step (ns/ns_bound.h) for the
// benchmarks.
#include <pybind11/stl.h>

#include <optional>
#include <tuple>
#include <vector>

#include "python/bindings.h"
#include "common/check.h"
#include "common/env.h"
#include "ns/ns_bound.h"
#include "ns/schedule.h"
#include "torch/option_choices.h"
#include "optim/qk_clip.h"

namespace py = pybind11;

namespace dmuon::bindings {
namespace {

py::dict step_bound_dict(const ns::StepBound& b) {
  py::dict out;
  out["seconds"] = b.seconds();
  out["ns_seconds"] = b.ns_seconds;
  out["sym_seconds"] = b.sym_seconds;
  out["dense_seconds"] = b.dense_seconds;
  out["elementwise_seconds"] = b.elementwise_seconds;
  out["passes_seconds"] = b.passes_seconds;
  out["ns_flops"] = b.ns_flops;
  out["ns_bytes"] = b.ns_bytes;
  out["pass_bytes"] = b.pass_bytes;
  return out;
}

std::vector<ns::NsBatch> to_batches(const std::vector<std::tuple<int64_t, int64_t, int64_t>>& batches) {
  std::vector<ns::NsBatch> out;
  for (const auto& [count, rows, cols] : batches) out.push_back({count, rows, cols});
  return out;
}

}  // namespace

void register_core_bindings(py::module_& m) {
  py::register_exception<dmuon::Error>(m, "DMuonError", PyExc_RuntimeError);
  py::class_<ns::Schedule>(m, "NsSchedule", "A validated Newton-Schulz schedule (ns/schedule.h)")
      .def_property_readonly("algorithm", [](const ns::Schedule& s) { return ns::algorithm_name(s.algorithm); })
      .def_property_readonly("coefficients",
                             [](const ns::Schedule& s) {
                               std::vector<std::tuple<double, double, double>> steps;
                               for (const auto& c : s.steps) steps.emplace_back(c.a, c.b, c.c);
                               return steps;
                             })
      .def_readonly("restart_after", &ns::Schedule::restart_after)
      .def_readonly("eps", &ns::Schedule::eps)
      .def("__repr__", [](const ns::Schedule& s) {
        return "NsSchedule(" + std::string(ns::algorithm_name(s.algorithm)) + ", " + std::to_string(s.steps.size()) +
               " steps, restarts " + std::to_string(s.restart_after.size()) + ")";
      });
  m.def(
      "ns_schedule",
      [](const py::object& algorithm, int num_steps,
         std::optional<std::vector<std::tuple<double, double, double>>> coefficients,
         std::optional<std::vector<int>> restart_after, double eps) {
        DMUON_CHECK(num_steps >= 1, "ns_steps must be at least 1, got ", num_steps);
        ns::Schedule schedule =
            ns::default_schedule(torch_adapter::choice<ns::Algorithm, ns::parse_algorithm>(algorithm), num_steps, eps);
        if (coefficients) {
          DMUON_CHECK(static_cast<int>(coefficients->size()) == num_steps, "ns_coefficients must hold ns_steps=",
                      num_steps, " (a, b, c) triples, got ", coefficients->size());
          schedule.steps.clear();
          for (const auto& [a, b, c] : *coefficients) schedule.steps.push_back({a, b, c});
        }
        if (restart_after) schedule.restart_after = *restart_after;
        schedule.validate();
        return schedule;
      },
      py::arg("algorithm"), py::arg("num_steps"), py::arg("coefficients") = py::none(),
      py::arg("restart_after") = py::none(), py::arg("eps") = 1e-7,
      "The schedule of one param group, built and validated once: the algorithm's default "
      "coefficients and restarts, each replaced where given");
  m.def(
      "env_knobs",
      []() {
        py::list out;
        for (const auto& k : env::all_knobs()) {
          py::dict d;
          d["name"] = k.name, d["type"] = k.type, d["fallback"] = k.fallback, d["kind"] = k.kind;
          d["what"] = k.what, d["value"] = k.value;
          out.append(d);
        }
        return out;
      },
      "Every DMUON_* environment knob (common/env.h): name, type, fallback, kind (cache | diagnostic | "
      "override), what it does, and its value now ('' when unset)");
  m.def(
      "default_schedule",
      [](const std::string& algorithm, int num_steps) {
        const auto schedule = ns::default_schedule(ns::parse_algorithm(algorithm), num_steps, 1e-7);
        std::vector<std::tuple<double, double, double>> steps;
        for (const auto& c : schedule.steps) steps.emplace_back(c.a, c.b, c.c);
        return py::make_tuple(steps, schedule.restart_after);
      },
      py::arg("algorithm"), py::arg("num_steps"),
      "([(a, b, c) per step], [restart iterations]) of the algorithm's default schedule");
  m.def(
      "fused_step_bound",
      [](const std::vector<std::pair<int64_t, int64_t>>& shapes, const std::string& algorithm, int num_steps,
         double flops_per_second, double bytes_per_second) {
        const auto schedule = ns::default_schedule(ns::parse_algorithm(algorithm), num_steps, 1e-7);
        return step_bound_dict(ns::fused_step_bound(shapes, schedule, flops_per_second, bytes_per_second));
      },
      py::arg("shapes"), py::arg("algorithm"), py::arg("num_steps"), py::arg("flops_per_second"),
      py::arg("bytes_per_second"),
      "The floor of the fused single-GPU step over (rows, cols) Muon matrices with the default schedule "
      "of `algorithm`: each Newton-Schulz kernel at the larger of its FLOPs at flops_per_second and its "
      "bytes at bytes_per_second, one after another, plus the memory passes (ns/ns_bound.h)");
  m.def(
      "step_products",
      [](const std::vector<std::tuple<int64_t, int64_t, int64_t>>& batches, const std::string& algorithm,
         int num_steps) {
        const auto schedule = ns::default_schedule(ns::parse_algorithm(algorithm), num_steps, 1e-7);
        py::list out;
        for (const ns::ProductShape& p : ns::step_products(to_batches(batches), schedule)) {
          py::dict d;
          d["kind"] = p.kind == ns::KernelKind::kSymmetric ? "symmetric" : "dense";
          d["batch"] = p.batch, d["m"] = p.m, d["n"] = p.n, d["k"] = p.k;
          d["with_c"] = p.with_c, d["same_operands"] = p.same_operands;
          out.append(d);
        }
        return out;
      },
      py::arg("batches"), py::arg("algorithm"), py::arg("num_steps"),
      "The distinct products (dicts: kind, batch, m, n, k, with_c, same_operands) of every iteration the "
      "CUDA backend may run on (count, rows, cols) batches with the default schedule of `algorithm`");
  m.def(
      "measured_step_bound",
      [](const std::vector<std::tuple<int64_t, int64_t, int64_t>>& batches, const std::string& algorithm,
         int num_steps, const std::vector<double>& dense_seconds, double bytes_per_second) {
        const auto schedule = ns::default_schedule(ns::parse_algorithm(algorithm), num_steps, 1e-7);
        return step_bound_dict(
            ns::measured_step_bound(to_batches(batches), schedule, dense_seconds, bytes_per_second));
      },
      py::arg("batches"), py::arg("algorithm"), py::arg("num_steps"), py::arg("dense_seconds"),
      py::arg("bytes_per_second"),
      "The floor of the fused step with each product of step_products(batches, …) at its measured dense "
      "GEMM time (dense_seconds, in that order; symmetric products at half of it), add_identity and the "
      "memory passes at bytes_per_second (ns/ns_bound.h)");
  m.def(
      "qk_clip_factors",
      [](const std::vector<double>& max_logits, int64_t num_kv_heads, double tau) {
        const optim::QkClipFactors f = optim::qk_clip_factors(max_logits, num_kv_heads, tau);
        return std::make_tuple(f.q, f.k);
      },
      py::arg("max_logits"), py::arg("num_kv_heads"), py::arg("tau"),
      "MuonClip's (q factors per q head, k factors per kv head) of one layer (optim/qk_clip.h)");
  m.def("qk_clip_row_factors", &optim::qk_clip_row_factors, py::arg("head_factors"), py::arg("head_dim"),
        py::arg("row_begin"), py::arg("row_count"),
        "One factor per row of rows [row_begin, row_begin + row_count) of a [heads·head_dim, cols] weight");
}

}  // namespace dmuon::bindings

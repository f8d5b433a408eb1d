// dmuon._C.engine's options: the enums of every option that names a choice, a Muon group's
// rule (GroupRule), the runtime's options (RuntimeOptions, the engine's EngineOptions in it)
// and the caller's checks of a step (StepChecks); and the runtime's statistics
// (dmuon._C.dist.StepStats). Strings are parsed here,
// once, with errors that name the option. The runtime itself: csrc/torch/engine.
#include <pybind11/stl.h>

#include <array>
#include <initializer_list>
#include <utility>

#include "python/bindings.h"
#include "common/check.h"
#include "ns/schedule.h"
#include "optim/update_rule.h"
#include "plan/solvers.h"
#include "step/options.h"
#include "step/runtime_options.h"
#include "step/start_agreement.h"
#include "step/stats.h"

namespace py = pybind11;

namespace dmuon::bindings {
namespace {

// "auto" | "broadcast" (rank 0 plans where the transport moves data) | "local" (every rank
// plans): whether every rank plans itself.
bool parse_plan_locally(const std::string& name) {
  DMUON_CHECK(name == "auto" || name == "broadcast" || name == "local",
              "plan_source must be 'auto', 'broadcast' or 'local', got '", name, "'");
  return name == "local";
}

// An option's enum under `name`: its values under their Python spellings, and made from
// one of them (E("owner")) through `Parse`.
template <typename E, E (*Parse)(const std::string&)>
void bind_choice(py::module_& m, const char* name, std::initializer_list<std::pair<const char*, E>> values) {
  py::enum_<E> e(m, name);
  for (const auto& [spelling, value] : values) e.value(spelling, value);
  e.def(py::init([](const std::string& spelling) { return Parse(spelling); }), py::arg("name"));
}

// Stage phase times as (prepare, ns, return_pack, apply) tuples.
std::vector<std::array<double, sim::kNumPhases>> phase_tuples(const std::vector<sim::BucketTimes>& times) {
  std::vector<std::array<double, sim::kNumPhases>> out;
  for (const auto& t : times) out.push_back(t.seconds);
  return out;
}

}  // namespace

void register_runtime_bindings(py::module_& m) {
  using step::DeviceKind, step::Mode, step::WireDType, plan::SolverKind, optim::AdjustLr, ns::Algorithm;
  using step::CostModel, step::RuntimeOptions, step::RuntimeStats;
  py::module_ e = m.def_submodule("engine", "the step engine's torch adapter");
  bind_choice<Mode, step::parse_mode>(e, "Mode", {{"owner", Mode::kOwner}, {"gather", Mode::kGather}});
  bind_choice<WireDType, step::parse_wire_dtype>(e, "WireDType",
                                                 {{"auto", WireDType::kAuto},
                                                  {"float32", WireDType::kFloat32},
                                                  {"bfloat16", WireDType::kBFloat16},
                                                  {"float16", WireDType::kFloat16}});
  bind_choice<SolverKind, plan::parse_solver>(
      e, "Solver", {{"round_robin", SolverKind::kRoundRobin}, {"lpt", SolverKind::kLpt}, {"milp", SolverKind::kMilp}});
  bind_choice<DeviceKind, step::parse_device_kind>(e, "DeviceKind",
                                                   {{"cpu", DeviceKind::kCpu}, {"cuda", DeviceKind::kCuda}});
  bind_choice<AdjustLr, optim::parse_adjust_lr>(e, "AdjustLr",
                                                {{"none", AdjustLr::kNone},
                                                 {"original", AdjustLr::kOriginal},
                                                 {"match_rms_adamw", AdjustLr::kMatchRmsAdamW},
                                                 {"spectral", AdjustLr::kSpectral}});
  bind_choice<Algorithm, ns::parse_algorithm>(e, "NsAlgorithm",
                                              {{"gram", Algorithm::kGram}, {"standard", Algorithm::kStandard}});
  bind_choice<CostModel, step::parse_cost_model>(
      e, "CostModel",
      {{"auto", CostModel::kAuto}, {"analytic", CostModel::kAnalytic}, {"profile", CostModel::kProfile}});

  // NOTE: the range checks of lr, weight_decay and momentum run in the step (their error
  // joins the start agreement, so that every rank raises); adjust_lr and NorMuon's
  // options are checked here.
  py::class_<step::GroupRule>(e, "GroupRule", "the update rule of one Muon param group (step/options.h)")
      .def(py::init([](double lr, double weight_decay, double momentum, bool nesterov, const py::object& adjust_lr,
                       ns::Schedule schedule, bool normuon, double normuon_beta2, double normuon_eps) {
             step::GroupRule rule;
             rule.lr = lr, rule.weight_decay = weight_decay, rule.momentum = momentum, rule.nesterov = nesterov;
             rule.adjust_lr = choice<AdjustLr, optim::parse_adjust_lr>(adjust_lr);
             rule.schedule = std::move(schedule);
             rule.normuon = {normuon, normuon_beta2, normuon_eps};
             if (normuon) rule.normuon.validate();  // names normuon_beta2 / normuon_eps
             return rule;
           }),
           py::arg("lr"), py::arg("weight_decay"), py::arg("momentum"), py::arg("nesterov"), py::arg("adjust_lr"),
           py::arg("schedule"), py::arg("normuon") = false, py::arg("normuon_beta2") = 0.95,
           py::arg("normuon_eps") = 1e-8)
      .def_readonly("lr", &step::GroupRule::lr)
      .def_readonly("weight_decay", &step::GroupRule::weight_decay)
      .def_readonly("momentum", &step::GroupRule::momentum)
      .def_readonly("nesterov", &step::GroupRule::nesterov)
      .def_readonly("adjust_lr", &step::GroupRule::adjust_lr)
      .def_readonly("schedule", &step::GroupRule::schedule);

  py::class_<step::EngineOptions>(e, "EngineOptions", "how the step engine runs (step/options.h), as given")
      .def_readonly("mode", &step::EngineOptions::mode)
      .def_readonly("wire_dtype", &step::EngineOptions::wire_dtype)
      .def_readonly("stage_bytes", &step::EngineOptions::stage_bytes)
      .def_readonly("solver", &step::EngineOptions::solver)
      .def_readonly("backward_order", &step::EngineOptions::backward_order)
      .def_readonly("plan_locally", &step::EngineOptions::plan_locally);

  py::class_<RuntimeOptions>(e, "RuntimeOptions", "how the step runtime runs (step/runtime_options.h)")
      .def(py::init([](const py::object& mode, int64_t bucket_bytes, const py::object& wire_dtype,
                       const py::object& solver, const py::object& device_type, bool profile,
                       const py::object& cost_model, std::vector<ns::Schedule> cost_schedules,
                       std::optional<int64_t> fused_streams, const std::string& plan_source, bool record_timeline,
                       std::optional<int64_t> pipeline_depth, std::optional<int64_t> ns_batch_mb,
                       std::optional<bool> cuda_graphs, bool backward_order, std::vector<int> backward_groups) {
             RuntimeOptions o;
             o.engine.mode = choice<Mode, step::parse_mode>(mode);
             o.engine.stage_bytes = bucket_bytes;
             o.engine.wire_dtype = choice<WireDType, step::parse_wire_dtype>(wire_dtype);
             o.engine.solver = choice<SolverKind, plan::parse_solver>(solver);
             o.engine.plan_locally = parse_plan_locally(plan_source);
             o.engine.backward_order = backward_order;
             o.engine.backward_groups = std::move(backward_groups);
             o.engine.cost.schedules = std::move(cost_schedules);
             o.device = choice<DeviceKind, step::parse_device_kind>(device_type);
             o.profile = profile;
             o.cost_model = choice<CostModel, step::parse_cost_model>(cost_model);
             o.record_timeline = record_timeline;
             o.fused_streams = fused_streams;
             o.pipeline_depth = pipeline_depth;
             o.ns_batch_mb = ns_batch_mb;
             o.cuda_graphs = cuda_graphs;
             return o;
           }),
           py::arg("mode") = "owner", py::arg("bucket_bytes") = int64_t{64} << 20, py::arg("wire_dtype") = "auto",
           py::arg("solver") = "milp", py::arg("device_type") = "cpu", py::arg("profile") = false,
           py::arg("cost_model") = "analytic", py::arg("cost_schedules") = std::vector<ns::Schedule>{},
           py::arg("fused_streams") = py::none(), py::arg("plan_source") = "auto", py::arg("record_timeline") = false,
           py::arg("pipeline_depth") = py::none(), py::arg("ns_batch_mb") = py::none(),
           py::arg("cuda_graphs") = py::none(), py::arg("backward_order") = false,
           py::arg("backward_groups") = std::vector<int>{})
      .def_readonly("engine", &RuntimeOptions::engine)
      .def_readonly("device", &RuntimeOptions::device)
      .def_property_readonly("device_type",
                             [](const RuntimeOptions& o) { return o.device == DeviceKind::kCuda ? "cuda" : "cpu"; })
      .def_readonly("cost_model", &RuntimeOptions::cost_model)
      .def_readonly("profile", &RuntimeOptions::profile)
      .def_readonly("record_timeline", &RuntimeOptions::record_timeline)
      .def_property_readonly("backward_order", [](const RuntimeOptions& o) { return o.engine.backward_order; });

  py::class_<step::StartChecks>(e, "StepChecks",
                                "what the caller checked before a step, agreed in its start agreement "
                                "(step/start_agreement.h)")
      .def(py::init([](int64_t signature, std::string error, std::vector<std::string> describe) {
             return step::StartChecks{static_cast<uint64_t>(signature), std::move(error), std::move(describe)};
           }),
           py::arg("signature") = 0, py::arg("error") = "", py::arg("describe") = std::vector<std::string>{})
      .def_readwrite("signature", &step::StartChecks::signature)
      .def_readwrite("error", &step::StartChecks::error)
      .def_readwrite("describe", &step::StartChecks::describe);

  py::module_ d = m.attr("dist");  // NOTE: made by register_layout_bindings
  // NOTE: read on demand (EngineRuntime.stage_stats), not copied into every step's stats.
  py::class_<step::StageTimeline>(d, "StageStats",
                                  "one stage of the last step on this rank: phase seconds (synchronized with "
                                  "profile, device time with record_timeline) and bytes per peer")
      .def_readonly("num_batches", &step::StageTimeline::num_batches)
      .def_readonly("num_items", &step::StageTimeline::num_items)
      .def_readonly("prepare_s", &step::StageTimeline::prepare_s)
      .def_readonly("forward_wait_s", &step::StageTimeline::forward_wait_s)
      .def_readonly("ns_s", &step::StageTimeline::ns_s)
      .def_readonly("return_wait_s", &step::StageTimeline::return_wait_s)
      .def_readonly("apply_s", &step::StageTimeline::apply_s)
      .def_readonly("forward_sent_to", &step::StageTimeline::forward_sent_to)
      .def_readonly("forward_received_from", &step::StageTimeline::forward_received_from)
      .def_readonly("return_sent_to", &step::StageTimeline::return_sent_to)
      .def_readonly("return_received_from", &step::StageTimeline::return_received_from);
  py::class_<RuntimeStats>(d, "StepStats")
      .def_readonly("momentum_s", &RuntimeStats::momentum_s)
      .def_readonly("pack_s", &RuntimeStats::pack_s)
      .def_readonly("comm_wait_s", &RuntimeStats::comm_wait_s)
      .def_readonly("ns_s", &RuntimeStats::ns_s)
      .def_readonly("early_stages", &RuntimeStats::early_stages)
      .def_readonly("early_orthogonalized", &RuntimeStats::early_orthogonalized)
      .def_readonly("early_ns_s", &RuntimeStats::early_ns_s)
      .def_readonly("early_fill_s", &RuntimeStats::early_fill_s)
      .def_readonly("begun_stale", &RuntimeStats::begun_stale)
      .def_readonly("apply_s", &RuntimeStats::apply_s)
      .def_readonly("total_s", &RuntimeStats::total_s)
      .def_readonly("bytes_sent", &RuntimeStats::bytes_sent)
      .def_readonly("bytes_received", &RuntimeStats::bytes_received)
      .def_readonly("num_buckets", &RuntimeStats::num_buckets)
      .def_readonly("num_orthogonalized", &RuntimeStats::num_orthogonalized)
      .def_readonly("num_fused", &RuntimeStats::num_fused)
      .def_property_readonly("num_fused_batches", [](const RuntimeStats& s) { return s.fused_batches.size(); })
      .def_readonly("num_fused_streams", &RuntimeStats::num_fused_streams)
      .def_readonly("fused_batches", &RuntimeStats::fused_batches)
      .def_readonly("pipeline_depth", &RuntimeStats::pipeline_depth)
      .def_readonly("orthogonalized", &RuntimeStats::orthogonalized)
      .def_property_readonly("bucket_times", [](const RuntimeStats& s) { return phase_tuples(s.bucket_times); })
      .def_readonly("model_fill_s", &RuntimeStats::model_fill_s);
}

}  // namespace dmuon::bindings

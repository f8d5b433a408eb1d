// dmuon._C.sim: the projection of a step at any world size (csrc/sim) for the benchmarks.
// NOTE: pybind11 and core headers only (no torch), like every file here.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <map>

#include "python/bindings.h"
#include "common/check.h"
#include "plan/cost_model.h"
#include "sim/collective_cost.h"
#include "sim/pipeline.h"
#include "sim/rank_prediction.h"
#include "sim/stage_layout.h"
#include "sim/traffic.h"

namespace py = pybind11;

namespace dmuon::bindings {
namespace {

using PhaseTuple = std::array<double, sim::kNumPhases>;

sim::RankTimeline timeline_of(const std::vector<PhaseTuple>& tuples) {
  sim::RankTimeline timeline;
  for (const auto& t : tuples) timeline.push_back(sim::BucketTimes{t});
  return timeline;
}

sim::RingKind parse_ring_kind(const std::string& name) {
  if (name == "all_gather") return sim::RingKind::kAllGather;
  if (name == "reduce_scatter") return sim::RingKind::kReduceScatter;
  if (name == "all_reduce") return sim::RingKind::kAllReduce;
  DMUON_FAIL("kind must be 'all_gather', 'reduce_scatter' or 'all_reduce', got '", name, "'");
}

// What project_step returns: the projection and every rank's timeline it ran on.
struct StepProjection {
  sim::Projection projection;
  std::vector<std::vector<PhaseTuple>> timelines;  // [rank][stage]
  std::vector<bool> measured;                      // [rank]
  sim::Calibration calibration;
  size_t num_collectives = 0;
};

std::vector<sim::RankTraffic> rank_traffic(const sim::StageLayout& layout, const sim::Topology& topology) {
  const sim::StepTraffic traffic = sim::step_traffic(layout, topology);
  std::vector<sim::RankTraffic> out;
  for (int r = 0; r < layout.world_size; ++r) out.push_back(traffic.total(r));
  return out;
}

// The projection of the engine's stages: measured timelines, the other ranks predicted,
// every rank simulated through the pipeline with the layout's agreements.
StepProjection project(const sim::StageLayout& layout, const sim::Topology& topology,
                       const std::map<int, std::vector<PhaseTuple>>& measured,
                       const std::vector<std::tuple<int64_t, int64_t, int64_t, double>>& cost_entries,
                       const std::string& device_type, size_t depth) {
  std::vector<std::pair<int, sim::RankTimeline>> known;
  for (const auto& [rank, tuples] : measured) known.emplace_back(rank, timeline_of(tuples));
  const plan::CostFn cost = plan::runtime_cost_fn(cost_entries, device_type);
  py::gil_scoped_release release;
  StepProjection out;
  out.calibration = sim::calibrate(layout, known, cost);
  const std::vector<sim::RankTimeline> timelines = sim::complete_timelines(layout, known, cost);
  const sim::StepTraffic traffic = sim::step_traffic(layout, topology);
  const sim::Program program = sim::stage_pipeline_program(
      traffic, topology, depth, sim::ring_seconds(sim::RingKind::kAllReduce, layout.agreement_bytes, topology));
  out.projection = sim::simulate(program, timelines);
  out.num_collectives = program.collective_seconds.size();
  out.measured.assign(static_cast<size_t>(layout.world_size), false);
  for (const auto& [rank, timeline] : known) out.measured[static_cast<size_t>(rank)] = true;
  for (const auto& timeline : timelines) {
    std::vector<PhaseTuple> tuples;
    for (const auto& t : timeline) tuples.push_back(t.seconds);
    out.timelines.push_back(std::move(tuples));
  }
  return out;
}

}  // namespace

void register_sim_bindings(py::module_& m) {
  py::module_ s = m.def_submodule("sim", "the step of one rank projected onto a cluster topology");

  py::class_<sim::Topology>(s, "Topology")
      .def(py::init([](std::vector<int> node_of, double intra_bytes_per_s, double inter_bytes_per_s,
                       double intra_latency_s, double inter_latency_s) {
             return sim::Topology(std::move(node_of), {intra_bytes_per_s, intra_latency_s},
                                  {inter_bytes_per_s, inter_latency_s});
           }),
           py::arg("node_of"), py::kw_only(), py::arg("intra_bytes_per_s"), py::arg("inter_bytes_per_s"),
           py::arg("intra_latency_s"), py::arg("inter_latency_s"))
      .def_static(
          "two_level",
          [](int world_size, int gpus_per_node, double intra_bytes_per_s, double inter_bytes_per_s,
             double intra_latency_s, double inter_latency_s, int first_global_rank, int stride) {
            return sim::Topology::two_level(world_size, gpus_per_node, {intra_bytes_per_s, intra_latency_s},
                                            {inter_bytes_per_s, inter_latency_s}, first_global_rank, stride);
          },
          py::arg("world_size"), py::arg("gpus_per_node"), py::kw_only(), py::arg("intra_bytes_per_s"),
          py::arg("inter_bytes_per_s"), py::arg("intra_latency_s"), py::arg("inter_latency_s"),
          py::arg("first_global_rank") = 0, py::arg("stride") = 1)
      .def_property_readonly("world_size", &sim::Topology::world_size)
      .def_property_readonly("spans_nodes", &sim::Topology::spans_nodes)
      .def("node_of", &sim::Topology::node_of, py::arg("rank"));

  py::class_<sim::NsBatchShape>(s, "NsBatchShape")
      .def_readonly("rows", &sim::NsBatchShape::rows)
      .def_readonly("cols", &sim::NsBatchShape::cols)
      .def_readonly("count", &sim::NsBatchShape::count);
  py::class_<sim::RankStageWork>(s, "RankStageWork")
      .def_readonly("prepare_elements", &sim::RankStageWork::prepare_elements)
      .def_readonly("ns_batches", &sim::RankStageWork::ns_batches)
      .def_readonly("apply_elements", &sim::RankStageWork::apply_elements);
  py::class_<sim::StageLayout>(s, "StageLayout")
      .def_readonly("world_size", &sim::StageLayout::world_size)
      .def_readonly("agreement_bytes", &sim::StageLayout::agreement_bytes,
                    "bytes of the engine's start-of-step agreement (its one all_reduce; 0: none)")
      .def_property_readonly("num_stages", &sim::StageLayout::num_stages)
      .def_property_readonly("forward_issued",
                             [](const sim::StageLayout& l) {
                               std::vector<bool> out;
                               for (const auto& e : l.forward) out.push_back(e.issued);
                               return out;
                             })
      .def_property_readonly("forward_bytes",
                             [](const sim::StageLayout& l) {
                               std::vector<std::vector<int64_t>> out;
                               for (const auto& e : l.forward) out.push_back(e.bytes);
                               return out;
                             },
                             "[stage][src * world + dst] bytes of each stage's forward exchange")
      .def_property_readonly("return_bytes",
                             [](const sim::StageLayout& l) {
                               std::vector<std::vector<int64_t>> out;
                               for (const auto& e : l.back) out.push_back(e.bytes);
                               return out;
                             },
                             "[stage][src * world + dst] bytes of each stage's return exchange")
      .def_readonly("work", &sim::StageLayout::work, "[stage][rank] RankStageWork")
      .def("from_stage", &sim::StageLayout::from_stage, py::arg("first"),
           "stages [first, num_stages) alone (what runs at step() after `first` stages left inside backward)");

  py::class_<sim::RankTraffic>(s, "RankTraffic")
      .def_readonly("send_intra", &sim::RankTraffic::send_intra)
      .def_readonly("send_inter", &sim::RankTraffic::send_inter)
      .def_readonly("recv_intra", &sim::RankTraffic::recv_intra)
      .def_readonly("recv_inter", &sim::RankTraffic::recv_inter)
      .def_property_readonly("sent", &sim::RankTraffic::sent)
      .def_property_readonly("received", &sim::RankTraffic::received);
  s.def("rank_traffic", &rank_traffic, py::arg("layout"), py::arg("topology"),
        "every rank's bytes over the step, by link (its own pieces excluded)");
  s.def(
      "exchange_seconds",
      [](const sim::StageLayout& layout, const sim::Topology& topology) {
        const sim::StepTraffic traffic = sim::step_traffic(layout, topology);
        std::vector<std::pair<double, double>> out;
        for (size_t k = 0; k < traffic.forward.size(); ++k)
          out.emplace_back(sim::all_to_all_seconds(traffic.forward[k], topology),
                           sim::all_to_all_seconds(traffic.back[k], topology));
        return out;
      },
      py::arg("layout"), py::arg("topology"),
      "modelled seconds of each stage's (forward, return) all_to_all on `topology` (0 when not issued)");
  s.def(
      "ring_seconds",
      [](const std::string& kind, int64_t bytes, const sim::Topology& group) {
        return sim::ring_seconds(parse_ring_kind(kind), bytes, group);
      },
      py::arg("kind"), py::arg("bytes"), py::arg("group"),
      "modelled seconds of an all_gather | reduce_scatter | all_reduce of `bytes` (the full buffer) over `group`");

  py::class_<sim::RankProjection>(s, "RankProjection")
      .def_readonly("end_s", &sim::RankProjection::end_s)
      .def_readonly("compute_s", &sim::RankProjection::compute_s)
      .def_readonly("wait_s", &sim::RankProjection::wait_s);
  py::class_<sim::PhaseFit>(s, "PhaseFit")
      .def_readonly("fixed_s", &sim::PhaseFit::fixed_s)
      .def_readonly("rate", &sim::PhaseFit::rate)
      .def_readonly("idle_s", &sim::PhaseFit::idle_s);
  py::class_<StepProjection>(s, "StepProjection")
      .def_property_readonly("ranks", [](const StepProjection& p) { return p.projection.ranks; })
      .def_property_readonly("step_s", [](const StepProjection& p) { return p.projection.step_s; })
      .def_property_readonly("slowest_rank", [](const StepProjection& p) { return p.projection.slowest_rank; })
      .def_readonly("timelines", &StepProjection::timelines)
      .def_readonly("measured", &StepProjection::measured)
      .def_readonly("num_collectives", &StepProjection::num_collectives)
      .def_property_readonly("calibration", [](const StepProjection& p) {
        std::map<std::string, sim::PhaseFit> out;
        for (size_t k = 0; k < sim::kNumPhases; ++k)
          out[sim::phase_name(static_cast<sim::Phase>(k))] = p.calibration.phases[k];
        return out;
      });
  s.def("project_step", &project, py::arg("layout"), py::arg("topology"), py::arg("measured"),
        py::arg("cost_entries"), py::arg("device_type"), py::arg("depth"),
        "the step on every rank of `topology`: measured timelines {rank: [(prepare, ns, return_pack, apply) per "
        "stage]}, the other ranks predicted from them (sim/rank_prediction.h), simulated through the engine's "
        "pipeline of depth `depth` with the layout's agreements (sim/pipeline.h)");
}

}  // namespace dmuon::bindings

// dmuon/step/options.cpp — parsing and validation of the engine's options.
#include "step/options.h"

#include <cmath>

#include "common/check.h"

namespace dmuon::step {

void GroupRule::validate() const {
  DMUON_CHECK(std::isfinite(lr) && lr >= 0.0, "lr must be a finite number >= 0, got ", lr);
  DMUON_CHECK(std::isfinite(weight_decay) && weight_decay >= 0.0, "weight_decay must be a finite number >= 0, got ",
              weight_decay);
  DMUON_CHECK(momentum >= 0.0 && momentum < 1.0, "momentum must be in [0, 1), got ", momentum);
  schedule.validate();
  if (normuon.enabled) normuon.validate();
}

Mode parse_mode(const std::string& name) {
  if (name == "owner") return Mode::kOwner;
  if (name == "gather") return Mode::kGather;
  DMUON_FAIL("mode must be 'owner' or 'gather', got '", name, "'");
}

const char* mode_name(Mode mode) { return mode == Mode::kOwner ? "owner" : "gather"; }

WireDType parse_wire_dtype(const std::string& name) {
  if (name == "auto") return WireDType::kAuto;
  if (name == "float32") return WireDType::kFloat32;
  if (name == "bfloat16") return WireDType::kBFloat16;
  if (name == "float16") return WireDType::kFloat16;
  DMUON_FAIL("wire_dtype must be auto, float32, bfloat16 or float16, got '", name, "'");
}

DType resolve_wire_dtype(WireDType wire, DeviceKind device) {
  switch (wire) {
    case WireDType::kAuto: return device == DeviceKind::kCuda ? DType::kBFloat16 : DType::kFloat32;
    case WireDType::kFloat32: return DType::kFloat32;
    case WireDType::kBFloat16: return DType::kBFloat16;
    case WireDType::kFloat16: return DType::kFloat16;
  }
  DMUON_FAIL("unknown wire dtype ", static_cast<int>(wire));
}

void EngineOptions::validate() const {
  DMUON_CHECK(pipeline_depth >= 0, "pipeline_depth must be >= 0 (0: twice the world size), got ", pipeline_depth);
  DMUON_CHECK(num_streams >= 1 && num_streams <= 8, "num_streams must be between 1 and 8, got ", num_streams);
  DMUON_CHECK(ns_batch_bytes >= 1, "ns_batch_bytes must be at least 1, got ", ns_batch_bytes);
  DMUON_CHECK(std::isfinite(bandwidth_bytes_per_s) && bandwidth_bytes_per_s > 0.0,
              "bandwidth_bytes_per_s must be a positive finite number, got ", bandwidth_bytes_per_s);
  for (size_t p = 0; p < backward_groups.size(); ++p)
    DMUON_CHECK(backward_groups[p] >= -1, "backward_groups[", p, "] must be >= -1 (-1: no group), got ",
                backward_groups[p]);
  milp.validate();
  cost.validate();
}

void CostOptions::validate() const {
  DMUON_CHECK(num_runs >= 1, "cost num_runs must be at least 1, got ", num_runs);
  DMUON_CHECK(num_warmup >= 0, "cost num_warmup must be >= 0, got ", num_warmup);
  for (const ns::Schedule& schedule : schedules) schedule.validate();
}

}  // namespace dmuon::step

// dmuon/step/route.cpp — the route decision table.
#include "step/route.h"

namespace dmuon::step {

const char* transport_name(TransportKind kind) {
  switch (kind) {
    case TransportKind::kLocal: return "local";
    case TransportKind::kShardExchange: return "shard_exchange";
    case TransportKind::kGather: return "gather";
  }
  return "unknown";
}

bool ops_support(DeviceKind device, DType dtype, std::string* reason) {
  auto refuse = [&](const std::string& why) {
    if (reason != nullptr) *reason = why;
    return false;
  };
  if (dtype == DType::kInt32) return refuse("int32 is not a floating-point type");
  // NOTE: the CUDA ops iterate in 16 bits and their fused passes are instantiated for
  // float32, bfloat16 and float16 parameters; a float64 parameter asks for float64
  // arithmetic, which the adapter's ATen Newton–Schulz gives it.
  if (device == DeviceKind::kCuda && dtype == DType::kFloat64)
    return refuse("float64 parameters are not supported by the CUDA step ops (they iterate in 16 bits); "
                  "the adapter's ATen Newton-Schulz steps them in float64");
  return true;
}

RouteOutcome decide_route(const RouteRequest& request) {
  RouteOutcome out;
  if (request.world_size < 1) {
    out.error = "world size must be >= 1, got " + std::to_string(request.world_size);
    return out;
  }
  const ParamFacts* first_engine = nullptr;
  for (const ParamFacts& p : request.params) {
    std::string reason;
    ParamPath path = ParamPath::kEngine;
    if (p.owned) {
      path = ParamPath::kOwnership;
      reason = "owned by the weight-ownership mode";
    } else if (p.dtype == DType::kInt32) {
      out.error = "parameter '" + p.name + "' has dtype int32; Muon steps floating-point parameters";
      return out;
    } else if (!ops_support(p.device.kind, p.dtype, &reason)) {
      path = ParamPath::kFallback;
    } else if (!p.contiguous) {
      // NOTE: the engine's passes read rows of contiguous memory (e.g. not channels_last).
      path = ParamPath::kFallback;
      reason = "its parameter, gradient or momentum buffer is not contiguous";
    } else if (first_engine == nullptr) {
      first_engine = &p;
    } else if (p.device != first_engine->device) {
      out.error = "DMuon needs every Muon parameter on one device: '" + first_engine->name + "' is on " +
                  device_name(first_engine->device) + ", '" + p.name + "' on " + device_name(p.device);
      return out;
    }
    out.paths.push_back(path);
    out.reasons.push_back(reason);
  }
  if (first_engine != nullptr) out.device = first_engine->device;
  if (request.world_size == 1) {
    out.transport = TransportKind::kLocal;
    out.device_gate = true;
  } else {
    out.transport = request.mode == Mode::kGather ? TransportKind::kGather : TransportKind::kShardExchange;
    // NOTE: the all_to_all sizes depend on which parameters have gradients, so several
    // ranks agree on the host before any exchange.
    out.device_gate = false;
  }
  return out;
}

}  // namespace dmuon::step

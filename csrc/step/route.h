// dmuon/step/route.h — the one decision of how a step runs, from typed facts to a typed
// outcome (the adapter raises outcome.error as it is; nothing is decided twice).
//
//   one process            → the local transport, the device-side gate (no host wait)
//   several, mode owner    → shard exchange (all_to_all to owners and back)
//   several, mode gather   → gather (every rank computes every matrix)
// Per parameter: the weight-ownership mode's own matrices go to it; parameters the
// device's ops cannot step (float64 on CUDA, non-contiguous memory) go to the adapter's
// fallback with the reason; everything else through the engine, on one device.
#pragma once

#include <string>
#include <vector>

#include "step/options.h"
#include "step/types.h"

namespace dmuon::step {

enum class TransportKind { kLocal, kShardExchange, kGather };
const char* transport_name(TransportKind kind);

enum class ParamPath {
  kEngine,     ///< the step engine
  kOwnership,  ///< the weight-ownership mode (reduce-to-owner and publish)
  kFallback,   ///< the adapter's own path (e.g. ATen NS for float64 on CUDA)
};

/// What the route needs to know of one Muon parameter (its local tensors on this rank).
struct ParamFacts {
  std::string name;
  Device device{};
  DType dtype = DType::kFloat32;
  bool contiguous = true;  ///< parameter, gradient and momentum buffer all contiguous
  bool owned = false;      ///< owned by the weight-ownership mode
};

struct RouteRequest {
  int world_size = 1;
  Mode mode = Mode::kOwner;
  std::vector<ParamFacts> params;
};

struct RouteOutcome {
  TransportKind transport = TransportKind::kLocal;
  bool device_gate = false;     ///< the check gates the update on the device (one process)
  Device device{};              ///< of every engine parameter (when there is one)
  std::vector<ParamPath> paths;       ///< per parameter
  std::vector<std::string> reasons;   ///< per parameter: why not the engine ("" when it is)
  std::string error;                  ///< non-empty: the request is invalid (names the parameter)
  bool ok() const { return error.empty(); }
};

/// The route of a step (see the file header). Never throws on a bad request: the error is
/// in the outcome.
RouteOutcome decide_route(const RouteRequest& request);

/// Whether the DeviceOps of `device` step a parameter of `dtype`; when not, *reason (if
/// given) says why. The CUDA ops consult it too, so that both agree.
bool ops_support(DeviceKind device, DType dtype, std::string* reason = nullptr);

}  // namespace dmuon::step

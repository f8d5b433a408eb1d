// dmuon/torch/group_options.h — the options one Muon param group passes to a step.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dmuon::torch_adapter {

/// Options shared by every parameter of one Muon param group.
struct MuonGroupOptions {
  double lr = 0.0;
  double weight_decay = 0.0;
  double momentum = 0.95;
  bool nesterov = true;
  std::string adjust_lr = "none";
  std::string algorithm = "gram";
  std::vector<double> coefficients;   // a, b, c per step
  std::vector<int64_t> restart_after;
  double eps = 1e-7;
};

}  // namespace dmuon::torch_adapter

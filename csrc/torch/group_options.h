// dmuon/torch/group_options.h — the options one Muon param group passes to a step.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ns/schedule.h"
#include "optim/normuon.h"
#include "optim/update_rule.h"
#include "step/options.h"

namespace dmuon::torch_adapter {

/// Options shared by every parameter of one Muon param group. The Newton–Schulz schedule
/// comes built and validated (dmuon._C.ns_schedule, once per group when the group is added
/// or its ns_* options change), never re-parsed per step.
struct MuonGroupOptions {
  double lr = 0.0;
  double weight_decay = 0.0;
  double momentum = 0.95;
  bool nesterov = true;
  std::string adjust_lr = "none";
  ns::Schedule schedule;
  /// NorMuon (optim/normuon.h); off by default.
  optim::NormuonRule normuon;

  /// Factor of the orthogonalized update of an m×n matrix in p ← p·decay() + scale·O.
  double update_scale(int64_t rows, int64_t cols) const {
    return -lr * optim::adjusted_lr_ratio(optim::parse_adjust_lr(adjust_lr), rows, cols);
  }
  /// Decoupled weight decay's factor on the parameter.
  double decay() const { return 1.0 - lr * weight_decay; }
};

/// The step engine's rule of a group (the group's built schedule; errors name the option).
inline step::GroupRule group_rule(const MuonGroupOptions& g) {
  step::GroupRule rule;
  rule.lr = g.lr;
  rule.weight_decay = g.weight_decay;
  rule.momentum = g.momentum;
  rule.nesterov = g.nesterov;
  rule.adjust_lr = optim::parse_adjust_lr(g.adjust_lr);
  rule.schedule = g.schedule;
  rule.normuon = g.normuon;
  rule.validate();
  return rule;
}

}  // namespace dmuon::torch_adapter

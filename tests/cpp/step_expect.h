// dmuon/tests/cpp/step_expect.h — the engine tests' shared assertion: each parameter's total
// update and momentum against the fp64 Muon reference of the same world.
#pragma once

#include <gtest/gtest.h>

#include <exception>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "step_world.h"

namespace dmuon::testing {

// Every rank of `run` ended without an error; with `applied`, it applied every step too.
inline void expect_no_errors(const EngineRun& run, bool applied = false) {
  for (size_t r = 0; r < run.errors.size(); ++r) EXPECT_EQ(run.errors[r], "") << "rank " << r;
  for (size_t r = 0; applied && r < run.outcomes.size(); ++r)
    for (const step::StepOutcome& o : run.outcomes[r]) EXPECT_TRUE(o.applied()) << "rank " << r << ": " << o.message;
}

// Each parameter's total update (relative Frobenius error against the reference's) and
// its momentum buffer. A wrong row, sign, scale, owner or step is off by O(1). Replicas must
// be bit-identical: World::gather() throws where two holders differ.
// `tolerance_of(param)`: the (update, momentum) bounds of each parameter (e.g. by dtype).
inline void expect_matches_reference(const World& world, const EngineRun& run,
                                     const std::vector<step::GroupRule>& rules, int num_steps,
                                     const std::function<std::pair<double, double>(const ModelParam&)>& tolerance_of) {
  const auto ref = reference_muon(world, rules, num_steps);
  for (int p = 0; p < static_cast<int>(world.model().size()); ++p) {
    const std::string& name = world.model()[static_cast<size_t>(p)].name;
    const auto [update_tolerance, momentum_tolerance] = tolerance_of(world.model()[static_cast<size_t>(p)]);
    std::vector<double> param, momentum;
    try {
      param = world.gather(p, run.tensors, false);
      momentum = world.gather(p, run.tensors, true);
    } catch (const std::exception& e) {
      ADD_FAILURE() << e.what();
      continue;
    }
    const auto& initial = world.initial_param[static_cast<size_t>(p)];
    EXPECT_LE(relative_error(difference(param, initial), difference(ref.param[static_cast<size_t>(p)], initial)),
              update_tolerance)
        << "parameter " << name;
    EXPECT_LE(relative_error(momentum, ref.momentum[static_cast<size_t>(p)]), momentum_tolerance)
        << "momentum of " << name;
  }
}

// The same bounds for every parameter.
inline void expect_matches_reference(const World& world, const EngineRun& run,
                                     const std::vector<step::GroupRule>& rules, int num_steps,
                                     double update_tolerance, double momentum_tolerance) {
  expect_matches_reference(world, run, rules, num_steps, [&](const ModelParam&) {
    return std::make_pair(update_tolerance, momentum_tolerance);
  });
}

}  // namespace dmuon::testing

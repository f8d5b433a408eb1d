// NorMuon through the step engine (CPU ops): two steps of a plain matrix, a tall one and a
// 3-D stack on one process against the fp64 Muon + NorMuon of step_world (written from the
// rule, optim/normuon.h), its state v updated in place; sharded and replicated matrices at
// worlds 2 and 3 (v rows moved to the owner and back) against one process, bitwise.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "step_expect.h"
#include "step_world.h"

namespace {

using dmuon::step::DType;
using dmuon::testing::EngineRun;
using dmuon::testing::ModelParam;
using dmuon::testing::World;

// A Gram NS rule with NorMuon on (β₂ 0.9) and weight decay `decay`.
dmuon::step::GroupRule normuon_rule(double decay) {
  dmuon::step::GroupRule rule = dmuon::testing::gram_rule(0.02, decay, true, "match_rms_adamw");
  rule.normuon = dmuon::optim::NormuonRule{true, 0.9, 1e-8};
  return rule;
}

TEST(StepNormuon, OneProcessMatchesFp64Reference) {
  const World world({{"w0", {6, 10}, 0, false}, {"w1", {12, 5}, 0, false}, {"w2", {3, 4, 7}, 1, false}}, 1, 2, 11);
  const std::vector<dmuon::step::GroupRule> rules = {normuon_rule(0.1)};
  const EngineRun run = dmuon::testing::run_engine(world, {}, rules, 2);
  dmuon::testing::expect_no_errors(run, true);
  // NOTE: float32 NS against fp64: the C++ tests' bound of 1e-4 on the update; NorMuon's
  // per-row factors amplify it little (v is an average of O²). Measured: the update 8.6e-6,
  // the momentum 4.3e-8, v 2.4e-6.
  dmuon::testing::expect_matches_reference(world, run, rules, 2, 1e-4, 1e-6);
  const auto ref = dmuon::testing::reference_muon(world, rules, 2);
  for (int p = 0; p < 3; ++p)
    EXPECT_LT(dmuon::testing::relative_error(world.gather_rows(p, run.tensors), ref.row_state[static_cast<size_t>(p)]), 2e-3)
        << world.model()[static_cast<size_t>(p)].name << " v";
}

// Two steps at world 1, then at world 2 and 3 with one matrix sharded by rows (uneven at
// 3) and one replicated: every rank's parameter rows and v rows are the one-process ones
// (gather() throws where two holders of a row differ).
TEST(StepNormuon, ShardedAndReplicatedMatchOneProcessBitwise) {
  const std::vector<ModelParam> model = {{"w0", {8, 6}, 0, true}, {"w1", {5, 9}, 0, false}};
  const std::vector<dmuon::step::GroupRule> rules = {normuon_rule(0.05)};
  std::vector<std::vector<double>> one_process;
  for (int world_size : {1, 2, 3}) {
    // NOTE: the same seed draws the same global values at every world size.
    const World world(model, world_size, 2, 5);
    const EngineRun run = dmuon::testing::run_engine(world, {}, rules, 2);
    dmuon::testing::expect_no_errors(run, true);
    // NOTE: bitwise: the owner holds the same fp32 U whatever the sharding (the wire is
    // fp32 on the CPU), NS normalizes the whole matrix in double in one order, and v
    // comes back unchanged; a cross-world difference of a training run comes from its
    // gradients (FSDP2's mean over 3 ranks is not exact), not from the step.
    std::vector<std::vector<double>> got;
    for (int p = 0; p < 2; ++p) {
      got.push_back(world.gather(p, run.tensors, false));
      got.push_back(world.gather_rows(p, run.tensors));
      EXPECT_GT(*std::min_element(got.back().begin(), got.back().end()), 0.0) << "v of w" << p << " was updated";
    }
    if (world_size == 1) one_process = got;
    EXPECT_EQ(got, one_process) << "world " << world_size;
  }
}

}  // namespace

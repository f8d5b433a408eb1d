// The fake world's model (layout/world_model): agreements, refusals.
#include <gtest/gtest.h>

#include "common/check.h"
#include "layout/world_model.h"

namespace {

using dmuon::layout::FlagOp;
using dmuon::layout::Transport;
using dmuon::layout::WorldModel;

TEST(WorldModel, FakeSumsAreLocalTimesWorldAndMaxesLocal) {
  const WorldModel fake(Transport::kFake, 3, 8);
  EXPECT_TRUE(fake.communicates());
  EXPECT_FALSE(fake.moves_data());
  // "has a gradient on 1 of 8 ranks" would be wrong: every rank has it, so 8.
  EXPECT_EQ(fake.modelled_agreement({1, 0, 1}, FlagOp::kSum), (std::vector<int64_t>{8, 0, 8}));
  EXPECT_EQ(fake.modelled_agreement({5, 0, -2}, FlagOp::kMax), (std::vector<int64_t>{5, 0, -2}));
  EXPECT_EQ(WorldModel().modelled_agreement({4}, FlagOp::kSum), (std::vector<int64_t>{4}));
}

TEST(WorldModel, RealGroupsAgreeByCollectivesNotByTheModel) {
  const WorldModel real(Transport::kReal, 0, 4);
  EXPECT_TRUE(real.moves_data());
  EXPECT_THROW(real.modelled_agreement({1}, FlagOp::kSum), dmuon::Error);
  // A real group of one rank moves nothing either: its agreement is the local value.
  EXPECT_EQ(WorldModel(Transport::kReal, 0, 1).modelled_agreement({2}, FlagOp::kSum), (std::vector<int64_t>{2}));
}

TEST(WorldModel, BadRanksAndRefusedWorkAreNamed) {
  try {
    WorldModel(Transport::kFake, 4, 4);
    FAIL() << "rank 4 of 4 accepted";
  } catch (const dmuon::Error& error) {
    EXPECT_NE(std::string(error.what()).find("rank 4 is outside a world of 4 ranks (0..3)"), std::string::npos)
        << error.what();
  }
  EXPECT_THROW(WorldModel(Transport::kFake, 0, 0), dmuon::Error);
  EXPECT_THROW(WorldModel(Transport::kSingle, 0, 2), dmuon::Error);
  try {
    WorldModel(Transport::kFake, 0, 2).require_data_movement("publishing weights");
    FAIL() << "fake world accepted data movement";
  } catch (const dmuon::Error& error) {
    EXPECT_NE(std::string(error.what()).find("publishing weights cannot run over torch's fake"), std::string::npos)
        << error.what();
  }
  EXPECT_NO_THROW(WorldModel(Transport::kReal, 0, 2).require_data_movement("publishing weights"));
}

}  // namespace

// The loopback transport: N ranks as threads meeting at one rendezvous. Its collectives
// move the right elements, and a broken rank (it throws, calls another collective, sends
// sizes its peer does not expect, leaves without waiting, or finishes early) fails every
// other rank with an error naming it instead of leaving them waiting.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "common/check.h"
#include "error_of.h"
#include "loopback_transport.h"

namespace {

using dmuon::step::Buffer;
using dmuon::step::DType;
using dmuon::testing::LoopbackOptions;
using dmuon::testing::LoopbackWorld;
using dmuon::step::ReduceOp;
using dmuon::testing::contains;

Buffer view(std::vector<float>& v) { return Buffer{v.data(), DType::kFloat32, static_cast<int64_t>(v.size()), {}}; }
// Rank s sends (s + 1)·(d + 1) elements to rank d, each holding 100·s + d.
TEST(Loopback, AllToAllMovesUnevenSplits) {
  for (int world_size : {1, 2, 3, 4}) {
    LoopbackWorld world(world_size);
    std::vector<std::vector<float>> received(static_cast<size_t>(world_size));
    const auto errors = world.run([&](int r) {
      std::vector<int64_t> send_counts, recv_counts;
      std::vector<float> send;
      for (int d = 0; d < world_size; ++d) {
        send_counts.push_back((r + 1) * (d + 1));
        send.insert(send.end(), static_cast<size_t>((r + 1) * (d + 1)), static_cast<float>(100 * r + d));
        recv_counts.push_back((d + 1) * (r + 1));
      }
      std::vector<float> recv(static_cast<size_t>(std::accumulate(recv_counts.begin(), recv_counts.end(), int64_t{0})),
                              -1.f);
      auto pending = world.transport(r).all_to_all(view(send), send_counts, view(recv), recv_counts, "test");
      pending->wait();
      received[static_cast<size_t>(r)] = recv;
    });
    for (int r = 0; r < world_size; ++r) {
      EXPECT_EQ(errors[static_cast<size_t>(r)], "");
      std::vector<float> expected;
      for (int s = 0; s < world_size; ++s)
        expected.insert(expected.end(), static_cast<size_t>((s + 1) * (r + 1)), static_cast<float>(100 * s + r));
      EXPECT_EQ(received[static_cast<size_t>(r)], expected) << "world " << world_size << ", rank " << r;
    }
  }
}

TEST(Loopback, AllReduceAndBroadcast) {
  LoopbackWorld world(3);
  std::vector<std::vector<int64_t>> sums(3), maxes(3);
  std::vector<std::string> texts(3);
  const auto errors = world.run([&](int r) {
    sums[static_cast<size_t>(r)] = world.transport(r).all_reduce({r, 10 * r, 1}, ReduceOp::kSum, "sum");
    maxes[static_cast<size_t>(r)] = world.transport(r).all_reduce({r, -r}, ReduceOp::kMax, "max");
    texts[static_cast<size_t>(r)] = world.transport(r).broadcast(r == 0 ? "plan of rank 0" : "ignored", "plan");
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(errors[static_cast<size_t>(r)], "");
    EXPECT_EQ(sums[static_cast<size_t>(r)], (std::vector<int64_t>{3, 30, 3}));
    EXPECT_EQ(maxes[static_cast<size_t>(r)], (std::vector<int64_t>{2, 0}));
    EXPECT_EQ(texts[static_cast<size_t>(r)], "plan of rank 0");
  }
  // NOTE: a text travels in two all_reduces (its length, then its words).
  EXPECT_EQ(world.num_completed(), 4);
}

// Rank 2's buffer on every rank; every rank's text on every rank (of any length, empty too).
TEST(Loopback, BroadcastOfABufferAndAllGatherOfTexts) {
  LoopbackWorld world(3);
  std::vector<std::vector<float>> buffers(3);
  std::vector<std::vector<std::string>> texts(3);
  const auto errors = world.run([&](int r) {
    std::vector<float> mine(5, static_cast<float>(r));
    world.transport(r).broadcast_buffer(view(mine), 2, "weights")->wait();
    buffers[static_cast<size_t>(r)] = mine;
    const std::string text = r == 1 ? "" : "rank " + std::to_string(r) + std::string(static_cast<size_t>(5 * r), '!');
    texts[static_cast<size_t>(r)] = world.transport(r).all_gather(text, "texts");
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(errors[static_cast<size_t>(r)], "");
    EXPECT_EQ(buffers[static_cast<size_t>(r)], std::vector<float>(5, 2.f)) << "rank " << r;
    EXPECT_EQ(texts[static_cast<size_t>(r)], (std::vector<std::string>{"rank 0", "", "rank 2!!!!!!!!!!"}));
  }
}

// ready() polls without blocking: false until the last rank has brought its buffers.
TEST(Loopback, ReadyPollsWithoutWaiting) {
  LoopbackWorld world(2);
  std::vector<bool> before(2), after(2);
  std::atomic<bool> polled{false};
  const auto errors = world.run([&](int r) {
    std::vector<float> send(2, static_cast<float>(r)), recv(2, -1.f);
    if (r == 1)
      while (!polled.load()) std::this_thread::yield();
    auto pending = world.transport(r).all_to_all(view(send), {1, 1}, view(recv), {1, 1}, "pieces");
    before[static_cast<size_t>(r)] = pending->ready();
    if (r == 0) polled.store(true);
    pending->wait();
    after[static_cast<size_t>(r)] = pending->ready();
  });
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
  EXPECT_FALSE(before[0]);  // NOTE: rank 1 brings its buffers only after rank 0's poll
  EXPECT_TRUE(before[1]);
  EXPECT_TRUE(after[0] && after[1]);
}

// move_when_waited: an all_to_all moves nothing until a rank waits for it, even after a
// later all_reduce completed; a rank that drops one unmoved fails the world, and run()
// reports it on every rank though none raised.
TEST(Loopback, MoveWhenWaitedMovesAtTheFirstWaitAndADroppedOneFailsTheWorld) {
  LoopbackOptions lazy;
  lazy.move_when_waited = true;
  LoopbackWorld moved(2, lazy);
  std::vector<float> before(2), after(2);
  EXPECT_EQ(moved.run([&](int r) {
    std::vector<float> send(2, static_cast<float>(r + 1)), recv(2, -1.f);
    auto pending = moved.transport(r).all_to_all(view(send), {1, 1}, view(recv), {1, 1}, "pieces");
    moved.transport(r).all_reduce({1}, ReduceOp::kSum, "later");
    before[static_cast<size_t>(r)] = recv[1 - r];
    moved.transport(r).all_reduce({1}, ReduceOp::kSum, "both read");  // NOTE: before either waits
    pending->wait();
    after[static_cast<size_t>(r)] = recv[1 - r];
  }), (std::vector<std::string>{"", ""}));
  EXPECT_EQ(before, (std::vector<float>{-1.f, -1.f}));
  EXPECT_EQ(after, (std::vector<float>{2.f, 1.f}));

  LoopbackWorld dropped(2, lazy);
  const auto errors = dropped.run([&](int r) {
    std::vector<float> send(2, 1.f), recv(2, -1.f);
    auto pending = dropped.transport(r).all_to_all(view(send), {1, 1}, view(recv), {1, 1}, "pieces");
    dropped.transport(r).all_reduce({1}, ReduceOp::kSum, "later");
  });
  for (const std::string& e : errors) EXPECT_TRUE(contains(e, "left all_to_all 'pieces' before it completed")) << e;
}

TEST(Loopback, ARankThatThrowsFailsTheOthers) {
  LoopbackWorld world(3);
  const auto errors = world.run([&](int r) {
    world.transport(r).all_reduce({1}, ReduceOp::kSum, "first");
    if (r == 1) DMUON_FAIL("boom on rank 1");
    world.transport(r).all_reduce({1}, ReduceOp::kSum, "second");
  });
  EXPECT_TRUE(contains(errors[1], "boom on rank 1")) << errors[1];
  for (int r : {0, 2})
    EXPECT_TRUE(contains(errors[static_cast<size_t>(r)], "'second' failed: rank 1 failed:") &&
                contains(errors[static_cast<size_t>(r)], "boom on rank 1"))
        << errors[static_cast<size_t>(r)];
}

TEST(Loopback, MismatchedCollectivesAreNamed) {
  LoopbackWorld world(2);
  const auto errors = world.run([&](int r) {
    if (r == 0) world.transport(r).all_reduce({1}, ReduceOp::kSum, "flags of step 3");
    else world.transport(r).broadcast_buffer(Buffer{}, 0, "the plan")->wait();
  });
  for (int r = 0; r < 2; ++r)
    EXPECT_TRUE(contains(errors[static_cast<size_t>(r)], "as collective #0, where rank")) << errors[static_cast<size_t>(r)];
  EXPECT_TRUE(contains(errors[0] + errors[1], "'flags of step 3'") && contains(errors[0] + errors[1], "'the plan'"));
}

TEST(Loopback, SplitSizesThatDisagreeAreNamed) {
  LoopbackWorld world(2);
  const auto errors = world.run([&](int r) {
    std::vector<float> send(4, 1.f), recv(4, 0.f);
    // Rank 0 sends 2 elements to rank 1, which expects 3.
    const std::vector<int64_t> send_counts = r == 0 ? std::vector<int64_t>{1, 2} : std::vector<int64_t>{1, 1};
    const std::vector<int64_t> recv_counts = r == 0 ? std::vector<int64_t>{1, 1} : std::vector<int64_t>{3, 1};
    world.transport(r).all_to_all(view(send), send_counts, view(recv), recv_counts, "pieces")->wait();
  });
  for (int r = 0; r < 2; ++r)
    EXPECT_TRUE(contains(errors[static_cast<size_t>(r)], "rank 0 sends 2 elements to rank 1, which expects 3"))
        << errors[static_cast<size_t>(r)];
}

TEST(Loopback, ARankThatFinishesEarlyFailsTheOthers) {
  LoopbackWorld world(3);
  const auto errors = world.run([&](int r) {
    if (r == 2) return;
    world.transport(r).all_reduce({1}, ReduceOp::kSum, "agreement");
  });
  EXPECT_EQ(errors[2], "");
  for (int r : {0, 1})
    EXPECT_TRUE(contains(errors[static_cast<size_t>(r)], "rank 2 finished without calling collective #0 ('agreement')"))
        << errors[static_cast<size_t>(r)];
}

TEST(Loopback, LeavingAnExchangeUnfinishedFailsTheOthers) {
  LoopbackWorld world(2);
  const auto errors = world.run([&](int r) {
    std::vector<float> send(2, 1.f), recv(2, 0.f);
    auto pending = world.transport(r).all_to_all(view(send), {1, 1}, view(recv), {1, 1}, "pieces");
    if (r == 1) {
      pending.reset();  // NOTE: rank 0 has not arrived: the buffers must never be read now
      DMUON_FAIL("rank 1 gave up");
    }
    world.transport(r).all_reduce({1}, ReduceOp::kSum, "after");
    pending->wait();
  });
  EXPECT_TRUE(contains(errors[1], "rank 1 gave up")) << errors[1];
  EXPECT_TRUE(contains(errors[0], "failed")) << errors[0];
}

TEST(NoDataTransport, MovesNothingAndScalesSums) {
  dmuon::testing::NoDataTransport transport(2, 4);
  std::vector<float> send(3, 1.f), recv(5, 7.f);
  transport.all_to_all(view(send), {1, 1, 0, 1}, view(recv), {2, 1, 0, 2}, "pieces")->wait();
  EXPECT_EQ(recv, std::vector<float>(5, 7.f));
  EXPECT_EQ(transport.all_reduce({1, 3}, ReduceOp::kSum, "s"), (std::vector<int64_t>{4, 12}));
  EXPECT_EQ(transport.all_reduce({1, 3}, ReduceOp::kMax, "m"), (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(transport.broadcast("mine", "plan"), "mine");
  EXPECT_FALSE(transport.moves_data());
}

}  // namespace

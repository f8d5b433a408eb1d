// step::SerialWorker: jobs in the order posted on one thread of its own, drain() waiting for
// them and reporting the first error once.
#include "step/serial_worker.h"

#include <gtest/gtest.h>

#include <chrono>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "common/check.h"
#include "error_of.h"

namespace {

using dmuon::step::SerialWorker;

TEST(SerialWorker, JobsRunInOrderOnOneOtherThreadAndDrainWaitsForThem) {
  SerialWorker worker;
  std::vector<int> order;
  std::set<std::thread::id> threads;
  for (int i = 0; i < 50; ++i)
    worker.post([&, i] {
      // NOTE: a job that takes a while: drain() must wait for those still queued.
      if (i % 10 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
      order.push_back(i);
      threads.insert(std::this_thread::get_id());
    });
  worker.drain();
  ASSERT_EQ(order.size(), 50u);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(order[static_cast<size_t>(i)], i);
  ASSERT_EQ(threads.size(), 1u);
  EXPECT_NE(*threads.begin(), std::this_thread::get_id());
  worker.drain();  // nothing posted: returns at once
}

TEST(SerialWorker, TheFirstErrorIsRethrownOnceAndTheJobsAfterItAreDropped) {
  SerialWorker worker;
  std::vector<int> ran;
  worker.post([&] { ran.push_back(1); });
  worker.post([&] { DMUON_FAIL("stage 3 refused"); });
  worker.post([&] { ran.push_back(3); });
  worker.post([&] { throw std::runtime_error("a second error"); });
  EXPECT_NE(dmuon::testing::error_of([&] { worker.drain(); }).find("stage 3 refused"), std::string::npos);
  EXPECT_EQ(ran, std::vector<int>{1});
  // Reported once; the worker takes jobs again.
  worker.drain();
  worker.post([&] { ran.push_back(5); });
  worker.drain();
  EXPECT_EQ(ran, (std::vector<int>{1, 5}));
}

TEST(SerialWorker, DrainFromItsOwnJobIsRefusedNotAHang) {
  SerialWorker worker;
  std::string refused;
  worker.post([&] { refused = dmuon::testing::error_of([&] { worker.drain(); }); });
  worker.drain();
  EXPECT_NE(refused.find("from one of its own jobs"), std::string::npos) << refused;
}

}  // namespace

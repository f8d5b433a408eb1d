// dmuon/step/serial_worker.h — one thread that runs the jobs posted to it, in the order
// posted: the step begun from backward issues its early stages there, so that backward's
// thread only hands its gradients over.
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace dmuon::step {

class SerialWorker {
 public:
  SerialWorker() = default;
  /// Lets the job running finish, drops the jobs not started, and joins the thread.
  ~SerialWorker();
  SerialWorker(const SerialWorker&) = delete;
  SerialWorker& operator=(const SerialWorker&) = delete;

  /// Queues `job` after the jobs posted before it (the thread starts at the first post).
  /// After a job threw, the jobs posted before drain() reports it are dropped.
  void post(std::function<void()> job);
  /// Returns once every job posted before has run or been dropped; then rethrows the
  /// first error of them, once (the worker takes jobs again). Not from a job.
  void drain();

 private:
  void run();

  std::mutex mutex_;
  std::condition_variable wake_, idle_;
  std::deque<std::function<void()>> jobs_;
  bool running_ = false;  // a job is running (outside the lock)
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace dmuon::step

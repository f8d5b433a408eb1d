// dmuon/step/serial_worker.cpp — a queue, one thread, the first error kept for drain().
#include "step/serial_worker.h"

#include <utility>

#include "common/check.h"

namespace dmuon::step {

SerialWorker::~SerialWorker() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
    jobs_.clear();
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void SerialWorker::post(std::function<void()> job) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // NOTE: a job after a failed one would work on what the failed one left half done.
    if (error_) return;
    jobs_.push_back(std::move(job));
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
  }
  wake_.notify_one();
}

void SerialWorker::drain() {
  std::unique_lock<std::mutex> lock(mutex_);
  DMUON_CHECK(std::this_thread::get_id() != thread_.get_id(),
              "SerialWorker::drain called from one of its own jobs (it would wait for itself)");
  idle_.wait(lock, [this] { return jobs_.empty() && !running_; });
  std::exception_ptr error = std::exchange(error_, nullptr);
  lock.unlock();
  if (error) std::rethrow_exception(error);
}

void SerialWorker::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    wake_.wait(lock, [this] { return stop_ || !jobs_.empty(); });
    if (stop_) return;
    std::function<void()> job = std::move(jobs_.front());
    jobs_.pop_front();
    running_ = true;
    lock.unlock();
    std::exception_ptr error;
    try {
      job();
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    running_ = false;
    if (error) {
      error_ = error;
      jobs_.clear();
    }
    if (jobs_.empty()) idle_.notify_all();
  }
}

}  // namespace dmuon::step

#include "outbox/internal/periodic_worker.hpp"

#include <stdexcept>

namespace outbox::internal {

PeriodicWorker::PeriodicWorker(std::string owner, std::function<void()> work,
                               std::function<std::chrono::milliseconds()> next_wait)
    : owner_(std::move(owner)), work_(std::move(work)), next_wait_(std::move(next_wait)) {}

PeriodicWorker::~PeriodicWorker() {
  close();
}

void PeriodicWorker::start() {
  std::lock_guard lock(mutex_);
  if (closed_) {
    throw std::logic_error(owner_ + ": start() after close()");
  }
  if (started_) {
    return;
  }
  started_ = true;
  thread_ = std::thread([this] { run(); });
}

void PeriodicWorker::close() {
  {
    std::lock_guard lock(mutex_);
    if (closed_) {
      return;
    }
    closed_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) {
    thread_.join();
  }
}

void PeriodicWorker::wake() {
  {
    std::lock_guard lock(mutex_);
    woken_ = true;
  }
  wake_.notify_all();
}

void PeriodicWorker::discard_wake() {
  std::lock_guard lock(mutex_);
  woken_ = false;
}

bool PeriodicWorker::closed() const {
  std::lock_guard lock(mutex_);
  return closed_;
}

void PeriodicWorker::run() {
  std::unique_lock lock(mutex_);
  while (!closed_) {
    lock.unlock();
    work_();
    const auto wait = next_wait_();
    lock.lock();
    // close() and wake() end the wait at once.
    if (wait.count() > 0) {
      wake_.wait_for(lock, wait, [&] { return closed_ || woken_; });
    }
    woken_ = false;
  }
}

}  // namespace outbox::internal

#include "outbox/internal/hand_over_stage.hpp"

#include <exception>

#include "outbox/log.hpp"

namespace outbox::internal {

HandOverStage::HandOverStage() {
  thread_ = std::thread([this] { run(); });
}

HandOverStage::~HandOverStage() {
  close();
}

void HandOverStage::submit(std::function<void()> work, std::function<void()> dropped) {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return !busy_ || closed_; });
  if (closed_) {
    lock.unlock();
    dropped();
    return;
  }
  work_ = std::move(work);
  dropped_ = std::move(dropped);
  busy_ = true;
  changed_.notify_all();
}

void HandOverStage::wait_idle() {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return !busy_ || closed_; });
}

void HandOverStage::close() {
  {
    std::lock_guard lock(mutex_);
    closed_ = true;
  }
  changed_.notify_all();
  if (thread_.joinable()) {
    thread_.join();
  }
}

void HandOverStage::run() {
  std::unique_lock lock(mutex_);
  for (;;) {
    changed_.wait(lock, [&] { return closed_ || work_; });
    if (closed_) {
      // Not started: its rows stay claimed until released or expired (at-least-once).
      auto dropped = std::move(dropped_);
      work_ = nullptr;
      dropped_ = nullptr;
      lock.unlock();
      if (dropped) {
        dropped();
      }
      lock.lock();
      busy_ = false;
      changed_.notify_all();
      return;
    }
    auto work = std::move(work_);
    work_ = nullptr;
    dropped_ = nullptr;
    lock.unlock();
    try {
      work();
    } catch (const std::exception& e) {
      log(LogLevel::Error, std::string("OutboxPoller: handing over a page failed: ") + e.what());
    }
    lock.lock();
    busy_ = false;
    changed_.notify_all();
  }
}

}  // namespace outbox::internal

#pragma once
// A background thread that runs one piece of work, waits, and runs it again until closed: the
// loop of the poller and of the purge scheduler.

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace outbox::internal {

class PeriodicWorker {
 public:
  /// `work` runs on the thread; then the thread waits `next_wait()` (0: runs again at once) or
  /// until close(). `owner` names the component in errors.
  PeriodicWorker(std::string owner, std::function<void()> work,
                 std::function<std::chrono::milliseconds()> next_wait);
  /// Calls close().
  ~PeriodicWorker();
  PeriodicWorker(const PeriodicWorker&) = delete;
  PeriodicWorker& operator=(const PeriodicWorker&) = delete;

  /// Starts the thread (the work runs at once). Idempotent while running; throws
  /// std::logic_error after close().
  void start();
  /// Ends the current wait at once (the work runs again now). Nothing before start().
  void wake();
  /// Forgets a wake() that came while the work ran: the wait it chose must hold (a retry delay).
  void discard_wake();
  /// Stops the thread after the work in progress. Idempotent.
  void close();
  /// True once close() was called: long work checks it to stop early.
  bool closed() const;

 private:
  void run();

  std::string owner_;
  std::function<void()> work_;
  std::function<std::chrono::milliseconds()> next_wait_;
  mutable std::mutex mutex_;  // guards started_, closed_, woken_
  std::condition_variable wake_;
  bool started_ = false;
  bool closed_ = false;
  bool woken_ = false;
  std::thread thread_;
};

}  // namespace outbox::internal

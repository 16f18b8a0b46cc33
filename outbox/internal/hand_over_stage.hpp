#pragma once
// A thread that runs one piece of work at a time for the poller: the hand-over of a claimed page
// (decoding its rows and queueing them) runs there while the poller's thread runs the next
// cycle's statements, so the thread that holds the database's write lock does little else.

#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

namespace outbox::internal {

class HandOverStage {
 public:
  /// Starts the thread.
  HandOverStage();
  /// Calls close().
  ~HandOverStage();
  HandOverStage(const HandOverStage&) = delete;
  HandOverStage& operator=(const HandOverStage&) = delete;

  /// Waits until the work submitted before has ended, then runs `work` on the thread. Works run
  /// one at a time, in the order submitted. Work that will not run (submitted after close(), or
  /// not started when close() came) gets `dropped` called instead, on the thread that found out.
  void submit(std::function<void()> work, std::function<void()> dropped);
  /// Waits until the work submitted so far has ended.
  void wait_idle();
  /// Waits for the work in progress, then stops the thread; work submitted but not started is
  /// dropped. Idempotent.
  void close();

 private:
  void run();

  std::mutex mutex_;  // guards work_, busy_, closed_
  std::condition_variable changed_;
  std::function<void()> work_;
  std::function<void()> dropped_;
  bool busy_ = false;  // work_ is set or running
  bool closed_ = false;
  std::thread thread_;
};

}  // namespace outbox::internal

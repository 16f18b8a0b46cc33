#pragma once
// Groups concurrent publish() calls into batches for a publisher that benefits from them.

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "outbox/publisher.hpp"

namespace outbox::relay {

/// A Publisher decorator: callers' requests queue up while the previous batch is in flight and
/// leave together (up to max_batch), so no delay is added when idle. Dispatcher workers call
/// publish() one event at a time; this turns them into batches of up to the worker count.
/// Thread-safe.
class BatchingPublisher final : public Publisher {
 public:
  /// Throws std::invalid_argument for a null publisher or max_batch 0.
  BatchingPublisher(std::shared_ptr<Publisher> inner, std::size_t max_batch);
  /// Sends what is queued, then stops the sender thread.
  ~BatchingPublisher() override;
  BatchingPublisher(const BatchingPublisher&) = delete;
  BatchingPublisher& operator=(const BatchingPublisher&) = delete;

  std::vector<PublishResult> publish(std::span<const PublishRequest> batch) override;

 private:
  struct Waiter;
  void run();

  std::shared_ptr<Publisher> inner_;
  std::size_t max_batch_;
  std::mutex queue_mutex_;  // guards queue_ and stopping_
  std::condition_variable queued_;
  std::deque<Waiter*> queue_;
  bool stopping_ = false;
  std::thread sender_;
};

}  // namespace outbox::relay

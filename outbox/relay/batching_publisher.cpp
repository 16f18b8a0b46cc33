#include "outbox/relay/batching_publisher.hpp"

#include <stdexcept>

namespace outbox::relay {

// One publish() call: its requests, and where the sender puts their results.
struct BatchingPublisher::Waiter {
  std::span<const PublishRequest> requests;
  std::vector<PublishResult> results;
  bool done = false;
  std::condition_variable finished;
};

BatchingPublisher::BatchingPublisher(std::shared_ptr<Publisher> inner, std::size_t max_batch)
    : inner_(std::move(inner)), max_batch_(max_batch) {
  if (!inner_) {
    throw std::invalid_argument("BatchingPublisher: inner publisher is required");
  }
  if (max_batch_ == 0) {
    throw std::invalid_argument("BatchingPublisher: max_batch must be >= 1");
  }
  sender_ = std::thread([this] { run(); });
}

BatchingPublisher::~BatchingPublisher() {
  {
    std::lock_guard lock(queue_mutex_);
    stopping_ = true;
  }
  queued_.notify_all();
  sender_.join();
}

std::vector<PublishResult> BatchingPublisher::publish(std::span<const PublishRequest> batch) {
  Waiter waiter{batch, {}, false, {}};
  std::unique_lock lock(queue_mutex_);
  queue_.push_back(&waiter);
  queued_.notify_all();
  waiter.finished.wait(lock, [&] { return waiter.done; });
  return std::move(waiter.results);
}

void BatchingPublisher::run() {
  std::unique_lock lock(queue_mutex_);
  for (;;) {
    queued_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) {
      return;  // stopping, nothing left
    }
    // Take whole callers until the batch is full (a caller larger than max_batch goes alone).
    std::vector<Waiter*> taken;
    std::vector<PublishRequest> requests;
    while (!queue_.empty() &&
           (taken.empty() || requests.size() + queue_.front()->requests.size() <= max_batch_)) {
      Waiter* w = queue_.front();
      queue_.pop_front();
      taken.push_back(w);
      requests.insert(requests.end(), w->requests.begin(), w->requests.end());
    }
    lock.unlock();
    std::vector<PublishResult> results = inner_->publish(requests);
    results.resize(requests.size(), PublishResult::retriable("publisher returned too few results"));
    lock.lock();
    std::size_t offset = 0;
    for (Waiter* w : taken) {
      w->results.assign(results.begin() + static_cast<std::ptrdiff_t>(offset),
                        results.begin() + static_cast<std::ptrdiff_t>(offset + w->requests.size()));
      offset += w->requests.size();
      w->done = true;
      w->finished.notify_all();
    }
  }
}

}  // namespace outbox::relay

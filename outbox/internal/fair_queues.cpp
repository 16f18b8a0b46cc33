#include <deque>

#include "outbox/internal/dispatch_queue.hpp"

namespace outbox::internal {
namespace {

class FairQueues final : public DispatchQueue {
 public:
  FairQueues(std::size_t hot_capacity, std::size_t cold_capacity)
      : hot_capacity_(hot_capacity), cold_capacity_(cold_capacity) {}

  bool push(QueuedEvent event) override {
    const bool hot = event.source == QueuedEvent::Source::Hot;
    auto& queue = hot ? hot_ : cold_;
    if (queue.size() >= (hot ? hot_capacity_ : cold_capacity_)) {
      return false;
    }
    queue.push_back(std::move(event));
    return true;
  }

  std::vector<QueuedEvent> take(std::size_t max) override {
    std::vector<QueuedEvent> events;
    if (hot_.empty() && cold_.empty()) {
      return events;
    }
    const bool take_hot = !hot_.empty() && (cold_.empty() || fairness_tick_++ % 3 != 2);
    auto& queue = take_hot ? hot_ : cold_;
    // Events a batch listener takes travel together; any other goes alone, so a slow single
    // listener holds one worker for one event and idle workers take the next ones (a worker
    // once ran a whole batch of webhooks one after another, far past drain_timeout).
    while (!queue.empty() && events.size() < max) {
      const bool alone = !queue.front().batchable;
      if (alone && !events.empty()) {
        break;
      }
      events.push_back(std::move(queue.front()));
      queue.pop_front();
      if (alone) {
        break;
      }
    }
    return events;
  }

  bool empty() const override { return hot_.empty() && cold_.empty(); }

  std::size_t size(QueuedEvent::Source source) const override {
    return source == QueuedEvent::Source::Hot ? hot_.size() : cold_.size();
  }

  std::size_t cold_remaining() const override { return cold_capacity_ - cold_.size(); }

  void for_each(const std::function<void(QueuedEvent&)>& fn) override {
    for (auto* queue : {&hot_, &cold_}) {
      for (auto& e : *queue) {
        fn(e);
      }
    }
  }

  std::vector<QueuedEvent> clear() override {
    std::vector<QueuedEvent> all;
    all.reserve(hot_.size() + cold_.size());
    for (auto* queue : {&hot_, &cold_}) {
      for (auto& e : *queue) {
        all.push_back(std::move(e));
      }
      queue->clear();
    }
    return all;
  }

 private:
  std::size_t hot_capacity_;
  std::size_t cold_capacity_;
  std::deque<QueuedEvent> hot_;
  std::deque<QueuedEvent> cold_;
  unsigned fairness_tick_ = 0;
};

}  // namespace

std::unique_ptr<DispatchQueue> make_fair_queues(std::size_t hot_capacity,
                                                std::size_t cold_capacity) {
  return std::make_unique<FairQueues>(hot_capacity, cold_capacity);
}

}  // namespace outbox::internal

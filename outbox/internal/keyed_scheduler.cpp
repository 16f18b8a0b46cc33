// Per-group FIFO beside the fair queues: the dispatcher's scheduler when message groups are on.

#include <deque>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "outbox/internal/dispatch_queue.hpp"

namespace outbox::internal {
namespace {

class KeyedScheduler final : public DispatchQueue {
 public:
  KeyedScheduler(std::size_t hot_capacity, std::size_t cold_capacity, std::size_t max_active)
      : plain_(make_fair_queues(hot_capacity, cold_capacity)),
        cold_capacity_(cold_capacity),
        max_active_(max_active) {}

  bool push(QueuedEvent event) override {
    const auto& group = event.envelope.message_group();
    if (!group) {
      if (event.source == QueuedEvent::Source::Cold &&
          size(QueuedEvent::Source::Cold) >= cold_capacity_) {
        return false;
      }
      return plain_->push(std::move(event));
    }
    if (size(QueuedEvent::Source::Cold) >= cold_capacity_) {
      return false;
    }
    auto& waiting = groups_[*group];
    if (waiting.empty() && !active_.contains(*group)) {
      ready_.push_back(*group);
    }
    waiting.push_back(std::move(event));
    ++grouped_;
    return true;
  }

  std::vector<QueuedEvent> take(std::size_t max) override {
    const bool group_ready = !ready_.empty() && active_.size() < max_active_;
    if (!group_ready || (plain_->ready() && tick_++ % 2 == 0)) {
      return plain_->take(max);
    }
    std::string group = std::move(ready_.front());
    ready_.pop_front();
    auto it = groups_.find(group);
    auto& waiting = it->second;
    std::vector<QueuedEvent> events;
    // As the fair queues: batchable events travel together (to one listener), others alone.
    while (!waiting.empty() && events.size() < max) {
      const auto& next = waiting.front();
      const bool alone = !next.batchable;
      if (!events.empty() && (alone || next.batch_key != events.front().batch_key)) {
        break;
      }
      events.push_back(std::move(waiting.front()));
      waiting.pop_front();
      if (alone) {
        break;
      }
    }
    grouped_ -= events.size();
    if (waiting.empty()) {
      groups_.erase(it);
    }
    active_.insert(std::move(group));
    return events;
  }

  bool empty() const override { return plain_->empty() && grouped_ == 0; }

  bool ready() const override {
    return plain_->ready() || (!ready_.empty() && active_.size() < max_active_);
  }

  std::size_t size(QueuedEvent::Source source) const override {
    return plain_->size(source) + (source == QueuedEvent::Source::Cold ? grouped_ : 0);
  }

  std::size_t cold_remaining() const override {
    const auto used = size(QueuedEvent::Source::Cold);
    return used >= cold_capacity_ ? 0 : cold_capacity_ - used;
  }

  void for_each(const std::function<void(QueuedEvent&)>& fn) override {
    plain_->for_each(fn);
    for (auto& [group, waiting] : groups_) {
      for (auto& e : waiting) {
        fn(e);
      }
    }
  }

  std::vector<QueuedEvent> clear() override {
    auto all = plain_->clear();
    for (auto& [group, waiting] : groups_) {
      for (auto& e : waiting) {
        all.push_back(std::move(e));
      }
    }
    groups_.clear();
    ready_.clear();
    grouped_ = 0;
    return all;
  }

  std::vector<QueuedEvent> end_group(const std::string& group, bool drop_rest) override {
    active_.erase(group);
    std::vector<QueuedEvent> dropped;
    auto it = groups_.find(group);
    if (it == groups_.end()) {
      return dropped;
    }
    if (drop_rest) {
      for (auto& e : it->second) {
        dropped.push_back(std::move(e));
      }
      grouped_ -= dropped.size();
      groups_.erase(it);
    } else {
      ready_.push_back(group);  // to the back of the line: the other groups go first
    }
    return dropped;
  }

  std::vector<QueuedEvent> drop_partition(int partition) override {
    std::vector<QueuedEvent> dropped;
    for (auto it = groups_.begin(); it != groups_.end();) {
      if (active_.contains(it->first) || it->second.front().partition != partition) {
        ++it;
        continue;
      }
      std::erase(ready_, it->first);
      for (auto& e : it->second) {
        dropped.push_back(std::move(e));
      }
      it = groups_.erase(it);
    }
    grouped_ -= dropped.size();
    return dropped;
  }

  std::size_t active_groups() const override { return active_.size(); }

 private:
  std::unique_ptr<DispatchQueue> plain_;
  std::size_t cold_capacity_;
  std::size_t max_active_;
  std::unordered_map<std::string, std::deque<QueuedEvent>> groups_;  // waiting events per group
  std::deque<std::string> ready_;  // groups with waiting events that no worker runs, in turn
  std::unordered_set<std::string> active_;  // groups a worker runs
  std::size_t grouped_ = 0;                 // waiting grouped events
  unsigned tick_ = 0;
};

}  // namespace

std::unique_ptr<DispatchQueue> make_keyed_scheduler(std::size_t hot_capacity,
                                                    std::size_t cold_capacity,
                                                    std::size_t max_active_groups) {
  return std::make_unique<KeyedScheduler>(hot_capacity, cold_capacity, max_active_groups);
}

}  // namespace outbox::internal

#pragma once
// Where a dispatcher keeps the events waiting for a worker. The writer's hot path and the poller
// hand events to the dispatcher, which puts them here; a scheduler with other rules (per-key FIFO)
// replaces the queues by implementing this. Not thread-safe: the dispatcher calls it under its
// queue lock.

#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

#include "outbox/queued_event.hpp"

namespace outbox::internal {

class DispatchQueue {
 public:
  virtual ~DispatchQueue() = default;
  /// Adds an event at the back of its source's queue; false when that queue is full.
  virtual bool push(QueuedEvent event) = 0;
  /// The next events for one worker: up to `max` batchable events together (queue order kept),
  /// or one event without a batch listener alone. Empty when nothing waits.
  virtual std::vector<QueuedEvent> take(std::size_t max) = 0;
  virtual bool empty() const = 0;
  /// Events waiting from one source.
  virtual std::size_t size(QueuedEvent::Source source) const = 0;
  /// Free places for polled (cold) events.
  virtual std::size_t cold_remaining() const = 0;
  /// Calls `fn` on every waiting event (claim renewals update claimed_at).
  virtual void for_each(const std::function<void(QueuedEvent&)>& fn) = 0;
  /// Removes and returns every waiting event.
  virtual std::vector<QueuedEvent> clear() = 0;
  /// True when take() would return events now (a scheduler may hold events it cannot hand out
  /// yet: their group is running, or the cap on running groups is reached).
  virtual bool ready() const { return !empty(); }
  /// Message groups: a worker ended what it took of `group`. With `drop_rest` the group's waiting
  /// events are removed and returned (they must wait behind a failed head); otherwise the group
  /// may be taken again.
  virtual std::vector<QueuedEvent> end_group(const std::string& /*group*/, bool /*drop_rest*/) {
    return {};
  }
  /// Message groups: removes and returns the waiting events of `partition` (a partition handed
  /// over); events of running groups stay until their group ends.
  virtual std::vector<QueuedEvent> drop_partition(int /*partition*/) { return {}; }
  /// Message groups running now.
  virtual std::size_t active_groups() const { return 0; }
};

/// A hot and a cold FIFO queue of the given capacities; when both have work, workers take hot and
/// cold 2:1, so a steady hot stream cannot starve the poller.
std::unique_ptr<DispatchQueue> make_fair_queues(std::size_t hot_capacity,
                                                std::size_t cold_capacity);

/// The fair queues for events without a message group, and per-group FIFO queues for the others
/// (which count against the cold capacity): a group's events are taken one take at a time, never
/// two of a group at once, at most `max_active_groups` groups at once, groups in turn (a group
/// taken goes to the back of the line), alternating with the ungrouped queues. A take holds one
/// group's events: a batch publisher gives one outcome to many events (an HTTP batch has one
/// status), and a failing group must not take other groups' events down with it.
std::unique_ptr<DispatchQueue> make_keyed_scheduler(std::size_t hot_capacity,
                                                    std::size_t cold_capacity,
                                                    std::size_t max_active_groups);

}  // namespace outbox::internal

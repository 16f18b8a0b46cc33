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
};

/// A hot and a cold FIFO queue of the given capacities; when both have work, workers take hot and
/// cold 2:1, so a steady hot stream cannot starve the poller.
std::unique_ptr<DispatchQueue> make_fair_queues(std::size_t hot_capacity,
                                                std::size_t cold_capacity);

}  // namespace outbox::internal

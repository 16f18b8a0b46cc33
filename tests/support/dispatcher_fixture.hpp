#pragma once
// The dispatcher tests' fixture: an in-memory outbox, dispatcher options and helpers.

#include <gtest/gtest.h>

#include "outbox/dispatcher.hpp"
#include "outbox/listener.hpp"
#include "outbox/metrics.hpp"
#include "outbox/retry_policy.hpp"
#include "tests/support/memory_fixture.hpp"

namespace outbox::testing {

class DispatcherTest : public MemoryFixture {
 protected:
  OutboxDispatcher::Options options() {
    return {.connection_provider = pool,
            .store = store,
            .listeners = listeners,
            .retry_policy = std::make_shared<ExponentialBackoffRetryPolicy>(
                std::chrono::milliseconds(1000), std::chrono::milliseconds(1000), false),
            .max_attempts = 3,
            .worker_count = 2,
            .metrics = metrics};
  }
  // Inserts a committed row and returns its envelope.
  EventEnvelope committed(const std::string& type, const std::string& id) {
    auto e = EventEnvelope::builder(EventType::of(type)).event_id(id).payload_json("{}").build();
    store->insert_new(*pool->acquire(), e);
    return e;
  }
  QueuedEvent queued(const EventEnvelope& e, int attempts = 0) {
    return QueuedEvent{e, QueuedEvent::Source::Hot, attempts};
  }

  std::shared_ptr<InMemoryMetrics> metrics = std::make_shared<InMemoryMetrics>();
};

// A registry whose "Batched" events also have a batch listener.
class BatchRegistry final : public ListenerRegistry {
 public:
  BatchRegistry(std::shared_ptr<ListenerRegistry> singles, BatchEventListener batch)
      : singles_(std::move(singles)),
        batch_(std::make_shared<const BatchEventListener>(std::move(batch))) {}
  std::shared_ptr<const EventListener> listener_for(std::string_view aggregate_type,
                                                    std::string_view event_type) const override {
    return singles_->listener_for(aggregate_type, event_type);
  }
  std::shared_ptr<const BatchEventListener> batch_listener_for(
      std::string_view, std::string_view event_type) const override {
    return event_type == "Batched" ? batch_ : nullptr;
  }

 private:
  std::shared_ptr<ListenerRegistry> singles_;
  std::shared_ptr<const BatchEventListener> batch_;
};

}  // namespace outbox::testing

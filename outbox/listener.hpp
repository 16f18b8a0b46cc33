#pragma once
// Listeners and their routing.

#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "outbox/delivery_result.hpp"
#include "outbox/envelope.hpp"

namespace outbox {

/// Reacts to one event; throws to fail it (RetryLater to ask for a delayed redelivery).
using EventListener = std::function<void(const EventEnvelope&)>;

/// Reacts to one event and says how it went as a value instead of throwing (e.g. a publisher that
/// gets a result from its broker). A throw counts as DeliveryResult::from_exception.
using ResultListener = std::function<DeliveryResult(const EventEnvelope&)>;

/// Reacts to several events at once (e.g. a publisher sending one batch): returns one result per
/// event, in order. A throw, or a result count that does not match, fails every event of the call.
using BatchEventListener =
    std::function<std::vector<DeliveryResult>(std::span<const EventEnvelope* const>)>;

/// Finds the single listener for (aggregate type, event type). Implementations must be thread-safe.
class ListenerRegistry {
 public:
  virtual ~ListenerRegistry() = default;
  /// The listener, or nullptr when none is registered (the event is then unroutable → DEAD).
  virtual std::shared_ptr<const EventListener> listener_for(std::string_view aggregate_type,
                                                            std::string_view event_type) const = 0;
  /// Optional value-returning form for the same pair; used instead of listener_for when present.
  virtual std::shared_ptr<const ResultListener> result_listener_for(
      std::string_view /*aggregate_type*/, std::string_view /*event_type*/) const {
    return nullptr;
  }
  /// Optional batch form for the same pair, used by a dispatcher with max_batch_size > 1; events
  /// of one batch share the returned pointer. Default: none (events go one by one).
  virtual std::shared_ptr<const BatchEventListener> batch_listener_for(
      std::string_view /*aggregate_type*/, std::string_view /*event_type*/) const {
    return nullptr;
  }
};

/// Map-backed registry. Thread-safe; registering while dispatching is allowed.
class DefaultListenerRegistry final : public ListenerRegistry {
 public:
  /// Registers for the GLOBAL aggregate type. Throws std::logic_error on a duplicate and
  /// std::invalid_argument on an empty listener or type.
  DefaultListenerRegistry& register_listener(EventType event_type, EventListener listener);
  /// Registers for one aggregate type. Throws like the overload above.
  DefaultListenerRegistry& register_listener(AggregateType aggregate_type, EventType event_type,
                                             EventListener listener);

  std::shared_ptr<const EventListener> listener_for(std::string_view aggregate_type,
                                                    std::string_view event_type) const override;

 private:
  mutable std::mutex listeners_mutex_;  // guards listeners_
  std::unordered_map<std::string, std::shared_ptr<const EventListener>> listeners_;
};

}  // namespace outbox

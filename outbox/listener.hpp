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

#include "outbox/envelope.hpp"

namespace outbox {

/// Reacts to one event; throws to fail it (RetryLater to ask for a delayed redelivery).
using EventListener = std::function<void(const EventEnvelope&)>;

/// Reacts to several events at once (e.g. a publisher sending one batch): returns one entry per
/// event, in order — nullptr for success, otherwise what that event failed with (the exceptions
/// an EventListener would throw, RetryLater and PermanentFailure included).
using BatchEventListener =
    std::function<std::vector<std::exception_ptr>(std::span<const EventEnvelope* const>)>;

/// Finds the single listener for (aggregate type, event type). Implementations must be thread-safe.
class ListenerRegistry {
 public:
  virtual ~ListenerRegistry() = default;
  /// The listener, or nullptr when none is registered (the event is then unroutable → DEAD).
  virtual std::shared_ptr<const EventListener> listener_for(std::string_view aggregate_type,
                                                            std::string_view event_type) const = 0;
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

#include "outbox/listener.hpp"

#include <stdexcept>

namespace outbox {
namespace {

// Length-prefixed, so that no two (aggregate type, event type) pairs share a key:
// ("a:b", "c") and ("a", "b:c") once did.
std::string route_key(std::string_view aggregate_type, std::string_view event_type) {
  std::string key = std::to_string(aggregate_type.size());
  key.reserve(key.size() + 1 + aggregate_type.size() + event_type.size());
  key.append(":").append(aggregate_type).append(event_type);
  return key;
}

}  // namespace

DefaultListenerRegistry& DefaultListenerRegistry::register_listener(EventType event_type,
                                                                    EventListener listener) {
  return register_listener(AggregateType::global(), std::move(event_type), std::move(listener));
}

DefaultListenerRegistry& DefaultListenerRegistry::register_listener(AggregateType aggregate_type,
                                                                    EventType event_type,
                                                                    EventListener listener) {
  if (!listener) {
    throw std::invalid_argument("register_listener: listener is empty");
  }
  if (event_type.name().empty() || aggregate_type.name().empty()) {
    throw std::invalid_argument("register_listener: event and aggregate types must not be empty");
  }
  auto key = route_key(aggregate_type.name(), event_type.name());
  std::lock_guard lock(listeners_mutex_);
  auto [it, inserted] =
      listeners_.try_emplace(key, std::make_shared<const EventListener>(std::move(listener)));
  if (!inserted) {
    throw std::logic_error(
        "register_listener: a listener is already registered for aggregate type '" +
        aggregate_type.name() + "' and event type '" + event_type.name() + "'");
  }
  return *this;
}

std::shared_ptr<const EventListener> DefaultListenerRegistry::listener_for(
    std::string_view aggregate_type, std::string_view event_type) const {
  auto key = route_key(aggregate_type, event_type);
  std::lock_guard lock(listeners_mutex_);
  auto it = listeners_.find(key);
  return it == listeners_.end() ? nullptr : it->second;
}

}  // namespace outbox

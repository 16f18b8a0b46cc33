#pragma once
// The contract between the relay and a broker or endpoint: publish a batch, report per event.

#include <span>
#include <string>
#include <vector>

#include "outbox/envelope.hpp"

namespace outbox {

/// One event to publish and where to: a topic, a URL, ... (resolved by the caller's routing).
/// Borrows the event: it must outlive the publish() call.
struct PublishRequest {
  const EventEnvelope* event = nullptr;
  std::string target;
};

/// How one event's publication ended. A Permanent failure goes DEAD at once, a Retriable one is
/// retried with backoff (DESIGN.md §3).
struct PublishResult {
  enum class Kind { Ok, Retriable, Permanent };
  Kind kind = Kind::Ok;
  std::string reason;  ///< empty for Ok; otherwise stored as the event's last error

  static PublishResult ok() { return {}; }
  static PublishResult retriable(std::string reason) {
    return {Kind::Retriable, std::move(reason)};
  }
  static PublishResult permanent(std::string reason) {
    return {Kind::Permanent, std::move(reason)};
  }
  bool is_ok() const noexcept { return kind == Kind::Ok; }
};

/// Delivers events. Implementations are thread-safe and never throw from publish().
class Publisher {
 public:
  virtual ~Publisher() = default;
  /// Publishes every request and waits for the outcome; one result per request, same order.
  virtual std::vector<PublishResult> publish(std::span<const PublishRequest> batch) = 0;
};

}  // namespace outbox

#pragma once
// The contract between the relay and a broker or endpoint: publish a batch, report per event.

#include <chrono>
#include <optional>
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
/// retried with backoff or after retry_after.
struct PublishResult {
  enum class Kind { Ok, Retriable, Permanent };
  Kind kind = Kind::Ok;
  std::string reason;  ///< empty for Ok; otherwise stored as the event's last error
  /// Retriable only: when the receiver asked to be called again (e.g. HTTP Retry-After). The
  /// event is then deferred by that long without counting an attempt, instead of backing off.
  std::optional<std::chrono::milliseconds> retry_after;

  static PublishResult ok() { return {}; }
  static PublishResult retriable(std::string reason,
                                 std::optional<std::chrono::milliseconds> after = std::nullopt) {
    return {Kind::Retriable, std::move(reason), after};
  }
  static PublishResult permanent(std::string reason) {
    return {Kind::Permanent, std::move(reason), std::nullopt};
  }
  bool is_ok() const noexcept { return kind == Kind::Ok; }
};

/// Delivers events. Implementations are thread-safe and never throw from publish().
class Publisher {
 public:
  virtual ~Publisher() = default;
  /// Publishes every request and waits for the outcome; one result per request, same order.
  virtual std::vector<PublishResult> publish(std::span<const PublishRequest> batch) = 0;
  /// False while the publisher knows its calls would fail (e.g. no broker reachable): callers
  /// that can wait (subscriptions) do not call it and report why. Thread-safe; default true.
  virtual bool is_healthy() noexcept { return true; }
  /// Irreversibly makes publish calls in progress end promptly, and later ones return at once,
  /// with cancelled() results: bounds a shutdown. Thread-safe. The default does nothing.
  virtual void cancel() noexcept {}
  /// The result of a publish ended by cancel(): Retriable, due again at once, no attempt counted.
  static PublishResult cancelled(const std::string& who) {
    return PublishResult::retriable(who + ": cancelled, the relay is stopping",
                                    std::chrono::milliseconds(1));
  }
};

/// Within one publish call: once an event of a message group failed, the group's later events
/// are not sent (a consumer must never get them before it). Not thread-safe: one per call.
class GroupStops {
 public:
  /// True when an earlier event of this event's group failed in this call.
  bool stopped(const EventEnvelope& event) const;
  /// Records that `event` failed (ungrouped events stop nothing).
  void fail(const EventEnvelope& event);
  /// The result of an event left unsent behind its group's failure: retriable, no attempt lost.
  static PublishResult not_sent(const EventEnvelope& event, const std::string& who);

 private:
  std::vector<std::string> groups_;  // few per call: a scan beats hashing
};

/// The event as one JSON object: {"event_id", "event_type", "aggregate_type", "aggregate_id",
/// "tenant_id", "occurred_at" (RFC 3339), "headers", "tags" (only when the event has tags), and
/// "payload" (JSON payloads, embedded) or
/// "payload_base64" (binary payloads)}. The format of HTTP batches and of the log publisher.
/// Throws std::invalid_argument when a JSON payload is not valid JSON (the envelope checks UTF-8
/// only), so a bad row never corrupts a batch.
std::string to_json_object(const EventEnvelope& event);

/// True when `text` is one complete JSON value (RFC 8259 syntax; nesting up to 512 levels).
bool is_valid_json(std::string_view text) noexcept;

}  // namespace outbox

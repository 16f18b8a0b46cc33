#pragma once
// Exceptions of the caller-facing API.

#include <chrono>
#include <stdexcept>
#include <string>

namespace outbox {

/// A database failure: the driver's message and, where the engine has one, the SQLSTATE.
class StoreError : public std::runtime_error {
 public:
  explicit StoreError(const std::string& message, std::string sqlstate = {})
      : std::runtime_error(message), sqlstate_(std::move(sqlstate)) {}
  /// Five-character SQLSTATE, or empty when the engine has none.
  const std::string& sqlstate() const noexcept { return sqlstate_; }

 private:
  std::string sqlstate_;
};

/// No listener is registered for an event's (aggregate type, event type): the event goes DEAD once.
class UnroutableEventError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Thrown by a listener when retrying cannot help (e.g. the receiver rejected the event as
/// invalid): the event goes DEAD at once with this message as its last error.
class PermanentFailure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Thrown by a listener to ask for redelivery after `delay`. With `count_attempt` false (the
/// default) the attempt counter is left unchanged, so deferring never leads to DEAD; with true it
/// counts as a failed attempt (RETRY, or DEAD at max attempts) but waits `delay` instead of the
/// retry policy. A delay of zero or less is no hint: the event fails like any other error
/// (counted attempt, the retry policy's backoff).
class RetryLater : public std::runtime_error {
 public:
  explicit RetryLater(std::chrono::milliseconds delay, std::string reason = "retry requested",
                      bool count_attempt = false)
      : std::runtime_error(std::move(reason)), delay_(delay), count_attempt_(count_attempt) {}
  std::chrono::milliseconds delay() const noexcept { return delay_; }
  bool count_attempt() const noexcept { return count_attempt_; }

 private:
  std::chrono::milliseconds delay_;
  bool count_attempt_;
};

}  // namespace outbox

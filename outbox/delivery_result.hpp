#pragma once
// What one delivery attempt of an event came to, as a value: batch listeners return it per event,
// and the dispatcher decides the row's next status from it.

#include <chrono>
#include <exception>
#include <string>

namespace outbox {

/// The outcome of handing one event to a listener.
struct DeliveryResult {
  enum class Kind {
    Delivered,   ///< done: the row becomes DONE
    Failed,      ///< a counted attempt: RETRY after the retry policy's delay, DEAD at the last
    Permanent,   ///< retrying cannot help: DEAD at once
    RetryLater,  ///< redeliver after `delay` (counted only with count_attempt)
    Unroutable,  ///< no listener for the event: DEAD at once, no attempt counted
  };
  Kind kind = Kind::Delivered;
  std::string message;  ///< why it failed (stored as the row's last error)
  /// RetryLater: how long to wait; zero or less is no hint (a counted Failed attempt then).
  std::chrono::milliseconds delay{0};
  bool count_attempt = false;    ///< RetryLater: count the attempt (may lead to DEAD)
  std::exception_ptr exception;  ///< what a listener threw, when it threw (for interceptors)

  static DeliveryResult delivered() { return {}; }
  static DeliveryResult failed(std::string message) {
    return {.kind = Kind::Failed, .message = std::move(message)};
  }
  static DeliveryResult permanent(std::string message) {
    return {.kind = Kind::Permanent, .message = std::move(message)};
  }
  static DeliveryResult retry_later(std::chrono::milliseconds delay, std::string reason,
                                    bool count_attempt = false) {
    return {.kind = Kind::RetryLater,
            .message = std::move(reason),
            .delay = delay,
            .count_attempt = count_attempt};
  }
  /// What a listener's exception means: PermanentFailure → Permanent, RetryLater → RetryLater,
  /// UnroutableEventError → Unroutable, anything else → Failed; keeps the exception.
  static DeliveryResult from_exception(std::exception_ptr error);

  bool ok() const noexcept { return kind == Kind::Delivered; }
};

}  // namespace outbox

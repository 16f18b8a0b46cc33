#pragma once
// Cross-cutting hooks around each dispatch.

#include <exception>
#include <functional>
#include <memory>

#include "outbox/delivery_result.hpp"
#include "outbox/envelope.hpp"

namespace outbox {

/// Runs around listeners: before_dispatch in registration order (a throw fails the event like a
/// listener failure), after_dispatch in reverse order with the delivery's result (throws are
/// logged).
/// Implementations must be thread-safe.
class EventInterceptor {
 public:
  virtual ~EventInterceptor() = default;
  virtual void before_dispatch(const EventEnvelope&) {}
  virtual void after_dispatch(const EventEnvelope&, const DeliveryResult&) {}

  /// An interceptor with only a before hook.
  static std::shared_ptr<EventInterceptor> before(std::function<void(const EventEnvelope&)> fn);
  /// An interceptor with only an after hook.
  static std::shared_ptr<EventInterceptor> after(
      std::function<void(const EventEnvelope&, const DeliveryResult&)> fn);
};

}  // namespace outbox

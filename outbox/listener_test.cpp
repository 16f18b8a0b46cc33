#include "outbox/listener.hpp"

#include <gtest/gtest.h>

#include "outbox/interceptor.hpp"

namespace {

using outbox::AggregateType;
using outbox::DefaultListenerRegistry;
using outbox::EventEnvelope;
using outbox::EventType;

TEST(DefaultListenerRegistry, RoutesByAggregateAndEventType) {
  DefaultListenerRegistry reg;
  int global = 0;
  int order = 0;
  reg.register_listener(EventType::of("Created"), [&](const auto&) { ++global; });
  reg.register_listener(AggregateType::of("Order"), EventType::of("Created"),
                        [&](const auto&) { ++order; });
  auto e = outbox::EventEnvelope::of_json(EventType::of("Created"), "{}");
  (*reg.listener_for("__GLOBAL__", "Created"))(e);
  (*reg.listener_for("Order", "Created"))(e);
  EXPECT_EQ(global, 1);
  EXPECT_EQ(order, 1);
  EXPECT_EQ(reg.listener_for("User", "Created"), nullptr);
  EXPECT_EQ(reg.listener_for("Order", "Deleted"), nullptr);
}

TEST(DefaultListenerRegistry, DuplicateRegistrationThrows) {
  DefaultListenerRegistry reg;
  reg.register_listener(EventType::of("X"), [](const auto&) {});
  EXPECT_THROW(reg.register_listener(EventType::of("X"), [](const auto&) {}), std::logic_error);
  EXPECT_THROW(reg.register_listener(EventType::of("Y"), nullptr), std::invalid_argument);
  // Pairs whose joined text is the same are different routes (they once shared a key).
  int first = 0, second = 0;
  reg.register_listener(AggregateType::of("a:b"), EventType::of("c"),
                        [&](const auto&) { ++first; });
  reg.register_listener(AggregateType::of("a"), EventType::of("b:c"),
                        [&](const auto&) { ++second; });
  const auto e = EventEnvelope::of_json(EventType::of("c"), "{}");
  (*reg.listener_for("a:b", "c"))(e);
  (*reg.listener_for("a", "b:c"))(e);
  EXPECT_EQ(first, 1);
  EXPECT_EQ(second, 1);
  EXPECT_EQ(reg.listener_for("a:b:", "c"), nullptr);
  EXPECT_THROW(reg.register_listener(EventType::of(""), [](const auto&) {}), std::invalid_argument);
}

TEST(EventInterceptor, FactoriesWrapFunctions) {
  int before = 0;
  bool saw_error = false;
  auto b = outbox::EventInterceptor::before([&](const auto&) { ++before; });
  auto a = outbox::EventInterceptor::after(
      [&](const auto&, const outbox::DeliveryResult& r) { saw_error = !r.ok(); });
  auto e = outbox::EventEnvelope::of_json(EventType::of("X"), "{}");
  b->before_dispatch(e);
  b->after_dispatch(e, outbox::DeliveryResult::delivered());
  a->before_dispatch(e);
  a->after_dispatch(e, outbox::DeliveryResult::failed("x"));
  EXPECT_EQ(before, 1);
  EXPECT_TRUE(saw_error);
}

}  // namespace

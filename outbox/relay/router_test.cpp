#include "outbox/relay/router.hpp"

#include <gtest/gtest.h>

namespace outbox::relay {
namespace {

TEST(Router, GlobMatching) {
  EXPECT_TRUE(glob_match("*", ""));
  EXPECT_TRUE(glob_match("Order*", "OrderPlaced"));
  EXPECT_TRUE(glob_match("*Placed", "OrderPlaced"));
  EXPECT_TRUE(glob_match("O?der*d", "OrderPlaced"));
  EXPECT_TRUE(glob_match("*a*b*c", "xxaxxbxxc"));
  EXPECT_FALSE(glob_match("Order", "OrderPlaced"));
  EXPECT_FALSE(glob_match("*Shipped", "OrderPlaced"));
  EXPECT_FALSE(glob_match("?", ""));
}

TEST(Router, FirstMatchingRouteWinsAndTemplatesExpand) {
  Router router({{.event_type = "Payment*", .aggregate_type = "*", .publisher = "a"},
                 {.event_type = "*", .aggregate_type = "Order", .publisher = "b"},
                 {.event_type = "OrderPlaced", .aggregate_type = "*", .publisher = "c"}});
  EXPECT_EQ(router.match("Payment", "PaymentFailed"), 0u);
  EXPECT_EQ(router.match("Order", "OrderPlaced"), 1u);
  EXPECT_EQ(router.match("__GLOBAL__", "OrderPlaced"), 2u);
  EXPECT_EQ(router.match("User", "UserCreated"), std::nullopt);

  auto e = EventEnvelope::builder(EventType::of("WalletCredited"))
               .aggregate_type(AggregateType::of("Wallet"))
               .aggregate_id("w-1")
               .payload_json("{}")
               .build();
  EXPECT_EQ(expand_target("{event_type}-out-0", e), "WalletCredited-out-0");
  EXPECT_EQ(expand_target("http://h/{aggregate_type}/{aggregate_id}/{tenant_id}", e),
            "http://h/Wallet/w-1/");
  EXPECT_EQ(template_problem("{event_type}-out-0"), std::nullopt);
  EXPECT_NE(template_problem("{nope}"), std::nullopt);
  EXPECT_NE(template_problem("x-{event_type"), std::nullopt);
}

}  // namespace
}  // namespace outbox::relay

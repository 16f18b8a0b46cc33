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
  EXPECT_EQ(expand_target("http://h/{aggregate_type}/{aggregate_id}", e), "http://h/Wallet/w-1");
  // An absent id as a whole path segment would name the parent: refused.
  EXPECT_THROW(expand_target("http://h/{aggregate_type}/{aggregate_id}/{tenant_id}", e),
               std::invalid_argument);
  EXPECT_EQ(template_problem("{event_type}-out-0"), std::nullopt);
  EXPECT_NE(template_problem("x-{event_type"), std::nullopt);
}

EventEnvelope with_ids(std::string aggregate_id, std::string tenant_id = "t") {
  return EventEnvelope::builder(EventType::of("Evt"))
      .aggregate_type(AggregateType::of("Customer"))
      .aggregate_id(std::move(aggregate_id))
      .tenant_id(std::move(tenant_id))
      .payload_json("{}")
      .build();
}

TEST(Router, UrlTemplatesEncodeValuesSoTheyCannotLeaveTheirComponent) {
  const std::string target = "http://hooks.example/customers/{aggregate_id}/events";
  // The reported attack: a path that climbed to an admin endpoint with our token and signature.
  EXPECT_EQ(
      expand_target(target, with_ids("../../admin/delete-all?confirm=yes#")),
      "http://hooks.example/customers/..%2F..%2Fadmin%2Fdelete-all%3Fconfirm%3Dyes%23/events");
  EXPECT_EQ(expand_target(target, with_ids("a b/%2F@x:1\xc3\xa9")),
            "http://hooks.example/customers/a%20b%2F%252F%40x%3A1%C3%A9/events");
  EXPECT_EQ(expand_target(target, with_ids("ord-1_2.3~")),
            "http://hooks.example/customers/ord-1_2.3~/events");
  EXPECT_EQ(expand_target("HTTPS://h/x?id={aggregate_id}&t={tenant_id}", with_ids("a&b=c", "")),
            "HTTPS://h/x?id=a%26b%3Dc&t=");
  EXPECT_THROW(expand_target(target, with_ids("..")), std::invalid_argument);
  EXPECT_THROW(expand_target(target, with_ids(".")), std::invalid_argument);
  // Found breaking the fix: an empty value made "/customers//events", which servers that merge
  // slashes route to "/customers/events". In the query an empty value is fine.
  EXPECT_THROW(expand_target(target, with_ids("")), std::invalid_argument);
  // Found breaking it again: a dot formed with the template's own text, and an empty value
  // ending the path (the parent collection).
  EXPECT_THROW(expand_target("http://h/t/{tenant_id}.{aggregate_id}/hook", with_ids("", "")),
               std::invalid_argument);
  EXPECT_THROW(expand_target("http://h/t/{tenant_id}./hook", with_ids("x", ".")),
               std::invalid_argument);
  EXPECT_THROW(expand_target("http://h/orders/{aggregate_id}", with_ids("")),
               std::invalid_argument);
  EXPECT_THROW(expand_target("http://h/orders/{aggregate_id}?t=1", with_ids("")),
               std::invalid_argument);
  EXPECT_EQ(expand_target("http://h/t/{tenant_id}.json", with_ids("x", "a")), "http://h/t/a.json");
  EXPECT_EQ(expand_target("http://h/x?t={tenant_id}#{tenant_id}", with_ids("a", "")),
            "http://h/x?t=#");
  // In the host a value is one DNS label or nothing.
  EXPECT_EQ(expand_target("https://{tenant_id}.hooks.example/in", with_ids("x", "acme-1")),
            "https://acme-1.hooks.example/in");
  for (const char* evil : {"evil.com/", "evil.com#", "a@evil.com", "evil.com:80", "", "x.y"}) {
    EXPECT_THROW(expand_target("https://{tenant_id}.hooks.example/in", with_ids("x", evil)),
                 std::invalid_argument)
        << evil;
  }
  // Kafka topics are not URLs: values go in as they are.
  EXPECT_EQ(expand_target("{aggregate_type}.{aggregate_id}", with_ids("a/b")), "Customer.a/b");
  EXPECT_NE(template_problem("{nope}"), std::nullopt);
}

}  // namespace
}  // namespace outbox::relay

#include "outbox/kafka/publisher.hpp"

#include <gtest/gtest.h>

#include <future>
#include <map>
#include <thread>

#include "tests/support/kafka_mock.hpp"
#include "tests/support/test_support.hpp"

namespace outbox::kafka {
namespace {

EventEnvelope event(const std::string& aggregate, int seq) {
  return EventEnvelope::builder(EventType::of("OrderPlaced"))
      .aggregate_type(AggregateType::of("Order"))
      .aggregate_id(aggregate)
      .tenant_id("t1")
      .header("traceparent", "00-abc-def-01")
      .payload_json("{\"seq\":" + std::to_string(seq) + "}")
      .build();
}

TEST(KafkaPublisher, DeliversWithKeysHeadersAndPerKeyOrder) {
  testing::KafkaMockCluster cluster;
  cluster.create_topic("orders", 3);
  KafkaPublisher publisher({.brokers = cluster.bootstraps()});

  // 4 threads publish batches concurrently; each aggregate's events come from one thread, in order.
  constexpr int kAggregates = 8, kPerAggregate = 50;
  std::vector<EventEnvelope> events;
  for (int s = 0; s < kPerAggregate; ++s) {
    for (int a = 0; a < kAggregates; ++a) {
      events.push_back(event("agg-" + std::to_string(a), s));
    }
  }
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int s = 0; s < kPerAggregate; ++s) {
        std::vector<PublishRequest> batch;
        for (int a = t * 2; a < t * 2 + 2; ++a) {
          batch.push_back({&events[s * kAggregates + a], "orders"});
        }
        for (const auto& r : publisher.publish(batch)) {
          ok += r.is_ok() ? 1 : 0;
        }
      }
    });
  }
  for (auto& t : threads) {
    t.join();
  }
  ASSERT_EQ(ok.load(), kAggregates * kPerAggregate);

  auto messages = testing::consume(cluster.bootstraps(), {"orders"}, events.size());
  ASSERT_EQ(messages.size(), events.size());
  std::map<std::string, const EventEnvelope*> by_id;
  for (const auto& e : events) {
    by_id[e.event_id()] = &e;
  }
  std::map<std::string, int> last_seq;
  std::map<std::string, int> partition_of;
  std::sort(messages.begin(), messages.end(), [](const auto& a, const auto& b) {
    return std::tie(a.partition, a.offset) < std::tie(b.partition, b.offset);
  });
  for (const auto& m : messages) {
    ASSERT_TRUE(m.has_key);
    const auto& id = m.headers.at(kHeaderEventId);
    const EventEnvelope& e = *by_id.at(id);
    EXPECT_EQ(m.key, *e.aggregate_id());
    EXPECT_EQ(m.value, e.payload_json());
    EXPECT_EQ(m.headers.at(kHeaderEventType), "OrderPlaced");
    EXPECT_EQ(m.headers.at(kHeaderAggregateType), "Order");
    EXPECT_EQ(m.headers.at(kHeaderAggregateId), m.key);
    EXPECT_EQ(m.headers.at(kHeaderTenantId), "t1");
    EXPECT_EQ(m.headers.at("traceparent"), "00-abc-def-01");
    EXPECT_EQ(m.headers.at(kHeaderOccurredAt).back(), 'Z');
    // Same key → same partition, and offsets follow the order of production.
    auto [it, inserted] = partition_of.emplace(m.key, m.partition);
    EXPECT_EQ(it->second, m.partition) << m.key;
    const int seq = std::stoi(m.value.substr(7));
    auto last = last_seq.find(m.key);
    if (last != last_seq.end()) {
      EXPECT_EQ(seq, last->second + 1) << m.key;
    }
    last_seq[m.key] = seq;
  }
  EXPECT_EQ(last_seq.size(), static_cast<std::size_t>(kAggregates));
}

TEST(KafkaPublisher, OversizeMessageIsPermanentAndUnreachableBrokerRetriable) {
  testing::KafkaMockCluster cluster;
  KafkaPublisher small(
      {.brokers = cluster.bootstraps(), .properties = {{"message.max.bytes", "1000"}}});
  auto big = EventEnvelope::builder(EventType::of("Big"))
                 .payload_json("\"" + std::string(5000, 'x') + "\"")
                 .build();
  auto ok = event("a", 1);
  auto r = small.publish(std::vector<PublishRequest>{{&big, "t"}, {&ok, "t"}, {&ok, ""}});
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0].kind, PublishResult::Kind::Permanent) << r[0].reason;
  EXPECT_NE(r[0].reason.find("MSG_SIZE_TOO_LARGE"), std::string::npos) << r[0].reason;
  EXPECT_TRUE(r[1].is_ok()) << r[1].reason;
  EXPECT_EQ(r[2].kind, PublishResult::Kind::Permanent);

  // Port 1 on loopback: nothing listens, the message times out.
  KafkaPublisher nowhere(
      {.brokers = "127.0.0.1:1", .delivery_timeout = std::chrono::milliseconds(300)});
  auto down = nowhere.publish(std::vector<PublishRequest>{{&ok, "t"}});
  ASSERT_EQ(down.size(), 1u);
  EXPECT_EQ(down[0].kind, PublishResult::Kind::Retriable) << down[0].reason;
}

// An event of a message group refused before it reaches the broker (here: too large) stops its
// group in that call: the group's later events are not produced (they would arrive first).
TEST(KafkaPublisher, NothingOfAGroupIsProducedAfterItsRefusal) {
  testing::KafkaMockCluster cluster;
  cluster.create_topic("t", 1);
  KafkaPublisher small(
      {.brokers = cluster.bootstraps(), .properties = {{"message.max.bytes", "1000"}}});
  auto grouped = [](const std::string& group, const std::string& payload) {
    return EventEnvelope::builder(EventType::of("G"))
        .message_group(group)
        .payload_json(payload)
        .build();
  };
  auto head = grouped("g", "{}");
  auto big = grouped("g", "\"" + std::string(5000, 'x') + "\"");
  auto behind = grouped("g", "{}");
  auto other = grouped("h", "{}");
  auto r = small.publish(
      std::vector<PublishRequest>{{&head, "t"}, {&big, "t"}, {&behind, "t"}, {&other, "t"}});
  ASSERT_EQ(r.size(), 4u);
  EXPECT_TRUE(r[0].is_ok()) << r[0].reason;
  EXPECT_EQ(r[1].kind, PublishResult::Kind::Permanent) << r[1].reason;
  EXPECT_EQ(r[2].kind, PublishResult::Kind::Retriable);
  EXPECT_NE(r[2].reason.find("not sent"), std::string::npos) << r[2].reason;
  EXPECT_TRUE(r[3].is_ok()) << r[3].reason;
  auto messages = testing::consume(cluster.bootstraps(), {"t"}, 2);
  ASSERT_EQ(messages.size(), 2u);
  EXPECT_EQ(messages[0].headers.at(kHeaderEventId), head.event_id());
  EXPECT_EQ(messages[1].headers.at(kHeaderEventId), other.event_id());
}

// Issue 9 item 11: an envelope header named like the publisher's own (any case) used to travel
// next to it, so a consumer could read a forged event id or type.
TEST(KafkaPublisher, EnvelopeHeadersCannotPassForOutboxHeaders) {
  testing::KafkaMockCluster cluster;
  cluster.create_topic("t", 1);
  KafkaPublisher publisher({.brokers = cluster.bootstraps()});
  auto forged_id = EventEnvelope::builder(EventType::of("OrderPlaced"))
                       .header("outbox-event-id", "forged")
                       .payload_json("{}")
                       .build();
  auto forged_type = EventEnvelope::builder(EventType::of("OrderPlaced"))
                         .header("OUTBOX-Event-Type", "Forged")
                         .payload_json("{}")
                         .build();
  auto ordinary = event("a", 1);
  auto r = publisher.publish(
      std::vector<PublishRequest>{{&forged_id, "t"}, {&forged_type, "t"}, {&ordinary, "t"}});
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0].kind, PublishResult::Kind::Permanent) << r[0].reason;
  EXPECT_NE(r[0].reason.find("'outbox-event-id'"), std::string::npos) << r[0].reason;
  EXPECT_EQ(r[1].kind, PublishResult::Kind::Permanent) << r[1].reason;
  EXPECT_NE(r[1].reason.find("'OUTBOX-Event-Type'"), std::string::npos) << r[1].reason;
  EXPECT_TRUE(r[2].is_ok()) << r[2].reason;

  // One partition, produced in order: had the refused events been sent, they would come first.
  auto messages = testing::consume(cluster.bootstraps(), {"t"}, 1);
  ASSERT_EQ(messages.size(), 1u);
  EXPECT_EQ(messages[0].offset, 0);
  EXPECT_EQ(messages[0].headers.at(kHeaderEventId), ordinary.event_id());
  EXPECT_EQ(messages[0].headers.at("traceparent"), "00-abc-def-01");
}

TEST(KafkaPublisher, IsUnhealthyWhileEveryBrokerIsDownAndHealthyOnceOneIsBack) {
  testing::KafkaMockCluster cluster(1);
  cluster.create_topic("t", 1);
  KafkaPublisher publisher({.brokers = cluster.bootstraps()});
  const auto e = event("a", 0);
  const PublishRequest request{&e, "t"};
  ASSERT_TRUE(publisher.publish(std::span(&request, 1)).at(0).is_ok());
  EXPECT_TRUE(publisher.is_healthy());
  cluster.set_all_brokers_up(false);
  EXPECT_TRUE(testing::wait_until([&] { return !publisher.is_healthy(); }));
  cluster.set_all_brokers_up(true);
  EXPECT_TRUE(testing::wait_until([&] { return publisher.is_healthy(); }));
  EXPECT_TRUE(publisher.publish(std::span(&request, 1)).at(0).is_ok());
}

TEST(KafkaPublisher, NeverTimingOutIsRefused) {
  // message.timeout.ms = 0 is "infinite" to librdkafka: a publish (and a drain) that never ends.
  for (const char* key : {"message.timeout.ms", "delivery.timeout.ms"}) {
    try {
      KafkaPublisher p({.brokers = "x:1", .properties = {{key, "0"}}});
      ADD_FAILURE() << key;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("message.timeout.ms = 0"), std::string::npos)
          << e.what();
    }
  }
}

TEST(KafkaPublisher, CancelEndsAPublishWaitingForAnUnreachableBroker) {
  KafkaPublisher nowhere({.brokers = "127.0.0.1:1", .delivery_timeout = std::chrono::hours(1)});
  auto e = event("a", 1);
  std::promise<std::vector<PublishResult>> done;
  auto result = done.get_future();
  std::thread publishing([&] {
    done.set_value(nowhere.publish(std::vector<PublishRequest>{{&e, "t"}}));
  });
  nowhere.cancel();
  // Without cancel() this waits the hour of message.timeout.ms; the bound only detects a hang.
  ASSERT_EQ(result.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  publishing.join();
  const auto r = result.get();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].kind, PublishResult::Kind::Retriable);
  EXPECT_NE(r[0].reason.find("cancelled"), std::string::npos) << r[0].reason;
  EXPECT_EQ(r[0].retry_after, std::chrono::milliseconds(1));
  // Later calls return at once.
  EXPECT_NE(nowhere.publish(std::vector<PublishRequest>{{&e, "t"}}).at(0).reason.find("cancelled"),
            std::string::npos);
}

TEST(KafkaPublisher, RejectsBadSettingsWithTheirName) {
  EXPECT_THROW(KafkaPublisher({}), std::invalid_argument);
  try {
    KafkaPublisher p({.brokers = "x:1", .properties = {{"no.such.setting", "1"}}});
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("no.such.setting"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace outbox::kafka

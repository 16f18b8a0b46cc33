#include "outbox/envelope.hpp"
#include "outbox/store.hpp"

#include <gtest/gtest.h>

#include <set>
#include <thread>

namespace {

enum class OrderEvent { Placed, Cancelled };
std::string_view outbox_name(OrderEvent e) {
  return e == OrderEvent::Placed ? "OrderPlaced" : "OrderCancelled";
}
enum class Aggregate { Order };
std::string_view outbox_name(Aggregate) {
  return "Order";
}

using outbox::AggregateType;
using outbox::EventEnvelope;
using outbox::EventType;

TEST(EventEnvelope, BuildsWithDefaults) {
  auto e = EventEnvelope::of_json(EventType::of("UserCreated"), R"({"a":1})");
  EXPECT_EQ(e.event_type(), "UserCreated");
  EXPECT_EQ(e.aggregate_type(), "__GLOBAL__");
  EXPECT_FALSE(e.aggregate_id());
  EXPECT_FALSE(e.tenant_id());
  EXPECT_TRUE(e.headers().empty());
  EXPECT_EQ(e.payload_json(), R"({"a":1})");
  EXPECT_TRUE(e.has_json_payload());
  EXPECT_EQ(e.event_id().size(), 26u);
  EXPECT_FALSE(e.available_at());
}

TEST(EventEnvelope, EnumTypesConvertThroughAdl) {
  auto e = EventEnvelope::builder(OrderEvent::Placed)
               .aggregate_type(Aggregate::Order)
               .aggregate_id("o-1")
               .tenant_id("t-1")
               .header("traceparent", "00-abc")
               .payload_json("{}")
               .build();
  EXPECT_EQ(e.event_type(), "OrderPlaced");
  EXPECT_EQ(e.aggregate_type(), "Order");
  EXPECT_EQ(*e.aggregate_id(), "o-1");
  EXPECT_EQ(*e.tenant_id(), "t-1");
  EXPECT_EQ(e.headers().at("traceparent"), "00-abc");
  EXPECT_EQ(EventType(OrderEvent::Cancelled).name(), "OrderCancelled");
}

TEST(EventEnvelope, RejectsEmptyTypeAndPayloadMistakes) {
  EXPECT_THROW(EventEnvelope::of_json(EventType::of(""), "{}"), std::invalid_argument);
  EXPECT_THROW(EventEnvelope::builder(EventType::of("T")).build(), std::invalid_argument);
  EXPECT_THROW(
      EventEnvelope::builder(EventType::of("T")).payload_json("{}").payload_bytes({1}).build(),
      std::invalid_argument);
  EXPECT_THROW(EventEnvelope::builder(EventType::of("T")).event_id("").payload_json("{}").build(),
               std::invalid_argument);
  EXPECT_THROW(EventEnvelope::builder(EventType::of("T")).header("", "v"), std::invalid_argument);
  EXPECT_THROW(EventEnvelope::builder(EventType::of("T")).headers({{"", "v"}}),
               std::invalid_argument);
}

TEST(EventEnvelope, PayloadLimitIsExactlyOneMebibyte) {
  std::string at_limit(EventEnvelope::kMaxPayloadBytes, 'x');
  EXPECT_NO_THROW(EventEnvelope::of_json(EventType::of("T"), at_limit));
  std::string over(EventEnvelope::kMaxPayloadBytes + 1, 'x');
  EXPECT_THROW(EventEnvelope::of_json(EventType::of("T"), over), std::invalid_argument);
  std::vector<std::uint8_t> bytes(EventEnvelope::kMaxPayloadBytes + 1, 0);
  EXPECT_THROW(EventEnvelope::builder(EventType::of("T")).payload_bytes(bytes).build(),
               std::invalid_argument);
}

TEST(EventEnvelope, LimitCountsUtf8Bytes) {
  // "é" is two bytes in UTF-8: 524288 of them are exactly 1 MiB, one more is over.
  std::string s;
  for (int i = 0; i < 524288; ++i) {
    s += "\xC3\xA9";
  }
  EXPECT_NO_THROW(EventEnvelope::of_json(EventType::of("T"), s));
  s += "\xC3\xA9";
  EXPECT_THROW(EventEnvelope::of_json(EventType::of("T"), s), std::invalid_argument);
}

TEST(EventEnvelope, RejectsInvalidUtf8Json) {
  EXPECT_THROW(EventEnvelope::of_json(EventType::of("T"), "\"\xC3\""), std::invalid_argument);
  EXPECT_THROW(EventEnvelope::of_json(EventType::of("T"), "\xED\xA0\x80"), std::invalid_argument);
}

TEST(EventEnvelope, CopiesSharePayload) {
  auto a = EventEnvelope::of_json(EventType::of("T"), std::string(1000, 'p'));
  auto b = a;  // NOLINT(performance-unnecessary-copy-initialization)
  EXPECT_EQ(a.payload_storage().get(), b.payload_storage().get());
  EXPECT_EQ(a.payload_json().data(), b.payload_json().data());
}

TEST(EventEnvelope, BytesPayload) {
  auto e = EventEnvelope::builder(EventType::of("T")).payload_bytes({0, 1, 255}).build();
  EXPECT_FALSE(e.has_json_payload());
  EXPECT_TRUE(e.payload_json().empty());
  ASSERT_EQ(e.payload_bytes().size(), 3u);
  EXPECT_EQ(e.payload_bytes()[2], 255);
}

TEST(EventEnvelope, DelayedDelivery) {
  const auto t0 = outbox::from_micros(1'700'000'000'000'000);
  auto e = EventEnvelope::builder(EventType::of("T"))
               .occurred_at(t0)
               .deliver_after(std::chrono::seconds(30))
               .payload_json("{}")
               .build();
  ASSERT_TRUE(e.available_at());
  EXPECT_EQ(*e.available_at(), t0 + std::chrono::seconds(30));

  auto f = EventEnvelope::builder(EventType::of("T"))
               .occurred_at(t0)
               .available_at(t0 + std::chrono::minutes(1))
               .payload_json("{}")
               .build();
  EXPECT_EQ(*f.available_at(), t0 + std::chrono::minutes(1));
}

TEST(EventEnvelope, DelayedDeliveryMistakes) {
  const auto t0 = outbox::from_micros(1'700'000'000'000'000);
  auto base = [&] {
    return EventEnvelope::builder(EventType::of("T")).occurred_at(t0).payload_json("{}");
  };
  EXPECT_THROW(base()
                   .available_at(t0 + std::chrono::seconds(1))
                   .deliver_after(std::chrono::seconds(1))
                   .build(),
               std::invalid_argument);
  EXPECT_THROW(base().deliver_after(std::chrono::seconds(0)).build(), std::invalid_argument);
  // Found breaking issue 9: occurred_at + a huge delay overflowed and the event was due at once.
  EXPECT_THROW(base().deliver_after(std::chrono::microseconds::max()).build(),
               std::invalid_argument);
  EXPECT_THROW(base().deliver_after(std::chrono::hours(24 * 365 * 300)).build(),
               std::invalid_argument);
  EXPECT_NO_THROW(base().deliver_after(std::chrono::hours(24 * 365 * 10)).build());
  EXPECT_THROW(base().deliver_after(std::chrono::seconds(-5)).build(), std::invalid_argument);
  EXPECT_THROW(base().available_at(t0 - std::chrono::seconds(1)).build(), std::invalid_argument);
}

TEST(Ulid, MonotonicAndUniqueAcrossThreads) {
  std::vector<std::string> ids;
  for (int i = 0; i < 10000; ++i) {
    ids.push_back(outbox::new_ulid());
  }
  EXPECT_TRUE(std::is_sorted(ids.begin(), ids.end()));
  std::set<std::string> unique(ids.begin(), ids.end());
  EXPECT_EQ(unique.size(), ids.size());
  for (char c : ids.front()) {
    EXPECT_EQ(std::string("ILOU").find(c), std::string::npos) << c;
  }

  std::vector<std::vector<std::string>> per_thread(4);
  std::vector<std::thread> threads;
  for (auto& v : per_thread) {
    threads.emplace_back([&v] {
      for (int i = 0; i < 2000; ++i) {
        v.push_back(outbox::new_ulid());
      }
    });
  }
  for (auto& t : threads) {
    t.join();
  }
  std::set<std::string> all;
  for (auto& v : per_thread) {
    EXPECT_TRUE(std::is_sorted(v.begin(), v.end()));
    all.insert(v.begin(), v.end());
  }
  EXPECT_EQ(all.size(), 8000u);
}

TEST(Ulid, FirstCharacterEncodesTopBits) {
  // A ULID made now starts with '0' (timestamps below 2^45 ms until the year 3084 start with 0-7).
  EXPECT_LE(outbox::new_ulid()[0], '7');
}

}  // namespace

namespace {

outbox::EventEnvelope::Builder base() {
  return outbox::EventEnvelope::builder(outbox::EventType::of("T")).payload_json("{}");
}

void expect_refused(outbox::EventEnvelope::Builder b, const std::string& part) {
  try {
    b.build();
    ADD_FAILURE() << "built, expected: " << part;
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

TEST(EnvelopeText, TheSameLimitsOnEveryEngineAreCheckedWhenTheEventIsBuilt) {
  using outbox::EventEnvelope;
  const std::string nul("a\0b", 3);
  // PostgreSQL's jsonb refuses \u0000 at insert while SQLite and MariaDB keep it: refused here.
  expect_refused(base().header("h", nul), "header h contains a NUL");
  expect_refused(base().header(nul, "v"), "header name contains a NUL");
  expect_refused(base().header("h", "\xff"), "header h is not valid UTF-8");
  expect_refused(base().aggregate_id(nul), "aggregate id contains a NUL");
  expect_refused(base().tenant_id("\xc3"), "tenant id is not valid UTF-8");
  // MariaDB's VARCHAR limits, in characters, on every engine.
  expect_refused(base().event_id(std::string(65, 'e')), "event id is longer than 64 characters");
  expect_refused(base().event_id("dup "), "event id must not end with a space");
  expect_refused(base().tenant_id(std::string(65, 't')), "tenant id is longer than 64");
  expect_refused(base().aggregate_id(std::string(129, 'a')), "aggregate id is longer than 128");
  expect_refused(
      EventEnvelope::builder(outbox::EventType::of(std::string(129, 'T'))).payload_json("{}"),
      "event type is longer than 128");
  expect_refused(base().aggregate_type(outbox::AggregateType::of(std::string(65, 'A'))),
                 "aggregate type is longer than 64");
  // At the limit, counted in characters (é is two bytes), it builds.
  std::string accented;
  for (int i = 0; i < 64; ++i) {
    accented += "\xc3\xa9";
  }
  auto e = base().event_id(accented).tenant_id(accented).aggregate_id(accented + accented).build();
  EXPECT_EQ(e.event_id(), accented);
}

TEST(EnvelopeText, StoredRowsDecodeWithoutTheWriteChecks) {
  // A row written by another client (e.g. a 100-character id on PostgreSQL) is still delivered.
  outbox::OutboxEvent row;
  row.event_id = std::string(100, 'x');
  row.event_type = "T";
  row.aggregate_type = "A";
  row.payload = "{}";
  row.payload_is_json = true;
  const auto e = outbox::to_envelope(row, outbox::JsonCodec::default_codec());
  EXPECT_EQ(e.event_id(), row.event_id);
}

TEST(EnvelopeText, AnEventRebuiltFromARowKeepsItsDueTime) {
  outbox::OutboxEvent row;
  row.event_id = "r1";
  row.event_type = "T";
  row.aggregate_type = "A";
  row.payload = "{}";
  row.payload_is_json = true;
  row.created_at = outbox::from_micros(1'700'000'000'000'000);
  row.available_at = row.created_at + std::chrono::minutes(5);
  const auto codec = &outbox::JsonCodec::default_codec();
  EXPECT_EQ(outbox::to_envelope(row, *codec).available_at(), row.available_at);
  // Due before it was created (a writer with a skewed clock): at once, and still decoded.
  row.available_at = row.created_at - std::chrono::minutes(5);
  EXPECT_EQ(outbox::to_envelope(row, *codec).available_at(), std::nullopt);
}

}  // namespace

// The OutboxStore contract, one parameterized suite for every engine. Each engine contributes a
// StoreBackend; the SQLite one always runs.

#include <gtest/gtest.h>

#include <functional>
#include <set>

#include "outbox/errors.hpp"
#include "outbox/mysql/driver.hpp"
#include "outbox/mysql/store.hpp"
#include "outbox/postgres/driver.hpp"
#include "outbox/postgres/store.hpp"
#include "outbox/sqlite/driver.hpp"
#include "outbox/sqlite/store.hpp"
#include "outbox/store.hpp"
#include "outbox/testing/in_memory.hpp"
#include "tests/support/servers.hpp"
#include "tests/support/test_support.hpp"

namespace {

using namespace std::chrono_literals;
using outbox::EventEnvelope;
using outbox::EventStatus;
using outbox::EventType;
using outbox::Timestamp;

// A freshly created, empty outbox table on one engine.
struct StoreBackend {
  std::unique_ptr<outbox::sql::Connection> conn;
  std::shared_ptr<outbox::OutboxStore> store;
  std::shared_ptr<outbox::EventPurger> purger;
  std::shared_ptr<outbox::EventPurger> age_purger;
  std::shared_ptr<void> keep_alive;
  std::string table = "outbox_event";
  /// The text the engine gives back for a JSON payload (PostgreSQL's JSONB re-renders it).
  std::function<std::string(const std::string&)> stored_json = [](const std::string& s) {
    return s;
  };
};

struct BackendFactory {
  std::string name;
  std::function<std::optional<std::string>()> url;  ///< nullopt: engine not available
  std::function<StoreBackend(const std::string& url)> make;
};

std::ostream& operator<<(std::ostream& os, const BackendFactory& f) {
  return os << f.name;
}

BackendFactory sqlite_backend() {
  return {"sqlite", [] { return std::optional<std::string>(""); },
          [](const std::string&) {
            auto dir = std::make_shared<outbox::testing::TempDir>();
            StoreBackend b;
            b.conn = outbox::sqlite::open(dir->file("contract.db"));
            outbox::sqlite::create_schema(*b.conn);
            b.store = std::make_shared<outbox::sqlite::SqliteOutboxStore>();
            b.purger = std::make_shared<outbox::sqlite::SqliteEventPurger>();
            b.age_purger = std::make_shared<outbox::sqlite::SqliteAgeBasedPurger>();
            b.keep_alive = dir;
            return b;
          }};
}

// The in-memory store of outbox::testing: the same contract without a database (it runs no SQL,
// so the cases that change rows by hand skip themselves on it).
BackendFactory memory_backend() {
  return {"memory", [] { return std::optional<std::string>(""); },
          [](const std::string&) {
            StoreBackend b;
            b.conn = std::make_unique<outbox::testing::InMemoryConnection>(
                std::make_shared<outbox::testing::InMemoryDatabase>());
            b.store = std::make_shared<outbox::testing::InMemoryOutboxStore>();
            b.purger = std::make_shared<outbox::testing::InMemoryEventPurger>();
            b.age_purger = std::make_shared<outbox::testing::InMemoryAgeBasedPurger>();
            return b;
          }};
}

// A table of its own per test on the shared server, dropped afterwards. The store uses the
// caller's clock here so the contract can be checked with fixed timestamps; the database clock is
// tested separately.
BackendFactory postgres_backend() {
  return {
      "postgres", [] { return outbox::testing::env("OUTBOX_TEST_PG_URL"); },
      [](const std::string& url) {
        StoreBackend b;
        b.conn = outbox::postgres::connect(url);
        const auto table = outbox::testing::unique_table("contract");
        b.table = table;
        outbox::postgres::create_schema(*b.conn, table);
        b.store = std::make_shared<outbox::postgres::PostgresOutboxStore>(
            outbox::postgres::PostgresOutboxStore::Options{.table = table,
                                                           .use_database_clock = false});
        b.purger = std::make_shared<outbox::postgres::PostgresEventPurger>(table);
        b.age_purger = std::make_shared<outbox::postgres::PostgresAgeBasedPurger>(table);
        auto* raw = b.conn.get();
        b.keep_alive = std::shared_ptr<void>(
            nullptr, [raw, table](void*) { raw->execute("DROP TABLE IF EXISTS " + table); });
        b.stored_json = [raw](const std::string& s) {
          return raw->query("SELECT $1::jsonb::text", {outbox::sql::TextRef{s}}).at(0).get_text(0);
        };
        return b;
      }};
}

BackendFactory mysql_backend() {
  return {
      "mysql", [] { return outbox::testing::env("OUTBOX_TEST_MYSQL_URL"); },
      [](const std::string& url) {
        StoreBackend b;
        b.conn = outbox::mysql::connect(url);
        const auto table = outbox::testing::unique_table("contract");
        b.table = table;
        outbox::mysql::create_schema(*b.conn, table);
        b.store = std::make_shared<outbox::mysql::MySqlOutboxStore>(
            outbox::mysql::MySqlOutboxStore::Options{.table = table, .use_database_clock = false});
        b.purger = std::make_shared<outbox::mysql::MySqlEventPurger>(table);
        b.age_purger = std::make_shared<outbox::mysql::MySqlAgeBasedPurger>(table);
        auto* raw = b.conn.get();
        b.keep_alive = std::shared_ptr<void>(
            nullptr, [raw, table](void*) { raw->execute("DROP TABLE IF EXISTS " + table); });
        return b;
      }};
}

class StoreContract : public ::testing::TestWithParam<BackendFactory> {
 protected:
  void SetUp() override {
    auto url = GetParam().url();
    OUTBOX_REQUIRE_SERVER(url, "the " + GetParam().name + " server");
    b_ = GetParam().make(*url);
  }
  void TearDown() override {
    b_.keep_alive.reset();  // drops the table while the connection is still open
  }

  outbox::sql::Connection& conn() { return *b_.conn; }
  outbox::OutboxStore& store() { return *b_.store; }
  const std::string& table() const { return b_.table; }

  // Base time well in the past so "now" comparisons are deterministic.
  Timestamp t0 = outbox::from_micros(1'700'000'000'000'000);

  EventEnvelope event(const std::string& id, Timestamp at) {
    return EventEnvelope::builder(EventType::of("OrderPlaced"))
        .event_id(id)
        .occurred_at(at)
        .aggregate_type(outbox::AggregateType::of("Order"))
        .aggregate_id("o-" + id)
        .payload_json(R"({"id":")" + id + "\"}")
        .build();
  }
  void insert(const std::string& id, Timestamp at) { store().insert_new(conn(), event(id, at)); }
  EventStatus status(const std::string& id) { return store().find(conn(), id)->status; }

  StoreBackend b_;
};

TEST_P(StoreContract, InsertAndFindRoundTripEveryField) {
  auto e = EventEnvelope::builder(EventType::of("UserCreated"))
               .event_id("e1")
               .occurred_at(t0)
               .aggregate_type(outbox::AggregateType::of("User"))
               .aggregate_id("u-1")
               .tenant_id("t-9")
               .header("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
               .header("quote", "a\"b")
               .payload_json(R"({"name":"Zoë"})")
               .build();
  store().insert_new(conn(), e);
  auto row = store().find(conn(), "e1");
  ASSERT_TRUE(row);
  EXPECT_EQ(row->event_type, "UserCreated");
  EXPECT_EQ(row->aggregate_type, "User");
  EXPECT_EQ(row->aggregate_id, "u-1");
  EXPECT_EQ(row->tenant_id, "t-9");
  EXPECT_EQ(row->payload, b_.stored_json(R"({"name":"Zoë"})"));
  EXPECT_TRUE(row->payload_is_json);
  EXPECT_EQ(row->status, EventStatus::New);
  EXPECT_EQ(row->attempts, 0);
  EXPECT_EQ(row->created_at, t0);
  EXPECT_EQ(row->available_at, t0);
  EXPECT_FALSE(row->locked_by);
  auto back = outbox::to_envelope(*row, outbox::JsonCodec::default_codec());
  EXPECT_EQ(back.headers(), e.headers());
  EXPECT_EQ(back.occurred_at(), e.occurred_at());
  EXPECT_FALSE(store().find(conn(), "nope"));
}

TEST_P(StoreContract, BytesPayloadRoundTrips) {
  auto e = EventEnvelope::builder(EventType::of("Blob"))
               .event_id("b1")
               .payload_bytes({0, 159, 146, 150, 255})
               .build();
  store().insert_new(conn(), e);
  auto row = store().find(conn(), "b1");
  ASSERT_TRUE(row);
  EXPECT_FALSE(row->payload_is_json);
  auto back = outbox::to_envelope(*row, outbox::JsonCodec::default_codec());
  EXPECT_EQ(std::vector<std::uint8_t>(back.payload_bytes().begin(), back.payload_bytes().end()),
            (std::vector<std::uint8_t>{0, 159, 146, 150, 255}));
}

TEST_P(StoreContract, DuplicateIdIsAStoreError) {
  insert("dup", t0);
  EXPECT_THROW(insert("dup", t0), outbox::StoreError);
}

TEST_P(StoreContract, InsertBatchSpansSeveralStatements) {
  std::vector<EventEnvelope> events;
  for (int i = 0; i < 1203; ++i) {
    events.push_back(event("b" + std::to_string(10000 + i), t0 + std::chrono::microseconds(i)));
  }
  store().insert_batch(conn(), events);
  EXPECT_EQ(store().count_by_status(conn())[0], 1203);
  auto rows = store().poll_pending(conn(), t0 + 1h, 0us, 5000);
  ASSERT_EQ(rows.size(), 1203u);
  EXPECT_EQ(rows.front().event_id, "b10000");
  EXPECT_EQ(rows.back().event_id, "b11202");
}

TEST_P(StoreContract, DelayedEventIsNotPolledBeforeItIsDue) {
  auto e = EventEnvelope::builder(EventType::of("Later"))
               .event_id("d1")
               .occurred_at(t0)
               .deliver_after(10s)
               .payload_json("{}")
               .build();
  store().insert_new(conn(), e);
  EXPECT_EQ(store().find(conn(), "d1")->available_at, t0 + 10s);
  EXPECT_TRUE(store().poll_pending(conn(), t0 + 9s, 0us, 10).empty());
  EXPECT_EQ(store().poll_pending(conn(), t0 + 10s, 0us, 10).size(), 1u);
}

TEST_P(StoreContract, MarkDoneOnlyFromPendingAndClearsClaim) {
  insert("a", t0);
  ASSERT_EQ(store().claim_pending(conn(), "n1", t0 + 1s, 1s, 0us, 10).size(), 1u);
  EXPECT_EQ(store().mark_done(conn(), "a", t0 + 2s), 1);
  auto row = store().find(conn(), "a");
  EXPECT_EQ(row->status, EventStatus::Done);
  EXPECT_EQ(row->done_at, t0 + 2s);
  EXPECT_FALSE(row->locked_by);
  EXPECT_FALSE(row->locked_at);
  EXPECT_EQ(store().mark_done(conn(), "a", t0 + 3s), 0);
  EXPECT_EQ(store().mark_retry(conn(), "a", t0, 0ms, "x"), 0);
  EXPECT_EQ(store().mark_dead(conn(), "a", t0, "x"), 0);
  EXPECT_EQ(status("a"), EventStatus::Done);
  EXPECT_EQ(store().mark_done(conn(), "missing", t0), 0);
}

TEST_P(StoreContract, DeadRowsAreNeverTouchedByStatusUpdates) {
  insert("a", t0);
  EXPECT_EQ(store().mark_dead(conn(), "a", t0, "bad"), 1);
  EXPECT_EQ(store().mark_done(conn(), "a", t0), 0);
  EXPECT_EQ(store().mark_retry(conn(), "a", t0, 0ms, "x"), 0);
  EXPECT_EQ(store().mark_deferred(conn(), "a", t0, 0ms, "x"), 0);
  auto row = store().find(conn(), "a");
  EXPECT_EQ(row->status, EventStatus::Dead);
  EXPECT_EQ(row->last_error, "bad");
  EXPECT_EQ(row->attempts, 1);
}

TEST_P(StoreContract, MarkDoneBatch) {
  std::vector<std::string> ids;
  for (int i = 0; i < 1100; ++i) {
    ids.push_back("m" + std::to_string(i));
    insert(ids.back(), t0);
  }
  store().mark_dead(conn(), "m5", t0, "x");
  EXPECT_EQ(store().mark_done_batch(conn(), ids, t0 + 1s), 1099);
  auto counts = store().count_by_status(conn());
  EXPECT_EQ(counts[1], 1099);
  EXPECT_EQ(counts[3], 1);
  EXPECT_EQ(store().mark_done_batch(conn(), {}, t0), 0);
}

// The id lists of IN (…) are padded to a few lengths by repeating their last id: whatever the
// size, exactly the ids given are marked, never the next one.
TEST_P(StoreContract, MarkDoneBatchOfAnySizeMarksTheIdsGivenOnly) {
  for (const int size : {1, 3, 5, 63, 65, 130, 501}) {
    std::vector<std::string> ids;
    for (int i = 0; i <= size; ++i) {
      ids.push_back("s" + std::to_string(size) + "-" + std::to_string(i));
      insert(ids.back(), t0);
    }
    const std::string next = ids.back();
    ids.pop_back();
    EXPECT_EQ(store().mark_done_batch(conn(), ids, t0 + 1s), size) << size;
    EXPECT_EQ(store().find(conn(), ids.back())->status, EventStatus::Done) << size;
    EXPECT_EQ(store().find(conn(), next)->status, EventStatus::New) << size;
  }
}

TEST_P(StoreContract, StatusReportOldestPendingAndDeadByType) {
  EXPECT_EQ(store().oldest_pending(conn()), std::nullopt);
  EXPECT_TRUE(store().count_dead_by_type(conn()).empty());
  insert("a", t0 + 5s);
  insert("b", t0 + 1s);
  insert("c", t0 + 3s);
  store().insert_new(conn(), EventEnvelope::builder(EventType::of("Other"))
                                 .event_id("o")
                                 .occurred_at(t0)
                                 .payload_json("{}")
                                 .build());
  store().mark_done(conn(), "b", t0 + 6s);
  store().mark_dead(conn(), "a", t0, "x");
  store().mark_dead(conn(), "o", t0, "x");
  store().mark_retry(conn(), "c", t0 + 6s, 1h, "later");  // RETRY, not yet due: still pending
  EXPECT_EQ(store().oldest_pending(conn()), t0 + 3s);
  auto dead = store().count_dead_by_type(conn());
  ASSERT_EQ(dead.size(), 2u);
  EXPECT_EQ(dead[0], (std::pair<std::string, std::int64_t>("OrderPlaced", 1)));
  EXPECT_EQ(dead[1], (std::pair<std::string, std::int64_t>("Other", 1)));
}

TEST_P(StoreContract, RetryCountsAttemptsAndTruncatesErrors) {
  insert("a", t0);
  const std::string long_error(5000, 'e');
  EXPECT_EQ(store().mark_retry(conn(), "a", t0, 5s, long_error), 1);
  auto row = store().find(conn(), "a");
  EXPECT_EQ(row->status, EventStatus::Retry);
  EXPECT_EQ(row->attempts, 1);
  EXPECT_EQ(row->available_at, t0 + 5s);
  EXPECT_EQ(row->last_error->size(), outbox::kMaxErrorLength);
  EXPECT_TRUE(store().poll_pending(conn(), t0 + 4s, 0us, 10).empty());
  ASSERT_EQ(store().poll_pending(conn(), t0 + 5s, 0us, 10).size(), 1u);
  EXPECT_EQ(store().mark_retry(conn(), "a", t0, 6s, "again"), 1);
  EXPECT_EQ(store().find(conn(), "a")->attempts, 2);
}

TEST_P(StoreContract, DeferredKeepsTheAttemptCount) {
  insert("a", t0);
  store().mark_retry(conn(), "a", t0, 1s, "first");
  EXPECT_EQ(store().mark_deferred(conn(), "a", t0, 9s, "not yet"), 1);
  auto row = store().find(conn(), "a");
  EXPECT_EQ(row->attempts, 1);
  EXPECT_EQ(row->status, EventStatus::Retry);
  EXPECT_EQ(row->available_at, t0 + 9s);
  EXPECT_EQ(row->last_error, "not yet");
}

TEST_P(StoreContract, ErrorTruncationKeepsUtf8Whole) {
  insert("a", t0);
  std::string error(3999, 'x');
  error += "\xC3\xA9\xC3\xA9";  // the first é straddles the 4000-byte limit
  store().mark_dead(conn(), "a", t0, error);
  auto stored = *store().find(conn(), "a")->last_error;
  EXPECT_EQ(stored, std::string(3999, 'x'));
}

TEST_P(StoreContract, PollOrdersByCreatedAtAndHonoursLimitAndSkipRecent) {
  insert("c", t0 + 3s);
  insert("a", t0 + 1s);
  insert("b", t0 + 2s);
  insert("done", t0);
  store().mark_done(conn(), "done", t0);
  auto rows = store().poll_pending(conn(), t0 + 10s, 0us, 10);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].event_id, "a");
  EXPECT_EQ(rows[1].event_id, "b");
  EXPECT_EQ(rows[2].event_id, "c");
  EXPECT_EQ(store().poll_pending(conn(), t0 + 10s, 0us, 2).size(), 2u);
  // skip_recent 8 s at now = t0 + 10 s: only rows created at or before t0 + 2 s.
  EXPECT_EQ(store().poll_pending(conn(), t0 + 10s, 8s, 10).size(), 2u);
}

TEST_P(StoreContract, ClaimLocksRowsUntilExpiry) {
  for (int i = 0; i < 5; ++i) {
    insert("r" + std::to_string(i), t0 + std::chrono::seconds(i));
  }
  const auto now = t0 + 100s;
  auto first = store().claim_pending(conn(), "node-a", now, 60s, 0us, 3);
  ASSERT_EQ(first.size(), 3u);
  EXPECT_EQ(first[0].event_id, "r0");
  EXPECT_EQ(first[2].event_id, "r2");
  EXPECT_EQ(first[0].locked_by, "node-a");
  auto second = store().claim_pending(conn(), "node-b", now, 60s, 0us, 10);
  ASSERT_EQ(second.size(), 2u);
  EXPECT_EQ(second[0].event_id, "r3");
  EXPECT_TRUE(store().claim_pending(conn(), "node-c", now, 60s, 0us, 10).empty());
  // 61 s later node-a's locks have expired: node-c takes them over.
  const auto later = now + 61s;
  auto reclaimed = store().claim_pending(conn(), "node-c", later, 60s, 0us, 10);
  EXPECT_EQ(reclaimed.size(), 5u);
  for (const auto& r : reclaimed) {
    EXPECT_EQ(r.locked_by, "node-c");
  }
}

TEST_P(StoreContract, KeysetPagesResumeAfterTheGivenKey) {
  for (int i = 0; i < 6; ++i) {
    insert("k" + std::to_string(i), t0 + std::chrono::seconds(i));
  }
  insert("k3b", t0 + 3s);  // same created_at as k3: event_id breaks the tie
  const auto now = t0 + 100s;
  const outbox::PendingKey after{t0 + 3s, "k3"};
  auto page = store().poll_pending(conn(), now, 0us, 10, &after);
  ASSERT_EQ(page.size(), 3u);
  EXPECT_EQ(page[0].event_id, "k3b");
  EXPECT_EQ(page[1].event_id, "k4");
  EXPECT_EQ(page[2].event_id, "k5");
  EXPECT_EQ(store().poll_pending(conn(), now, 0us, 10).size(), 7u);
  auto claimed = store().claim_pending(conn(), "node-a", now, 60s, 0us, 2, &after);
  ASSERT_EQ(claimed.size(), 2u);
  EXPECT_EQ(claimed[0].event_id, "k3b");
  EXPECT_EQ(claimed[1].event_id, "k4");
  const outbox::PendingKey end{t0 + 5s, "k5"};
  EXPECT_TRUE(store().claim_pending(conn(), "node-a", now, 60s, 0us, 10, &end).empty());
  auto head = store().claim_pending(conn(), "node-a", now, 60s, 0us, 10);
  ASSERT_EQ(head.size(), 5u);  // k3b and k4 are held by node-a already
  EXPECT_EQ(head[0].event_id, "k0");
}

TEST_P(StoreContract, ReleasedClaimsAreClaimableAtOnce) {
  for (int i = 0; i < 4; ++i) {
    insert("c" + std::to_string(i), t0 + std::chrono::seconds(i));
  }
  const auto now = t0 + 100s;
  ASSERT_EQ(store().claim_pending(conn(), "node-a", now, 60s, 0us, 3).size(), 3u);
  store().mark_done(conn(), "c0", now);  // finished rows are not touched by a release
  EXPECT_EQ(store().release_claims(conn(), "node-a"), 2);
  EXPECT_EQ(store().release_claims(conn(), "node-a"), 0);
  auto taken = store().claim_pending(conn(), "node-b", now, 60s, 0us, 10);
  ASSERT_EQ(taken.size(), 3u);
  EXPECT_EQ(taken[0].event_id, "c1");
  EXPECT_EQ(status("c0"), EventStatus::Done);
}

TEST_P(StoreContract, RowsBornClaimedAreLeftToTheirOwnerUntilExpiry) {
  // The claim is stamped with the insert time (system clock here), whatever occurred_at says.
  const auto base = std::chrono::system_clock::now();
  store().insert_new(conn(), event("mine", base), "node-a");
  auto row = store().find(conn(), "mine");
  EXPECT_EQ(row->locked_by, "node-a");
  ASSERT_TRUE(row->locked_at);
  EXPECT_LE(*row->locked_at - base, 5s);
  EXPECT_GE(*row->locked_at - base, -1s);
  const auto stamped = *row->locked_at;
  EXPECT_TRUE(store().claim_pending(conn(), "node-b", stamped + 1s, 60s, 0us, 10).empty());
  // Its own poller leaves it to the hot path for own_claim_grace (6 s of a 60 s lease), then may
  // take it (the hot path may have dropped it).
  EXPECT_TRUE(store().claim_pending(conn(), "node-a", stamped + 5s, 60s, 0us, 10).empty());
  auto own = store().claim_pending(conn(), "node-a", stamped + 7s, 60s, 0us, 10);
  ASSERT_EQ(own.size(), 1u);
  EXPECT_EQ(own[0].event_id, "mine");
  // Rows the poller just claimed are not claimed again by the same owner.
  EXPECT_TRUE(store().claim_pending(conn(), "node-a", stamped + 8s, 60s, 0us, 10).empty());
  auto expired = store().claim_pending(conn(), "node-b", stamped + 7s + 61s, 60s, 0us, 10);
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0].locked_by, "node-b");
  std::vector<EventEnvelope> batch{event("b1", base), event("b2", base)};
  store().insert_batch(conn(), batch, "node-c");
  EXPECT_EQ(store().find(conn(), "b2")->locked_by, "node-c");
}

// Issue 9 item 7: the claim used to be stamped with occurred_at, so a back-dated event was born
// with an expired claim that another node took at once while the writer's hot path delivered it.
TEST_P(StoreContract, BackDatedEventsAreNotBornWithAnExpiredClaim) {
  const auto now = std::chrono::system_clock::now();
  store().insert_new(conn(), event("old", now - 24h), "node-a");
  std::vector<EventEnvelope> batch{event("old1", now - 1h), event("old2", now - 1h)};
  store().insert_batch(conn(), batch, "node-a");
  EXPECT_TRUE(store().claim_pending(conn(), "node-b", now + 1s, 60s, 0us, 10).empty());
  EXPECT_GE(*store().find(conn(), "old")->locked_at, now - 1s);
}

TEST_P(StoreContract, ClaimSkipsNotDueAndRecentRows) {
  insert("old", t0);
  insert("recent", t0 + 9s);
  store().insert_new(conn(), EventEnvelope::builder(EventType::of("L"))
                                 .event_id("later")
                                 .occurred_at(t0)
                                 .deliver_after(1h)
                                 .payload_json("{}")
                                 .build());
  auto rows = store().claim_pending(conn(), "n", t0 + 10s, 10s, 5s, 10);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].event_id, "old");
}

TEST_P(StoreContract, DeadQueriesFilterCountAndReplay) {
  store().insert_new(conn(), EventEnvelope::builder(EventType::of("A"))
                                 .event_id("d1")
                                 .occurred_at(t0)
                                 .aggregate_type(outbox::AggregateType::of("X"))
                                 .payload_json("{}")
                                 .build());
  store().insert_new(conn(), EventEnvelope::builder(EventType::of("B"))
                                 .event_id("d2")
                                 .occurred_at(t0 + 1s)
                                 .payload_json("{}")
                                 .build());
  insert("alive", t0);
  store().mark_dead(conn(), "d1", t0, "e1");
  store().mark_dead(conn(), "d2", t0, "e2");
  EXPECT_EQ(store().count_dead(conn(), std::nullopt), 2);
  EXPECT_EQ(store().count_dead(conn(), "A"), 1);
  auto all = store().query_dead(conn(), std::nullopt, std::nullopt, 10);
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].event_id, "d1");
  EXPECT_EQ(store().query_dead(conn(), std::nullopt, "X", 10).size(), 1u);
  EXPECT_EQ(store().query_dead(conn(), "B", "X", 10).size(), 0u);
  EXPECT_EQ(store().query_dead(conn(), std::nullopt, std::nullopt, 1).size(), 1u);
  EXPECT_EQ(all[1].payload, "{}");
  // Listings leave the payloads out (one listing of large DEAD events once took gigabytes).
  const auto listed = store().query_dead(conn(), std::nullopt, std::nullopt, 10, false);
  ASSERT_EQ(listed.size(), 2u);
  EXPECT_EQ(listed[1].event_id, "d2");
  EXPECT_EQ(listed[1].last_error, "e2");
  EXPECT_TRUE(listed[1].payload.empty());
  EXPECT_EQ(store().replay_dead(conn(), "d1", t0 + 50s), 1);
  EXPECT_EQ(store().replay_dead(conn(), "d1", t0 + 50s), 0);
  EXPECT_EQ(store().replay_dead(conn(), "alive", t0 + 50s), 0);
  auto row = store().find(conn(), "d1");
  EXPECT_EQ(row->status, EventStatus::New);
  EXPECT_EQ(row->attempts, 0);
  EXPECT_EQ(row->available_at, t0 + 50s);
  EXPECT_EQ(store().count_dead(conn(), std::nullopt), 1);
  // Discarding deletes a DEAD row only, and only while it holds the error it was listed with.
  EXPECT_EQ(store().discard_dead(conn(), "d1", "e1"), 0);  // NEW again
  EXPECT_EQ(store().discard_dead(conn(), "alive", std::nullopt), 0);
  EXPECT_EQ(store().discard_dead(conn(), "d2", "another error"), 0);
  EXPECT_EQ(store().discard_dead(conn(), "d2", std::nullopt), 0);
  EXPECT_EQ(store().discard_dead(conn(), "d2", "e2"), 1);
  EXPECT_EQ(store().discard_dead(conn(), "d2", "e2"), 0);
  // The same condition on a replay.
  store().mark_dead(conn(), "d1", t0 + 60s, "e3");
  EXPECT_EQ(store().replay_dead_if(conn(), "d1", "e1", t0 + 70s), 0);
  EXPECT_EQ(store().find(conn(), "d1")->status, EventStatus::Dead);
  EXPECT_EQ(store().replay_dead_if(conn(), "d1", "e3", t0 + 70s), 1);
  EXPECT_EQ(store().find(conn(), "d1")->status, EventStatus::New);
  EXPECT_FALSE(store().find(conn(), "d2"));
  EXPECT_TRUE(store().find(conn(), "d1"));
  EXPECT_EQ(store().count_dead(conn(), std::nullopt), 0);
}

TEST_P(StoreContract, StatusPurgerDeletesOnlyOldTerminalRowsInBatches) {
  for (int i = 0; i < 7; ++i) {
    insert("p" + std::to_string(i), t0);
  }
  for (int i = 0; i < 5; ++i) {
    store().mark_done(conn(), "p" + std::to_string(i), t0 + 1s);
  }
  store().mark_dead(conn(), "p5", t0, "x");              // DEAD at t0
  EXPECT_EQ(b_.purger->purge(conn(), t0 + 1s, 100), 1);  // only p5 is older than t0 + 1 s
  EXPECT_EQ(b_.purger->purge(conn(), t0 + 2s, 3), 3);
  EXPECT_EQ(b_.purger->purge(conn(), t0 + 2s, 3), 2);
  EXPECT_EQ(b_.purger->purge(conn(), t0 + 2s, 3), 0);
  EXPECT_TRUE(store().find(conn(), "p6"));
}

TEST_P(StoreContract, AgePurgerDeletesEveryOldRowButClaimedOnes) {
  insert("old-new", t0);
  insert("old-done", t0);
  store().mark_done(conn(), "old-done", t0);
  insert("young", t0 + 10s);
  store().insert_new(conn(), event("old-claimed", t0), "relay-1");
  EXPECT_EQ(b_.age_purger->purge(conn(), t0 + 5s, 100), 2);
  EXPECT_TRUE(store().find(conn(), "young"));
  EXPECT_TRUE(store().find(conn(), "old-claimed"));  // a relay is delivering it
  EXPECT_FALSE(store().find(conn(), "old-new"));
  EXPECT_TRUE(b_.age_purger->deletes_pending());
  EXPECT_FALSE(b_.purger->deletes_pending());
}

// Issue 9 item 4: mark_dead set no done_at, so the purge measured a DEAD row's age from
// created_at and deleted an event that went DEAD after a long retry history at once.
TEST_P(StoreContract, DeadRetentionCountsFromWhenTheRowWentDead) {
  if (GetParam().name == "memory") {
    GTEST_SKIP() << "not on the in-memory store: the case edits a row with SQL";
  }
  insert("late", t0);
  store().mark_retry(conn(), "late", t0 + 24h, 1h, "still failing");
  EXPECT_EQ(store().mark_dead(conn(), "late", t0 + 10 * 24h, "gave up"), 1);
  EXPECT_EQ(store().find(conn(), "late")->done_at, t0 + 10 * 24h);
  // A 7-day retention judged at day 11: DEAD for one day only, so kept.
  EXPECT_EQ(b_.purger->purge(conn(), t0 + 4 * 24h, 100), 0);
  EXPECT_EQ(status("late"), EventStatus::Dead);
  EXPECT_EQ(b_.purger->purge(conn(), t0 + 10 * 24h + 1s, 100), 1);
  // A DEAD row from before schema version 2 (no done_at) is never purged by age: its retention
  // starts when `outbox migrate` gives it one.
  insert("legacy", t0);
  store().mark_dead(conn(), "legacy", t0, "x");
  conn().execute("UPDATE " + table() + " SET done_at = NULL WHERE event_id = 'legacy'");
  EXPECT_EQ(b_.purger->purge(conn(), t0 + 365 * 24h, 100), 0);
  EXPECT_EQ(status("legacy"), EventStatus::Dead);
  // A replayed row's terminal time is cleared with it.
  insert("again", t0);
  store().mark_dead(conn(), "again", t0 + 1s, "x");
  store().replay_dead(conn(), "again", t0 + 2s);
  EXPECT_FALSE(store().find(conn(), "again")->done_at);
}

// Found breaking issue 9: a delay of milliseconds::max() (a listener's RetryLater) overflowed
// every engine's arithmetic (PostgreSQL refused the interval, MariaDB and SQLite wrapped), so the
// row stayed pending and was delivered at every poll. Delays are clamped to [0, 30 days].
TEST_P(StoreContract, HugeAndNegativeDelaysAreClamped) {
  insert("a", t0);
  insert("b", t0);
  EXPECT_EQ(store().mark_deferred(conn(), "a", t0, std::chrono::milliseconds::max(), "x"), 1);
  EXPECT_EQ(store().find(conn(), "a")->available_at, t0 + outbox::kMaxRetryDelay);
  EXPECT_EQ(store().mark_retry(conn(), "b", t0, -5s, "y"), 1);
  EXPECT_EQ(store().find(conn(), "b")->available_at, t0);
}

// Issue 9 item 5: an error text that is not valid UTF-8 (a body cut inside a character, binary
// bytes, NUL) made PostgreSQL and strict MariaDB refuse the status write, so the row stayed NEW
// and was delivered again forever.
TEST_P(StoreContract, ErrorsThatAreNotUtf8AreStoredSanitized) {
  insert("a", t0);
  insert("b", t0);
  const std::string bad = std::string("HTTP 400: caf\xC3") + "\xFF\xFE" + std::string(1, '\0') +
                          "end \xE2\x82";  // a cut character at the end too
  EXPECT_EQ(store().mark_retry(conn(), "a", t0, 1s, bad), 1);
  auto row = store().find(conn(), "a");
  EXPECT_EQ(row->status, EventStatus::Retry);
  EXPECT_EQ(row->last_error, outbox::sanitize_utf8(bad));
  EXPECT_EQ(row->last_error->find('\0'), std::string::npos);
  EXPECT_NE(row->last_error->find("end"), std::string::npos);
  EXPECT_EQ(store().mark_dead(conn(), "b", t0, bad), 1);
  EXPECT_EQ(status("b"), EventStatus::Dead);
  EXPECT_EQ(outbox::sanitize_utf8("ok \xE2\x82\xAC"), "ok \xE2\x82\xAC");
  EXPECT_EQ(outbox::sanitize_utf8("\xC0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD");  // overlong NUL
  EXPECT_EQ(outbox::sanitize_utf8("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
}

// Issue 9 item 8: status updates checked the status but not the owner, so node A, whose claim
// had expired and been taken by node B, overwrote B's outcome (a late DEAD, a RETRY that cleared
// B's claim).
TEST_P(StoreContract, AStaleOwnerCannotOverwriteTheNewOwnersOutcome) {
  insert("a", t0);
  ASSERT_EQ(store().claim_pending(conn(), "node-a", t0 + 1s, 1s, 0us, 10).size(), 1u);
  ASSERT_EQ(store().claim_pending(conn(), "node-b", t0 + 5s, 1s, 0us, 10).size(), 1u);
  EXPECT_EQ(store().mark_dead(conn(), "a", t0 + 6s, "late failure", true, "node-a"), 0);
  EXPECT_EQ(store().mark_retry(conn(), "a", t0 + 6s, 1s, "late retry", "node-a"), 0);
  EXPECT_EQ(store().mark_deferred(conn(), "a", t0 + 6s, 1s, "late defer", "node-a"), 0);
  EXPECT_EQ(store().mark_done(conn(), "a", t0 + 6s, "node-a"), 0);
  EXPECT_EQ(store().mark_done_batch(conn(), {"a"}, t0 + 6s, "node-a"), 0);
  EXPECT_TRUE(store().renew_claims(conn(), "node-a", {"a"}, t0 + 6s).empty());
  auto row = store().find(conn(), "a");
  EXPECT_EQ(row->status, EventStatus::New);
  EXPECT_EQ(row->locked_by, "node-b");
  EXPECT_EQ(row->attempts, 0);
  EXPECT_EQ(store().renew_claims(conn(), "node-b", {"a", "missing"}, t0 + 7s),
            std::vector<std::string>{"a"});
  EXPECT_EQ(store().find(conn(), "a")->locked_at, t0 + 7s);
  EXPECT_EQ(store().mark_done(conn(), "a", t0 + 8s, "node-b"), 1);
  EXPECT_EQ(status("a"), EventStatus::Done);
  // Without an owner (single node), updates apply to whoever holds the row.
  insert("c", t0);
  ASSERT_EQ(store().claim_pending(conn(), "node-b", t0 + 1s, 1s, 0us, 10).size(), 1u);
  EXPECT_EQ(store().mark_retry(conn(), "c", t0 + 2s, 1s, "x"), 1);
}

INSTANTIATE_TEST_SUITE_P(Engines, StoreContract,
                         ::testing::Values(sqlite_backend(), postgres_backend(), mysql_backend(),
                                           memory_backend()),
                         [](const auto& info) { return info.param.name; });

TEST(TableNames, AreValidated) {
  EXPECT_NO_THROW(outbox::validate_table_name("outbox_event"));
  EXPECT_NO_THROW(outbox::validate_table_name("_x9"));
  for (const char* bad : {"", "9abc", "a-b", "a b", "t;DROP TABLE x", "\"q\""}) {
    EXPECT_THROW(outbox::validate_table_name(bad), std::invalid_argument) << bad;
  }
  EXPECT_THROW(outbox::validate_table_name(std::string(64, 'a')), std::invalid_argument);
  EXPECT_NO_THROW(outbox::validate_table_name(std::string(63, 'a')));
  EXPECT_THROW(outbox::sqlite::SqliteOutboxStore({.table = "bad name"}), std::invalid_argument);
  EXPECT_THROW(outbox::sqlite::SqliteEventPurger("1x"), std::invalid_argument);
}

}  // namespace

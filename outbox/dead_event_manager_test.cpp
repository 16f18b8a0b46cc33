// DeadEventManager on the in-memory outbox: counts, queries, replays one or all. Database errors
// are thrown: tests/outbox_sqlite_test.cpp.

#include "outbox/dead_event_manager.hpp"

#include <gtest/gtest.h>

#include "tests/support/memory_fixture.hpp"

namespace outbox {
namespace {

class DeadEventManagerTest : public testing::MemoryFixture {};

TEST_F(DeadEventManagerTest, QueriesAndReplays) {
  auto conn = pool->acquire();
  for (int i = 0; i < 5; ++i) {
    auto e = EventEnvelope::builder(EventType::of(i < 3 ? "A" : "B"))
                 .event_id("x" + std::to_string(i))
                 .payload_json("{}")
                 .build();
    store->insert_new(*conn, e);
    store->mark_dead(*conn, e.event_id(), std::chrono::system_clock::now(), "boom");
  }
  DeadEventManager dead(pool, store);
  EXPECT_EQ(dead.count(), 5);
  EXPECT_EQ(dead.count("A"), 3);
  EXPECT_EQ(dead.query("B", std::nullopt, 10).size(), 2u);
  EXPECT_TRUE(dead.replay("x4"));
  EXPECT_FALSE(dead.replay("x4"));
  const auto capped = dead.replay_all("A", std::nullopt, 2);
  EXPECT_EQ(capped.replayed, 2);
  EXPECT_TRUE(capped.more);
  const auto rest = dead.replay_all("A", std::nullopt);
  EXPECT_EQ(rest.replayed, 1);
  EXPECT_FALSE(rest.more);
  EXPECT_FALSE(rest.stopped);
  EXPECT_EQ(dead.count(), 1);
  EXPECT_EQ(count(EventStatus::New), 4);
}

// Dead-letter triage: events that failed the same way (ids and numbers aside) are one group, and
// a group is replayed or discarded whole.
TEST_F(DeadEventManagerTest, GroupsByFailureFingerprintAndActsOnAWholeGroup) {
  auto conn = pool->acquire();
  const auto t0 = std::chrono::system_clock::now();
  const auto dead = [&](const std::string& id, const std::string& type, const std::string& error,
                        std::chrono::seconds at) {
    store->insert_new(
        *conn, EventEnvelope::builder(EventType::of(type)).event_id(id).payload_json("{}").build());
    store->mark_dead(*conn, id, t0 + at, error);
  };
  dead("a1", "OrderPlaced", R"(HTTP 500: {"error":"order 1 not found"})", std::chrono::seconds(1));
  dead("a2", "OrderPlaced", R"(HTTP 500: {"error":"order 22 not found"})", std::chrono::seconds(3));
  dead("a3", "OrderPlaced", R"(HTTP 500: {"error":"order 333 not found"})",
       std::chrono::seconds(2));
  dead("b1", "OrderPlaced", "HTTP 400: bad request", std::chrono::seconds(4));
  dead("c1", "Shipped", R"(HTTP 500: {"error":"order 1 not found"})", std::chrono::seconds(5));
  DeadEventManager manager(pool, store);
  bool more = true;
  const auto groups = manager.groups(DeadEventManager::kReplayAllLimit, &more);
  EXPECT_FALSE(more);
  ASSERT_EQ(groups.size(), 3U);
  const auto& big = groups[0];
  EXPECT_EQ(big.count, 3);
  EXPECT_EQ(big.fingerprint.event_type, "OrderPlaced");
  EXPECT_EQ(big.fingerprint.pattern, R"(HTTP 500: {"error":"order N not found"})");
  EXPECT_EQ(big.first_seen, t0 + std::chrono::seconds(1));
  EXPECT_EQ(big.last_seen, t0 + std::chrono::seconds(3));
  EXPECT_EQ(big.sample_event_id, "a2");
  EXPECT_EQ(big.sample_error, R"(HTTP 500: {"error":"order 22 not found"})");
  EXPECT_EQ(groups[1].sample_event_id, "c1");  // same count: the most recent first

  const auto replayed = manager.replay_group(big.fingerprint.id);
  EXPECT_EQ(replayed.changed, 3);
  EXPECT_EQ(replayed.skipped, 0);
  EXPECT_EQ(store->find(*conn, "a1")->status, EventStatus::New);
  EXPECT_EQ(store->find(*conn, "b1")->status, EventStatus::Dead);
  EXPECT_EQ(manager.replay_group(big.fingerprint.id).changed, 0);  // nothing of it is DEAD now

  const auto shipped = groups[1].fingerprint.id;
  EXPECT_EQ(manager.discard_group(shipped).changed, 1);
  EXPECT_FALSE(store->find(*conn, "c1"));
  EXPECT_EQ(manager.count(), 1);
  // A capped read says so.
  EXPECT_EQ(manager.groups(1, &more).size(), 1U);
  EXPECT_FALSE(more);
  dead("b2", "OrderPlaced", "HTTP 400: bad request", std::chrono::seconds(6));
  EXPECT_EQ(manager.groups(1, &more).size(), 1U);
  EXPECT_TRUE(more);
  EXPECT_THROW(manager.groups(0), std::invalid_argument);
}

// A row listed in a group, then replayed by someone else and DEAD again for another reason while
// the action runs, belongs to another group now: the action leaves it alone.
TEST_F(DeadEventManagerTest, AGroupActionSkipsARowThatFailedAnotherWayMeanwhile) {
  auto conn = pool->acquire();
  const auto now = std::chrono::system_clock::now();
  for (const char* id : {"g1", "g2"}) {
    store->insert_new(
        *conn, EventEnvelope::builder(EventType::of("A")).event_id(id).payload_json("{}").build());
    store->mark_dead(*conn, id, now,
                     std::string("HTTP 503: upstream timeout after ") +
                         (id[1] == '1' ? "1200" : "3400") + " ms");
  }
  DeadEventManager dead(pool, store);
  const auto fp = fingerprint_failure("A", "HTTP 503: upstream timeout after 1200 ms").id;
  ASSERT_EQ(fingerprint_failure("A", "HTTP 503: upstream timeout after 3400 ms").id, fp);
  const auto r = dead.discard_group(fp, DeadEventManager::kReplayAllLimit, [&](int done, int) {
    if (done == 0) {
      auto other = pool->acquire();
      store->replay_dead(*other, "g2", now);
      store->mark_dead(*other, "g2", now, "HTTP 400: account closed");
    }
    return true;
  });
  EXPECT_EQ(r.changed, 1);
  EXPECT_EQ(r.skipped, 1);
  EXPECT_FALSE(store->find(*conn, "g1"));
  ASSERT_TRUE(store->find(*conn, "g2"));
  EXPECT_EQ(store->find(*conn, "g2")->last_error, "HTTP 400: account closed");
}

// A bulk action's progress callback sees every step and can stop it between two events.
TEST_F(DeadEventManagerTest, AProgressCallbackSeesEachStepAndStopsBetweenTwoEvents) {
  auto conn = pool->acquire();
  for (int i = 0; i < 5; ++i) {
    store->insert_new(*conn, EventEnvelope::builder(EventType::of("A"))
                                 .event_id("p" + std::to_string(i))
                                 .payload_json("{}")
                                 .build());
    store->mark_dead(*conn, "p" + std::to_string(i), std::chrono::system_clock::now(), "boom");
  }
  DeadEventManager dead(pool, store);
  std::vector<std::pair<int, int>> seen;
  const auto r = dead.replay_all(std::nullopt, std::nullopt, DeadEventManager::kReplayAllLimit,
                                 [&](int done, int total) {
                                   seen.emplace_back(done, total);
                                   return done < 2;
                                 });
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.replayed, 2);
  EXPECT_EQ(seen, (std::vector<std::pair<int, int>>{{0, 5}, {1, 5}, {2, 5}}));
  EXPECT_EQ(dead.count(), 3);
  const auto fp = fingerprint_failure("A", "boom").id;
  const auto g = dead.discard_group(fp, DeadEventManager::kReplayAllLimit,
                                    [](int done, int) { return done < 1; });
  EXPECT_TRUE(g.stopped);
  EXPECT_EQ(g.changed, 1);
  EXPECT_EQ(dead.count(), 2);
}

}  // namespace
}  // namespace outbox

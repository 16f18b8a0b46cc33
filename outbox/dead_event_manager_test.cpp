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
  EXPECT_EQ(dead.count(), 1);
  EXPECT_EQ(count(EventStatus::New), 4);
}

}  // namespace
}  // namespace outbox

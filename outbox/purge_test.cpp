// OutboxPurgeScheduler on the in-memory outbox: batches, retention on the scheduler's clock, and
// the settings it refuses.

#include "outbox/purge.hpp"

#include <gtest/gtest.h>

#include "tests/support/memory_fixture.hpp"

namespace outbox {
namespace {

using namespace std::chrono_literals;

class PurgeSchedulerTest : public testing::MemoryFixture {};

TEST_F(PurgeSchedulerTest, DeletesTerminalRowsInBatches) {
  auto clock = std::make_shared<testing::ManualClock>();
  auto conn = pool->acquire();
  for (int i = 0; i < 12; ++i) {
    auto id = "p" + std::to_string(i);
    store->insert_new(*conn, EventEnvelope::builder(EventType::of("E"))
                                 .event_id(id)
                                 .occurred_at(clock->now() - 10 * 24h)
                                 .payload_json("{}")
                                 .build());
    if (i < 10) {
      store->mark_done(*conn, id, clock->now() - 8 * 24h);
    }
  }
  OutboxPurgeScheduler s({.connection_provider = pool,
                          .purger = std::make_shared<testing::InMemoryEventPurger>(),
                          .batch_size = 3,
                          .clock = clock});
  EXPECT_EQ(s.run_once(), 10);
  EXPECT_EQ(count(EventStatus::New), 2);
  s.close();
  EXPECT_THROW(s.start(), std::logic_error);
  EXPECT_THROW(OutboxPurgeScheduler({.connection_provider = pool}), std::invalid_argument);
  // 999999 days once wrapped to a cutoff in the future: every DONE and DEAD row purged.
  const auto purger = std::make_shared<testing::InMemoryEventPurger>();
  EXPECT_THROW(OutboxPurgeScheduler({.connection_provider = pool,
                                     .purger = purger,
                                     .retention = std::chrono::hours(24 * 999999)}),
               std::invalid_argument);
  EXPECT_THROW(OutboxPurgeScheduler({.connection_provider = pool,
                                     .purger = purger,
                                     .interval = std::chrono::hours(24 * 999999)}),
               std::invalid_argument);
  // Found breaking the fix: seconds this large overflowed the comparison in milliseconds.
  EXPECT_THROW(OutboxPurgeScheduler({.connection_provider = pool,
                                     .purger = purger,
                                     .retention = std::chrono::seconds(9223372036854776)}),
               std::invalid_argument);
}

}  // namespace
}  // namespace outbox

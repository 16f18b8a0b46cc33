// The Outbox composite end to end on a real SQLite file: business rows and events in one
// transaction, writers racing the poller, and database errors surfacing as StoreError. The same
// rules without a database: outbox/outbox_test.cpp and its neighbours.

#include <gtest/gtest.h>

#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "outbox/dead_event_manager.hpp"
#include "outbox/errors.hpp"
#include "outbox/outbox.hpp"
#include "outbox/sqlite/store.hpp"
#include "outbox/writer.hpp"
#include "tests/support/outbox_fixture.hpp"
#include "tests/support/sqlite_fixture.hpp"

namespace outbox {
namespace {

using namespace std::chrono_literals;
using testing::wait_until;

class OutboxSqliteTest : public testing::OutboxFixture<testing::SqliteFixture> {};

// A rolled-back transaction leaves neither the business row nor the event; a committed one
// leaves both, and the hot path delivers it.
TEST_F(OutboxSqliteTest, BusinessRowsAndEventsCommitOrRollBackTogether) {
  std::atomic<int> calls{0};
  listeners->register_listener(EventType::of("OrderPlaced"), [&](const auto&) { ++calls; });
  auto ob = Outbox::single_node(options());
  ob.start();
  pool->acquire()->execute("CREATE TABLE orders (id TEXT)");
  auto place = [&](const std::string& order, bool commit) {
    auto t = tx->begin();
    t.connection().execute("INSERT INTO orders VALUES (?)", {sql::TextRef{order}});
    auto id = *ob.writer().write(EventType::of("OrderPlaced"), R"({"id":")" + order + "\"}");
    if (commit) {
      t.commit();
    } else {
      t.rollback();
    }
    return id;
  };
  const auto rolled_back = place("o1", false);
  const auto committed = place("o2", true);
  ASSERT_TRUE(wait_status(committed, EventStatus::Done));
  ob.poller()->poll();
  ob.close();
  EXPECT_FALSE(row(rolled_back));
  const auto orders = pool->acquire()->query("SELECT id FROM orders");
  ASSERT_EQ(orders.size(), 1u);
  EXPECT_EQ(orders[0].get_text(0), "o2");
  EXPECT_EQ(calls.load(), 1);
  EXPECT_EQ(metrics->snapshot().hot_enqueued, 1);
}

TEST_F(OutboxSqliteTest, NoDuplicateDeliveryWhileThePollerRacesTheHotPath) {
  std::mutex m;
  std::map<std::string, int> deliveries;
  listeners->register_listener(EventType::of("E"), [&](const EventEnvelope& e) {
    std::lock_guard lock(m);
    ++deliveries[e.event_id()];
  });
  auto o = options();
  o.poller.interval = 1ms;  // poll constantly so it reads rows the hot path is delivering
  o.dispatcher.hot_queue_capacity = 16;  // force some events onto the cold path too
  auto ob = Outbox::single_node(o);
  ob.start();
  constexpr int kThreads = 4;
  constexpr int kPerThread = 300;
  std::vector<std::thread> writers;
  for (int t = 0; t < kThreads; ++t) {
    writers.emplace_back([&] {
      for (int i = 0; i < kPerThread; ++i) {
        commit_one(ob, "E");
      }
    });
  }
  for (auto& w : writers) {
    w.join();
  }
  ASSERT_TRUE(wait_until([&] { return count(EventStatus::Done) == kThreads * kPerThread; }, 120s));
  ob.close();
  std::lock_guard lock(m);
  EXPECT_EQ(deliveries.size(), static_cast<std::size_t>(kThreads * kPerThread));
  int duplicates = 0;
  for (const auto& [id, n] : deliveries) {
    duplicates += n - 1;
  }
  EXPECT_EQ(duplicates, 0);
}

// A database error is thrown, not reported as "nothing DEAD".
// Threads that write in a loop through the pool the outbox uses took SQLite's write gate again
// before the DONE flusher, woken, could run: marks waited seconds while a service wrote, the
// poller stopped with its queue full of events waiting for their marks, and delivery fell behind
// the commits (4 writers: 6 % of the committed events DONE when they stopped). The outbox's own
// writers now go first.
TEST_F(OutboxSqliteTest, DeliveryKeepsUpWithWritersInTheSameProcess) {
  listeners->register_listener(EventType::of("Written"), [](const auto&) {});
  auto o = options();
  o.poller.interval = 20ms;
  auto ob = Outbox::single_node(o);
  ob.start();
  OutboxWriter poller_only(tx_context, store);  // no hot path: every event goes by the poller
  pool->acquire()->execute("CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER)");
  pool->acquire()->execute(
      "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 1000) "
      "INSERT INTO accounts SELECT i, 0 FROM n");
  constexpr int kWriters = 4;
  constexpr int kEach = 2000;
  std::vector<std::thread> writers;
  for (int w = 0; w < kWriters; ++w) {
    writers.emplace_back([&] {
      for (int i = 0; i < kEach; ++i) {
        auto t = tx->begin();
        t.connection().execute("UPDATE accounts SET balance = balance + 1 WHERE id = ?",
                               {std::int64_t{i % 1000 + 1}});
        poller_only.write(EventType::of("Written"), R"({"n":1})");
        t.commit();
      }
    });
  }
  for (auto& t : writers) {
    t.join();
  }
  const int done_when_written = count(EventStatus::Done);
  EXPECT_GE(done_when_written, kWriters * kEach / 2)
      << done_when_written << " of " << kWriters * kEach << " DONE when the writers stopped";
  EXPECT_TRUE(wait_until([&] { return count(EventStatus::Done) == kWriters * kEach; }));
  ob.close();
}

TEST_F(OutboxSqliteTest, DeadEventManagerThrowsDatabaseErrors) {
  DeadEventManager broken(pool, std::make_shared<sqlite::SqliteOutboxStore>(
                                    sqlite::SqliteOutboxStore::Options{.table = "missing"}));
  EXPECT_THROW(broken.count(), StoreError);
  EXPECT_THROW(broken.query(std::nullopt, std::nullopt, 10), StoreError);
  EXPECT_THROW(broken.replay("x0"), StoreError);
  EXPECT_THROW(broken.replay_all(std::nullopt, std::nullopt), StoreError);
}

}  // namespace
}  // namespace outbox

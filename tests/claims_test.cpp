// Claims under pressure on every engine: two healthy nodes whose queues hold rows longer than the
// lease, a node whose claim was taken over writing a late outcome, and a queued event whose claim
// lapsed before a worker reached it.

#include <gtest/gtest.h>

#include <future>
#include <map>
#include <mutex>

#include "outbox/dispatcher.hpp"
#include "outbox/errors.hpp"
#include "outbox/listener.hpp"
#include "outbox/mysql/driver.hpp"
#include "outbox/mysql/store.hpp"
#include "outbox/outbox.hpp"
#include "outbox/postgres/driver.hpp"
#include "outbox/postgres/store.hpp"
#include "outbox/sqlite/driver.hpp"
#include "outbox/sqlite/store.hpp"
#include "outbox/store.hpp"
#include "outbox/transaction.hpp"
#include "tests/support/engines.hpp"
#include "tests/support/servers.hpp"
#include "tests/support/test_support.hpp"

namespace outbox {
namespace {

using namespace std::chrono_literals;

using testing::Engine;

class Claims : public ::testing::TestWithParam<Engine> {
 protected:
  void SetUp() override {
    auto url = GetParam().url();
    OUTBOX_REQUIRE_SERVER(url, "the " + GetParam().name + " server");
    url_ = *url;
    table_ = testing::unique_table("claims");
    const auto& engine = GetParam().name;
    if (engine == "sqlite") {
      url_ = dir_.file("claims.db");
      store_ = std::make_shared<sqlite::SqliteOutboxStore>(
          sqlite::SqliteOutboxStore::Options{.table = table_});
    } else if (engine == "postgres") {
      store_ = std::make_shared<postgres::PostgresOutboxStore>(
          postgres::PostgresOutboxStore::Options{.table = table_});
    } else {
      store_ = std::make_shared<mysql::MySqlOutboxStore>(
          mysql::MySqlOutboxStore::Options{.table = table_});
    }
    pool_ = make_pool();
    auto conn = pool_->acquire();
    if (engine == "sqlite") {
      sqlite::create_schema(*conn, table_);
    } else if (engine == "postgres") {
      postgres::create_schema(*conn, table_);
    } else {
      mysql::create_schema(*conn, table_);
    }
  }
  void TearDown() override {
    if (pool_ && GetParam().name != "sqlite") {
      pool_->acquire()->execute("DROP TABLE IF EXISTS " + table_);
    }
  }

  // Each node gets its own pool, as separate processes would.
  std::shared_ptr<sql::ConnectionPool> make_pool() {
    const auto& engine = GetParam().name;
    if (engine == "sqlite") {
      return sqlite::make_pool(url_, 4);
    }
    return engine == "postgres" ? postgres::make_pool(url_, 4) : mysql::make_pool(url_, 4);
  }
  EventEnvelope event(int i) {
    return EventEnvelope::builder(EventType::of("Work"))
        .event_id("ev-" + std::to_string(1000 + i))
        .aggregate_id("a" + std::to_string(i))
        .payload_json("{}")
        .build();
  }
  std::int64_t count(EventStatus status) {
    return store_->count_by_status(*pool_->acquire()).at(static_cast<std::size_t>(status));
  }

  testing::TempDir dir_;
  std::string url_;
  std::string table_;
  std::shared_ptr<OutboxStore> store_;
  std::shared_ptr<sql::ConnectionPool> pool_;
};

// Issue 9 item 6: the poller re-stamped only as many claimed rows as the queue had room for; rows
// deeper in the queue kept their first locked_at, expired while waiting, and the other (healthy)
// node claimed and delivered them too (80 events, queue 40, lease 1 s, 100 ms a publish: 4-7
// duplicates). A heartbeat now renews the claims of every queued and running event.
TEST_P(Claims, QueuedRowsKeepTheirClaimAcrossHealthyNodes) {
  constexpr int kEvents = 80;
  {
    std::vector<EventEnvelope> events;
    for (int i = 0; i < kEvents; ++i) {
      events.push_back(event(i));
    }
    store_->insert_batch(*pool_->acquire(), events);
  }
  std::mutex mutex;
  std::map<std::string, std::vector<std::string>> deliveries;
  auto node = [&](const std::string& name) {
    auto listeners = std::make_shared<DefaultListenerRegistry>();
    listeners->register_listener(EventType::of("Work"), [&, name](const EventEnvelope& e) {
      {
        std::lock_guard lock(mutex);
        deliveries[e.event_id()].push_back(name);
      }
      // A slow publish: the work a real listener does, not a wait the test depends on.
      std::this_thread::sleep_for(100ms);
    });
    return Outbox::multi_node({
        .connection_provider = make_pool(),
        .tx_context = std::make_shared<ThreadLocalTxContext>(),
        .store = store_,
        .listeners = listeners,
        .claim_locking = ClaimLocking{name, 1000ms},
        .dispatcher = {.worker_count = 1, .cold_queue_capacity = 40},
        // slower than the lease/10 own-claim re-stamps
        .poller = {.batch_size = 40, .interval = 200ms},
    });
  };
  auto a = node("node-a");
  auto b = node("node-b");
  a.start();
  b.start();
  ASSERT_TRUE(testing::wait_until([&] { return count(EventStatus::Done) == kEvents; }, 120s));
  a.close();
  b.close();
  std::lock_guard lock(mutex);
  EXPECT_EQ(deliveries.size(), static_cast<std::size_t>(kEvents));
  int duplicates = 0;
  for (const auto& [id, nodes] : deliveries) {
    if (nodes.size() > 1) {
      ++duplicates;
      ADD_FAILURE() << id << " delivered " << nodes.size() << " times (" << nodes[0] << ", "
                    << nodes[1] << ")";
    }
  }
  EXPECT_EQ(duplicates, 0);
}

// Found breaking issue 9: the heartbeat borrowed from the node's pool; with every connection
// held by busy work for longer than the lease, a running event's claim ran out and another node
// delivered it too. The heartbeat now renews on a connection of its own.
TEST_P(Claims, ARunningEventKeepsItsClaimWhileThePoolIsExhausted) {
  const auto e = event(3);
  store_->insert_new(*pool_->acquire(), e);
  std::mutex mutex;
  std::vector<std::string> deliveries;
  std::atomic<bool> started{false};
  std::atomic<bool> release{false};
  auto registry = [&](const std::string& name) {
    auto listeners = std::make_shared<DefaultListenerRegistry>();
    listeners->register_listener(EventType::of("Work"), [&, name](const EventEnvelope&) {
      {
        std::lock_guard lock(mutex);
        deliveries.push_back(name);
      }
      started = true;
      // Slow work, several leases long; ends when the test says so (bounded).
      testing::wait_until([&] { return release.load(); }, 30s);
    });
    return listeners;
  };
  auto pool_a = make_pool();
  auto a = Outbox::multi_node({.connection_provider = pool_a,
                               .tx_context = std::make_shared<ThreadLocalTxContext>(),
                               .store = store_,
                               .listeners = registry("node-a"),
                               .claim_locking = ClaimLocking{"node-a", 1000ms},
                               .dispatcher = {.worker_count = 1},
                               .poller = {.interval = 30ms}});
  a.start();
  ASSERT_TRUE(testing::wait_until([&] { return started.load(); }));
  auto b = Outbox::multi_node({.connection_provider = make_pool(),
                               .tx_context = std::make_shared<ThreadLocalTxContext>(),
                               .store = store_,
                               .listeners = registry("node-b"),
                               .claim_locking = ClaimLocking{"node-b", 1000ms},
                               .dispatcher = {.worker_count = 1},
                               .poller = {.interval = 30ms}});
  b.start();
  {
    // Node A's pool exhausted for three leases, as busy business transactions would. The lease is
    // long enough that one slow renewal on a loaded machine (a quarter lease) is not a lapse.
    std::vector<sql::PooledConnection> held;
    for (int i = 0; i < 4; ++i) {
      held.push_back(pool_a->acquire());
    }
    const auto until = std::chrono::steady_clock::now() + 3000ms;
    testing::wait_until([&] { return std::chrono::steady_clock::now() >= until; }, 10s);
  }
  release = true;
  ASSERT_TRUE(testing::wait_until(
      [&] { return store_->find(*pool_->acquire(), e.event_id())->status == EventStatus::Done; }));
  a.close();
  b.close();
  std::lock_guard lock(mutex);
  EXPECT_EQ(deliveries, (std::vector<std::string>{"node-a"}));
}

// Found breaking issue 9: the heartbeat took every id it sent as renewed, though the renewal skips
// rows locked right now; a queued event whose row another session held locked kept a fresh claim
// time in the node while its claim ran out in the table, and both nodes delivered it.
TEST_P(Claims, AQueuedEventWhoseRenewalWasSkippedIsNotDeliveredTwice) {
  if (GetParam().name == "sqlite") {
    GTEST_SKIP() << "not on SQLite: one writer at a time, no row locks held by another session";
  }
  const bool pg = GetParam().name == "postgres";
  std::mutex mutex;
  std::map<std::string, std::vector<std::string>> deliveries;
  std::atomic<bool> slow_started{false};
  std::atomic<bool> slow_done{false};
  auto registry = [&](const std::string& name) {
    auto listeners = std::make_shared<DefaultListenerRegistry>();
    listeners->register_listener(EventType::of("Work"), [&, name](const EventEnvelope& e) {
      {
        std::lock_guard lock(mutex);
        deliveries[e.event_id()].push_back(name);
      }
      if (e.event_id() == event(10).event_id()) {
        slow_started = true;
        // Slow work, several leases long, ended by the test (the queued event waits behind it).
        testing::wait_until([&] { return slow_done.load(); }, 30s);
      }
    });
    return listeners;
  };
  auto slow = event(10);
  auto queued = event(11);
  auto context = std::make_shared<ThreadLocalTxContext>();
  auto pool_a = make_pool();
  auto a = Outbox::multi_node({.connection_provider = pool_a,
                               .tx_context = context,
                               .store = store_,
                               .listeners = registry("node-a"),
                               .claim_locking = ClaimLocking{"node-a", 400ms},
                               .dispatcher = {.worker_count = 1},
                               .poller = {.interval = 30ms}});
  a.start();
  {
    TransactionManager tm(pool_a, context);
    auto txn = tm.begin();
    a.writer().write_all({slow, queued});  // node A's hot path takes both
    txn.commit();
  }
  ASSERT_TRUE(testing::wait_until([&] { return slow_started.load(); }));
  {
    // Another session holds the queued row locked for two and a half leases.
    auto locker = make_pool();
    auto conn = locker->acquire();
    conn->begin();
    conn->query(
        "SELECT event_id FROM " + table_ + " WHERE event_id = " + (pg ? "$1" : "?") + " FOR UPDATE",
        {sql::TextRef{queued.event_id()}});
    auto b = Outbox::multi_node({.connection_provider = make_pool(),
                                 .tx_context = std::make_shared<ThreadLocalTxContext>(),
                                 .store = store_,
                                 .listeners = registry("node-b"),
                                 .claim_locking = ClaimLocking{"node-b", 400ms},
                                 .dispatcher = {.worker_count = 1},
                                 .poller = {.interval = 5ms}});
    b.start();
    // The fault: the lock stays for two and a half leases; then the slow work goes on for one
    // more lease, time enough for node B to take the queued row if its claim had run out.
    auto hold = [](std::chrono::milliseconds d) {
      const auto until = std::chrono::steady_clock::now() + d;
      testing::wait_until([&] { return std::chrono::steady_clock::now() >= until; }, d + 1s);
    };
    hold(1000ms);
    conn->rollback();
    hold(500ms);
    slow_done = true;
    ASSERT_TRUE(testing::wait_until([&] { return count(EventStatus::Done) == 2; }));
    b.close();
  }
  a.close();
  std::lock_guard lock(mutex);
  EXPECT_EQ(deliveries[queued.event_id()].size(), 1u);
  EXPECT_EQ(deliveries[slow.event_id()].size(), 1u);
}

// Found breaking issue 9: a row's claim is stamped when the insert statement starts, but the node
// counted the lease from when the write returned; an insert that waited (on MariaDB behind a table
// lock, or a large batch) came back with claims already older than the lease, another node took
// them, and the writing node's hot path delivered them too. The node now counts from before the
// statement was sent. This guard (an insert held behind LOCK TABLES for 1.5 leases delivers every
// event once) did not reproduce the race on this machine without the fix; the hostile tester's
// reproduction used 3,000 x 8 KB batches under load, too timing-dependent for the suite.
TEST_P(Claims, AnInsertThatWaitedDoesNotHandOutRowsItsHotPathDelivers) {
  if (GetParam().name != "mysql") {
    GTEST_SKIP() << "not on " << testing::display_name(GetParam().name)
                 << ": the insert waits behind MariaDB's LOCK TABLES ... READ";
  }
  std::mutex mutex;
  std::map<std::string, int> deliveries;
  auto registry = [&] {
    auto listeners = std::make_shared<DefaultListenerRegistry>();
    listeners->register_listener(EventType::of("Work"), [&](const EventEnvelope& e) {
      std::lock_guard lock(mutex);
      ++deliveries[e.event_id()];
    });
    return listeners;
  };
  auto context = std::make_shared<ThreadLocalTxContext>();
  auto pool_a = make_pool();
  auto a = Outbox::multi_node({.connection_provider = pool_a,
                               .tx_context = context,
                               .store = store_,
                               .listeners = registry(),
                               .claim_locking = ClaimLocking{"node-a", 1000ms},
                               .poller = {.interval = 20ms}});
  a.start();
  auto b = Outbox::multi_node({.connection_provider = make_pool(),
                               .tx_context = std::make_shared<ThreadLocalTxContext>(),
                               .store = store_,
                               .listeners = registry(),
                               .claim_locking = ClaimLocking{"node-b", 1000ms},
                               .poller = {.interval = 20ms}});
  b.start();
  auto locker_pool = make_pool();
  auto locker = locker_pool->acquire();
  locker->execute("LOCK TABLES " + table_ + " READ");
  constexpr int kEvents = 20;
  auto writing = std::async(std::launch::async, [&] {
    TransactionManager tm(pool_a, context);
    auto txn = tm.begin();
    std::vector<EventEnvelope> events;
    for (int i = 0; i < kEvents; ++i) {
      events.push_back(EventEnvelope::builder(EventType::of("Work")).payload_json("{}").build());
    }
    a.writer().write_all(std::move(events));
    txn.commit();
  });
  // The insert waits behind the lock for one and a half leases.
  EXPECT_EQ(writing.wait_for(1500ms), std::future_status::timeout);
  locker->execute("UNLOCK TABLES");
  writing.get();
  ASSERT_TRUE(testing::wait_until([&] { return count(EventStatus::Done) == kEvents; }, 60s));
  a.close();
  b.close();
  std::lock_guard lock(mutex);
  EXPECT_EQ(deliveries.size(), static_cast<std::size_t>(kEvents));
  for (const auto& [id, n] : deliveries) {
    EXPECT_EQ(n, 1) << id << " delivered " << n << " times";
  }
}

// Found breaking issue 9: on PostgreSQL the status purger's conditions stood only in its
// sub-select; a DEAD row replayed while the DELETE waited for its lock was deleted anyway, a
// pending event lost.
// (PostgreSQL only in the suite: MariaDB's single-table DELETE re-evaluates its conditions per
// row, and its lock-wait variant of this test aborted once here; not investigated.)
TEST_P(Claims, APurgeNeverDeletesARowReplayedMeanwhile) {
  if (GetParam().name == "sqlite") {
    GTEST_SKIP() << "not on SQLite: one writer at a time, no row locks held by another session";
  }
  if (GetParam().name == "mysql") {
    GTEST_SKIP() << "not on MariaDB: its single-table DELETE re-evaluates its conditions per row "
                    "(see above)";
  }
  const auto e = event(20);
  store_->insert_new(*pool_->acquire(), e);
  const auto long_ago = std::chrono::system_clock::now() - 30 * 24h;
  store_->mark_dead(*pool_->acquire(), e.event_id(), long_ago, "gave up");
  auto replayer = pool_->acquire();
  replayer->begin();
  ASSERT_EQ(store_->replay_dead(*replayer, e.event_id(), std::chrono::system_clock::now()), 1);
  auto purge = std::async(std::launch::async, [&] {
    auto purger =
        GetParam().name == "postgres"
            ? std::shared_ptr<EventPurger>(std::make_shared<postgres::PostgresEventPurger>(table_))
            : std::shared_ptr<EventPurger>(std::make_shared<mysql::MySqlEventPurger>(table_));
    auto conn = make_pool()->acquire();
    return purger->purge(*conn, std::chrono::system_clock::now(), 500);
  });
  // Let the DELETE reach the row lock where the engine makes it wait (PostgreSQL does; the
  // result must hold whether it waits or not, so the wait is bounded and not asserted).
  const std::string waiting =
      GetParam().name == "postgres"
          ? "SELECT COUNT(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE "
            "'DELETE FROM " +
                table_ + "%'"
          : "SELECT COUNT(*) FROM information_schema.innodb_trx WHERE trx_state = 'LOCK WAIT'";
  testing::wait_until([&] { return pool_->acquire()->query(waiting).at(0).get_int(0) > 0; }, 3s);
  replayer->commit();
  EXPECT_EQ(purge.get(), 0);
  auto row = store_->find(*pool_->acquire(), e.event_id());
  ASSERT_TRUE(row) << "a replayed, pending event was purged";
  EXPECT_EQ(row->status, EventStatus::New);
}

// Issue 9 item 8: a node whose claim expired and was taken over must not overwrite the new
// owner's outcome: its late PermanentFailure used to mark the row DEAD.
TEST_P(Claims, AStaleOwnersLateOutcomeChangesNothing) {
  const auto e = event(1);
  store_->insert_new(*pool_->acquire(), e, "node-b");  // node-b holds it now
  auto listeners = std::make_shared<DefaultListenerRegistry>();
  listeners->register_listener(EventType::of("Work"), [](const EventEnvelope&) {
    throw PermanentFailure("late failure from a node that lost the claim");
  });
  OutboxDispatcher dispatcher({.connection_provider = pool_,
                               .store = store_,
                               .listeners = listeners,
                               .worker_count = 1,
                               .claim_owner = "node-a",
                               .claim_timeout = 60s});
  dispatcher.start();
  ASSERT_TRUE(dispatcher.enqueue_cold(QueuedEvent{e, QueuedEvent::Source::Cold, 0}));
  // Finished once the in-flight entry is released again.
  ASSERT_TRUE(testing::wait_until([&] {
    if (dispatcher.reserve(e.event_id())) {
      dispatcher.release_reservation(e.event_id());
      return true;
    }
    return false;
  }));
  dispatcher.close();
  auto row = store_->find(*pool_->acquire(), e.event_id());
  EXPECT_EQ(row->status, EventStatus::New);
  EXPECT_EQ(row->locked_by, "node-b");
  EXPECT_EQ(row->attempts, 0);
  EXPECT_FALSE(row->last_error);
}

// A queued event whose claim is older than half the lease (its heartbeat could not renew it, or
// its transaction stayed open that long) is dropped unprocessed: another node may hold it now.
TEST_P(Claims, AnEventWhoseClaimLapsedInTheQueueIsNotDelivered) {
  const auto e = event(2);
  store_->insert_new(*pool_->acquire(), e, "node-a");
  std::atomic<int> calls{0};
  auto listeners = std::make_shared<DefaultListenerRegistry>();
  listeners->register_listener(EventType::of("Work"), [&](const EventEnvelope&) { ++calls; });
  OutboxDispatcher dispatcher({.connection_provider = pool_,
                               .store = store_,
                               .listeners = listeners,
                               .worker_count = 1,
                               .claim_owner = "node-a",
                               .claim_timeout = 2s});
  dispatcher.start();
  ASSERT_TRUE(dispatcher.enqueue_cold(
      QueuedEvent{e, QueuedEvent::Source::Cold, 0, std::chrono::steady_clock::now() - 1500ms}));
  ASSERT_TRUE(testing::wait_until([&] { return dispatcher.expired_claims_dropped() == 1; }));
  dispatcher.close();
  EXPECT_EQ(calls.load(), 0);
  EXPECT_EQ(store_->find(*pool_->acquire(), e.event_id())->status, EventStatus::New);
}

INSTANTIATE_TEST_SUITE_P(Engines, Claims, testing::all_engines(), testing::engine_name);

}  // namespace
}  // namespace outbox

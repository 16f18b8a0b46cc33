// The database restarts under a running dispatcher and poller: they log, back off and resume
// without a process restart and without losing events. Runs alone (RUN_SERIAL): it stops the
// shared test server.

#include <gtest/gtest.h>

#include <fstream>
#include <iostream>
#include <mutex>
#include <set>

#include "outbox/errors.hpp"
#include "outbox/listener.hpp"
#include "outbox/log.hpp"
#include "outbox/mysql/driver.hpp"
#include "outbox/mysql/store.hpp"
#include "outbox/outbox.hpp"
#include "outbox/postgres/driver.hpp"
#include "outbox/postgres/store.hpp"
#include "outbox/retry_policy.hpp"
#include "outbox/transaction.hpp"
#include "tests/support/servers.hpp"
#include "tests/support/test_support.hpp"

namespace outbox {
namespace {

using namespace std::chrono_literals;

struct Engine {
  std::string name;
  const char* url_variable;
};

class ConnectionLoss : public ::testing::TestWithParam<Engine> {
 protected:
  bool mysql() const { return GetParam().name == "mysql"; }

  void stop_server() {
    if (mysql()) {
      const auto pidfile = *testing::env("OUTBOX_TEST_MYSQL_PIDFILE");
      std::string pid;
      std::ifstream(pidfile) >> pid;
      ASSERT_EQ(std::system(("kill " + pid).c_str()), 0);
      ASSERT_TRUE(testing::wait_until([&] { return !std::ifstream(pidfile).good(); }, 60s));
    } else {
      ASSERT_EQ(
          std::system((*testing::env("OUTBOX_TEST_PG_CTL") + " stop -m fast >/dev/null").c_str()),
          0);
    }
  }
  // Starts the server again on the same data directory and port.
  void start_server() {
    if (mysql()) {
      ASSERT_EQ(
          std::system((*testing::env("OUTBOX_TEST_MYSQL_CTL") + " >/dev/null 2>&1 &").c_str()), 0);
    } else {
      ASSERT_EQ(std::system((*testing::env("OUTBOX_TEST_PG_CTL") + " start >/dev/null").c_str()),
                0);
    }
  }
};

TEST_P(ConnectionLoss, DispatcherAndPollerResumeAfterTheServerRestarts) {
  auto url = testing::env(GetParam().url_variable);
  OUTBOX_REQUIRE_SERVER(url, GetParam().name);
  if (!testing::env(mysql() ? "OUTBOX_TEST_MYSQL_CTL" : "OUTBOX_TEST_PG_CTL")) {
    OUTBOX_SKIP_NO_SERVER() << "no command to stop and start the " << GetParam().name
                            << " server (see scripts/with-test-servers)";
  }
  set_log_level(LogLevel::Error);
  auto pool = mysql() ? mysql::make_pool(*url, 8) : postgres::make_pool(*url, 8);
  const auto table = testing::unique_table("restart");
  std::shared_ptr<OutboxStore> store;
  if (mysql()) {
    mysql::create_schema(*pool->acquire(), table);
    store =
        std::make_shared<mysql::MySqlOutboxStore>(mysql::MySqlOutboxStore::Options{.table = table});
  } else {
    postgres::create_schema(*pool->acquire(), table);
    store = std::make_shared<postgres::PostgresOutboxStore>(
        postgres::PostgresOutboxStore::Options{.table = table});
  }
  std::mutex m;
  std::set<std::string> delivered;
  auto listeners = std::make_shared<DefaultListenerRegistry>();
  listeners->register_listener(EventType::of("E"), [&](const EventEnvelope& e) {
    std::lock_guard lock(m);
    delivered.insert(e.event_id());
  });
  auto tx_context = std::make_shared<ThreadLocalTxContext>();
  TransactionManager tx(pool, tx_context);
  auto ob = Outbox::single_node(
      {.connection_provider = pool,
       .tx_context = tx_context,
       .store = store,
       .listeners = listeners,
       .dispatcher = {.retry_policy =
                          std::make_shared<ExponentialBackoffRetryPolicy>(100ms, 500ms)},
       .poller = {.interval = 200ms}});
  ob.start();
  std::set<std::string> committed;
  int failed_writes = 0;
  // Writes until `n` transactions have committed; failed attempts (server down, stale pooled
  // connections) are counted and retried, bounded.
  auto write = [&](int n) {
    for (int ok = 0, attempts = 0; ok < n && attempts < 5000; ++attempts) {
      try {
        auto t = tx.begin();
        auto id = *ob.writer().write(EventType::of("E"), "{}");
        t.commit();
        committed.insert(id);
        ++ok;
      } catch (const StoreError&) {
        ++failed_writes;
        std::this_thread::sleep_for(10ms);  // pause before retrying a failed write
      }
    }
  };
  auto all_delivered = [&] {
    std::lock_guard lock(m);
    return std::includes(delivered.begin(), delivered.end(), committed.begin(), committed.end());
  };
  write(100);
  ASSERT_TRUE(testing::wait_until(all_delivered, 60s));

  stop_server();
  // While the server is down writes fail with StoreError and the poller keeps cycling (its
  // errors are logged), without anything being lost.
  int refused = 0;
  for (int i = 0; i < 5; ++i) {
    try {
      auto t = tx.begin();
      ob.writer().write(EventType::of("E"), "{}");
      t.commit();
    } catch (const StoreError&) {
      ++refused;
    }
  }
  EXPECT_EQ(refused, 5);
  const auto cycles = ob.poller()->completed_cycles();
  ASSERT_TRUE(testing::wait_until([&] { return ob.poller()->completed_cycles() >= cycles + 2; }));
  start_server();
  write(100);  // the first attempts meet connections the restart broke
  ASSERT_EQ(committed.size(), 200u);
  ASSERT_TRUE(testing::wait_until(
      [&] {
        try {
          auto counts = store->count_by_status(*pool->acquire());
          return all_delivered() && counts[1] == 200;
        } catch (const StoreError&) {
          return false;
        }
      },
      120s));
  ob.close();
  std::cout << "[ figures  ] " << GetParam().name << ": 200 committed around a restart, " << refused
            << " writes refused while down, " << failed_writes
            << " failed attempts retried after, all delivered and DONE\n";
  pool->acquire()->execute("DROP TABLE " + table);
}

INSTANTIATE_TEST_SUITE_P(Engines, ConnectionLoss,
                         ::testing::Values(Engine{"postgres", "OUTBOX_TEST_PG_URL"},
                                           Engine{"mysql", "OUTBOX_TEST_MYSQL_URL"}),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace outbox

// Wake-ups: a relay polling once an hour still delivers at once what another process commits —
// PostgreSQL through the writer's NOTIFY and the relay's LISTEN, SQLite through data_version — and
// listens again after its connection is killed, polling at once for what it may have missed. The
// writer's CommitNotifier sends one NOTIFY per interval after commits, none for a rollback.

#include <gtest/gtest.h>
#include <httplib.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <future>
#include <mutex>
#include <regex>

#include "outbox/detect/detect.hpp"
#include "outbox/envelope.hpp"
#include "outbox/outbox.hpp"
#include "outbox/postgres/notifications.hpp"
#include "outbox/sql/connection.hpp"
#include "outbox/transaction.hpp"
#include "tests/support/http_server.hpp"
#include "tests/support/relay_cli.hpp"
#include "tests/support/sql_client.hpp"

namespace outbox {
namespace {

using testing::RelayProcess;
using testing::wait_until;

class Wakeups : public testing::RelayDatabaseTest {
 protected:
  void SetUp() override {
    RelayDatabaseTest::SetUp();
    if (skipped_or_failed()) {
      return;
    }
    table_ = migrate_table("wake");
    http_.respond([this](const testing::ReceivedRequest& r, httplib::Response& res) {
      std::lock_guard lock(mutex_);
      received_.push_back(r.header("X-Outbox-Event-Id"));
      res.set_content("ok", "text/plain");
    });
  }

  // An hour between polls: within a test, only a wake-up makes the relay look again.
  std::unique_ptr<RelayProcess> start_relay(const std::string& wakeup = "auto") {
    std::string config = "[database]\nurl = \"" + url_ + "\"\ntable = \"" + table_ + "\"\n";
    config += "[poller]\ninterval = \"1h\"\nwakeup = \"" + wakeup + "\"\n";
    config += "[admin]\nport = 0\n[publishers.hook]\ntype = \"http\"\n";
    config += "[[routes]]\npublisher = \"hook\"\ntarget = \"" + http_.url("/events") + "\"\n";
    return std::make_unique<RelayProcess>(dir_, config, "relay");
  }

  // A service in another language commits a row; on PostgreSQL it then notifies, after its
  // commit and outside its transaction, as docs/writing-rows.md shows.
  void commit_row(const std::string& id, bool notify = true) {
    const std::string begin = GetParam() == "sqlite" ? "BEGIN IMMEDIATE;\n" : "BEGIN;\n";
    std::string sql = begin + "INSERT INTO " + table_ +
                      " (event_id, event_type, payload) VALUES ('" + id +
                      "', 'OrderPlaced', '{}');\nCOMMIT;\n";
    if (GetParam() == "postgres" && notify) {
      sql += "SELECT pg_notify('" + postgres::notification_channel(table_) + "', '');\n";
    }
    const auto client = testing::run_sql_client(dir_, GetParam(), url_, sql);
    ASSERT_EQ(client.exit_code, 0) << client.err;
  }

  bool received(const std::string& id) {
    std::lock_guard lock(mutex_);
    return std::find(received_.begin(), received_.end(), id) != received_.end();
  }

  static std::int64_t metric(int port, const std::string& name) {
    httplib::Client admin("127.0.0.1", port);
    auto res = admin.Get("/metrics");
    if (!res || res->status != 200) {
      return -1;
    }
    std::smatch m;
    const std::regex line("\n" + name + " ([0-9.e+]+)");
    return std::regex_search(res->body, m, line) ? static_cast<std::int64_t>(std::stod(m[1])) : -1;
  }

  // The pid of the relay's LISTEN session on this test's table (0 while there is none).
  int listener_pid() {
    auto pool = open_pool(url_, 1);
    auto conn = pool->acquire();
    const sql::Value query[] = {"LISTEN \"" + postgres::notification_channel(table_) + "\""};
    const auto rows = conn->query(
        "SELECT pid FROM pg_stat_activity WHERE application_name = 'outbox-wakeup' AND query = $1 "
        "AND state = 'idle'",
        query);
    return rows.empty() ? 0 : static_cast<int>(rows.front().get_int(0));
  }

  std::string table_;
  testing::HttpTestServer http_;
  std::mutex mutex_;
  std::vector<std::string> received_;
};

TEST_P(Wakeups, CommitsOfAnotherProcessAreDeliveredWithoutWaitingForThePollInterval) {
  if (GetParam() == "mysql") {
    GTEST_SKIP() << "MariaDB has no cross-process hint: its relay polls adaptively "
                    "(PollerTest.AdaptiveWaits…)";
  }
  auto relay = start_relay();
  const int port = relay->admin_port();
  ASSERT_GT(port, 0) << relay->log();
  ASSERT_TRUE(wait_until([&] {
    const auto log = relay->log();
    return log.find("NotificationWatcher: listening on") != std::string::npos ||
           log.find("DataVersionWatcher: watching") != std::string::npos;
  })) << relay->log();
  // The relay's first poll and the watcher's first one may take one row each; the rest are
  // delivered only because a hint woke the relay.
  for (int n = 1; n <= 4; ++n) {
    const std::string id = "01JWAKE000000000000000000" + std::to_string(n);
    commit_row(id);
    ASSERT_TRUE(wait_until([&] { return received(id); }))
        << "event " << n << " waits for the hour-long poll interval\n"
        << relay->log();
  }
  EXPECT_GE(metric(port, "outbox_wakeups_total"), 2);
  EXPECT_EQ(metric(port, "outbox_wakeup_reconnects_total"), 0);
}

TEST_P(Wakeups, SubscriptionsAreWokenByCommitsOfAnotherProcessToo) {
  if (GetParam() == "mysql") {
    GTEST_SKIP() << "MariaDB has no cross-process hint";
  }
  std::string config = "[database]\nurl = \"" + url_ + "\"\ntable = \"" + table_ + "\"\n";
  config += "[admin]\nport = 0\n[publishers.hook]\ntype = \"http\"\n";
  config += "[[subscriptions]]\nname = \"audit\"\npublisher = \"hook\"\ntarget = \"" +
            http_.url("/audit") + "\"\ninterval = \"1h\"\nbackoff_max = \"1h\"\n";
  RelayProcess relay(dir_, config, "stream-relay");
  const int port = relay.admin_port();
  ASSERT_GT(port, 0) << relay.log();
  // The first row shows the subscription running (its lease held, its first reads done); each
  // later one reaches it only through a hint.
  commit_row("01JWAKESTREAM0000000000001");
  ASSERT_TRUE(wait_until([&] { return received("01JWAKESTREAM0000000000001"); })) << relay.log();
  for (int n = 2; n <= 4; ++n) {
    const std::string id = "01JWAKESTREAM000000000000" + std::to_string(n);
    commit_row(id);
    ASSERT_TRUE(wait_until([&] { return received(id); }))
        << "event " << n << " waits for the hour-long poll interval\n"
        << relay.log();
  }
  EXPECT_GE(metric(port, "outbox_wakeups_total"), 3);
}

TEST_P(Wakeups, AListenerWhoseConnectionIsKilledListensAgainAndPollsForWhatItMissed) {
  if (GetParam() != "postgres") {
    GTEST_SKIP() << "LISTEN is PostgreSQL's";
  }
  auto relay = start_relay();
  const int port = relay->admin_port();
  ASSERT_GT(port, 0) << relay->log();
  int first = 0;
  ASSERT_TRUE(wait_until([&] { return (first = listener_pid()) != 0; })) << relay->log();
  // Committed without a NOTIFY: nothing tells the relay; only the poll after the new LISTEN finds
  // it (the row exists before the connection is killed, so that poll must see it).
  commit_row("01JWAKEMISSED0000000000000", false);
  {
    auto pool = open_pool(url_, 1);
    const sql::Value pid[] = {std::int64_t{first}};
    pool->acquire()->query("SELECT pg_terminate_backend($1)", pid);
  }
  int second = 0;
  ASSERT_TRUE(wait_until([&] {
    second = listener_pid();
    return second != 0 && second != first;
  })) << relay->log();
  ASSERT_TRUE(wait_until([&] { return received("01JWAKEMISSED0000000000000"); })) << relay->log();
  ASSERT_TRUE(wait_until([&] { return metric(port, "outbox_wakeup_reconnects_total") == 1; }));
  commit_row("01JWAKEAFTERKILL0000000000");  // and the new session hears notifications
  ASSERT_TRUE(wait_until([&] { return received("01JWAKEAFTERKILL0000000000"); })) << relay->log();
  EXPECT_NE(relay->log().find("NotificationWatcher: listening again"), std::string::npos);
}

TEST_P(Wakeups, TheWriterNotifiesOncePerIntervalAfterCommitsAndNeverForARollback) {
  if (GetParam() != "postgres") {
    GTEST_SKIP() << "NOTIFY is PostgreSQL's";
  }
  auto pool = open_pool(url_, 4);
  auto store = detect_store(*pool->acquire(), table_);
  std::atomic<int> heard{0}, connected{0};
  postgres::NotificationWatcher watcher({.conninfo = url_, .table = table_});
  watcher.start([&](ChangeWatcher::Signal s) {
    (s == ChangeWatcher::Signal::Changed ? heard : connected)++;
  });
  ASSERT_TRUE(wait_until([&] { return connected == 1; }));

  auto notifier = std::make_shared<postgres::CommitNotifier>(postgres::CommitNotifier::Options{
      .connection_provider = pool, .table = table_, .min_interval = std::chrono::hours(1)});
  auto context = std::make_shared<ThreadLocalTxContext>();
  auto outbox =
      Outbox::writer_only({.tx_context = context, .store = store, .writer_hooks = {notifier}});
  TransactionManager transactions(pool, context);
  auto write = [&](int n, bool commit) {
    auto tx = transactions.begin();
    outbox.writer().write(EventType::of("Pinged"), "{\"n\": " + std::to_string(n) + "}");
    commit ? tx.commit() : tx.rollback();
  };
  write(0, false);  // a rollback owes nobody a NOTIFY
  EXPECT_EQ(notifier->sent(), 0u);
  write(1, true);
  ASSERT_TRUE(wait_until([&] { return notifier->sent() == 1 && heard == 1; }));
  for (int n = 2; n < 40; ++n) {
    write(n, true);  // within the hour after the first NOTIFY: one owed, none sent
  }
  EXPECT_EQ(notifier->sent(), 1u);
  notifier->close();  // sends the one owed
  EXPECT_EQ(notifier->sent(), 2u);
  ASSERT_TRUE(wait_until([&] { return heard == 2; }));
  write(40, true);  // after close(): committed, delivered by polling, notified to nobody
  EXPECT_EQ(notifier->sent(), 2u);

  auto quiet = std::make_shared<postgres::CommitNotifier>(
      postgres::CommitNotifier::Options{.connection_provider = pool, .table = table_});
  auto quiet_outbox =
      Outbox::writer_only({.tx_context = context, .store = store, .writer_hooks = {quiet}});
  {
    auto tx = transactions.begin();
    quiet_outbox.writer().write(EventType::of("Pinged"), "{}");
    tx.rollback();
  }
  quiet->close();
  EXPECT_EQ(quiet->sent(), 0u);
  watcher.close();
}

TEST_P(Wakeups, AWakeUpTheEngineDoesNotHaveIsRefusedAndAutoPicksOneItHas) {
  const std::string foreign = GetParam() == "postgres" ? "data_version" : "listen";
  auto refused = start_relay(foreign);
  const auto code = refused->wait();
  ASSERT_TRUE(code.has_value());
  EXPECT_NE(*code, 0);
  EXPECT_NE(refused->log().find("poller.wakeup = \"" + foreign + "\" needs"), std::string::npos)
      << refused->log();
  // "auto" on every engine, "adaptive" and "off" on any: a relay that starts and delivers the
  // row it finds at its first poll.
  for (const std::string wakeup : {"auto", "adaptive", "off"}) {
    const std::string id = "01JWAKEMODE" + std::string(15 - wakeup.size(), '0') + wakeup;
    commit_row(id, false);
    auto relay = start_relay(wakeup);
    ASSERT_TRUE(wait_until([&] { return received(id); })) << wakeup << "\n" << relay->log();
    EXPECT_EQ(relay->terminate(), 0) << relay->log();
  }
}

// A server that accepts the connection and never answers (a black hole: a frozen host, a proxy
// that swallows traffic): close() returns at once instead of waiting out the connect timeout,
// and the watcher says why it does not listen.
TEST(NotificationWatcher, CloseDoesNotWaitForAServerThatNeverAnswers) {
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(listener, 8), 0);  // connections complete in the backlog, never served
  socklen_t len = sizeof addr;
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
  postgres::NotificationWatcher watcher(
      {.conninfo =
           "host=127.0.0.1 port=" + std::to_string(ntohs(addr.sin_port)) + " dbname=none user=none",
       .timeouts = {.connect = std::chrono::minutes(10), .io = std::chrono::minutes(10)}});
  std::atomic<int> signals{0};
  watcher.start([&](ChangeWatcher::Signal) { ++signals; });
  // Once accepted, the watcher waits for the server's answer to its start-up message.
  int client = -1;
  ASSERT_TRUE(wait_until([&] {
    client = ::accept4(listener, nullptr, nullptr, SOCK_NONBLOCK);
    return client >= 0;
  }));
  auto closing = std::async(std::launch::async, [&] { watcher.close(); });
  // Bounded only to report a hang instead of blocking the suite: close() takes milliseconds.
  EXPECT_EQ(closing.wait_for(std::chrono::seconds(60)), std::future_status::ready);
  EXPECT_EQ(signals.load(), 0);  // never listening, never a hint
  ::close(client);
  ::close(listener);
}

INSTANTIATE_TEST_SUITE_P(Engines, Wakeups, ::testing::Values("sqlite", "postgres", "mysql"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace outbox

// Transactions the caller owns (raw sqlite3*, PGconn*, MYSQL*, and a libpqxx pqxx::work) carry the
// business row and the outbox row together; the hot path delivers only after the caller's commit.

#include <gtest/gtest.h>
#include <libpq-fe.h>
#include <mysql.h>
#include <sqlite3.h>

#include <atomic>
#include <functional>
#include <pqxx/pqxx>

#include "outbox/errors.hpp"
#include "outbox/listener.hpp"
#include "outbox/mysql/driver.hpp"
#include "outbox/mysql/store.hpp"
#include "outbox/outbox.hpp"
#include "outbox/postgres/driver.hpp"
#include "outbox/postgres/store.hpp"
#include "outbox/pqxx/connection.hpp"
#include "outbox/sqlite/driver.hpp"
#include "outbox/sqlite/store.hpp"
#include "outbox/transaction.hpp"
#include "tests/support/servers.hpp"
#include "tests/support/test_support.hpp"

namespace outbox {
namespace {

using namespace std::chrono_literals;

// What one engine's caller-owned transaction looks like.
struct CallerTx {
  std::function<sql::Connection&()> conn;         // the wrapped caller connection
  std::function<void(const std::string&)> exec;   // runs SQL with the caller's own API
  std::function<void()> begin, commit, rollback;  // the caller's own transaction calls
};

// Writes a business row and an event in the caller's transaction, commits or rolls back with the
// caller's API, and checks what was stored and delivered.
void check_caller_transactions(std::shared_ptr<sql::ConnectionProvider> pool,
                               std::shared_ptr<OutboxStore> store, const std::string& business,
                               CallerTx caller) {
  std::atomic<int> delivered{0};
  auto listeners = std::make_shared<DefaultListenerRegistry>();
  listeners->register_listener(EventType::of("Paid"), [&](const EventEnvelope&) { ++delivered; });
  auto context = std::make_shared<ThreadLocalTxContext>();
  auto ob = Outbox::single_node({.connection_provider = pool,
                                 .tx_context = context,
                                 .store = store,
                                 .listeners = listeners,
                                 .poller = {.interval = 1h}});
  ob.start();
  auto count = [&](const std::string& sql) {
    return pool->acquire()->query(sql, {}).at(0).get_int(0);
  };

  caller.begin();
  std::string rolled_back;
  {
    ExternalTransaction ext(*context, caller.conn());
    caller.exec("INSERT INTO " + business + " VALUES ('rolled-back')");
    rolled_back = *ob.writer().write(EventType::of("Paid"), "{}");
    caller.rollback();
    ext.rolled_back();
  }
  EXPECT_EQ(count("SELECT COUNT(*) FROM " + business), 0);
  EXPECT_FALSE(store->find(*pool->acquire(), rolled_back));

  caller.begin();
  std::string id;
  {
    ExternalTransaction ext(*context, caller.conn());
    caller.exec("INSERT INTO " + business + " VALUES ('kept')");
    id = *ob.writer().write(EventType::of("Paid"), "{}");
    EXPECT_EQ(delivered.load(), 0);
    caller.commit();
    ext.committed();
    EXPECT_THROW(ext.committed(), std::logic_error);
  }
  EXPECT_TRUE(testing::wait_until([&] {
    auto row = store->find(*pool->acquire(), id);
    return row && row->status == EventStatus::Done;
  }));
  ob.close();
  EXPECT_EQ(count("SELECT COUNT(*) FROM " + business), 1);
  EXPECT_EQ(delivered.load(), 1);
}

TEST(CallerOwnedTransaction, RawSqliteHandle) {
  testing::TempDir dir;
  const auto path = dir.file("caller.db");
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  sqlite3_busy_timeout(db, 5000);
  auto run = [db](const std::string& sql) {
    ASSERT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr), SQLITE_OK)
        << sqlite3_errmsg(db);
  };
  run("PRAGMA journal_mode=WAL");
  run("CREATE TABLE payments (id TEXT)");
  auto conn = sqlite::wrap(db);
  sqlite::create_schema(*conn);
  check_caller_transactions(
      sqlite::make_pool(path, 2), std::make_shared<sqlite::SqliteOutboxStore>(), "payments",
      {[&]() -> sql::Connection& { return *conn; }, run, [&] { run("BEGIN IMMEDIATE"); },
       [&] { run("COMMIT"); }, [&] { run("ROLLBACK"); }});
  conn.reset();
  EXPECT_EQ(sqlite3_close(db), SQLITE_OK);
}

TEST(CallerOwnedTransaction, RawPGconn) {
  auto url = testing::env("OUTBOX_TEST_PG_URL");
  OUTBOX_REQUIRE_SERVER(url, "PostgreSQL");
  PGconn* pg = PQconnectdb(url->c_str());
  ASSERT_EQ(PQstatus(pg), CONNECTION_OK);
  auto run = [pg](const std::string& sql) {
    PGresult* r = PQexec(pg, sql.c_str());
    const auto status = PQresultStatus(r);
    EXPECT_TRUE(status == PGRES_COMMAND_OK || status == PGRES_TUPLES_OK) << PQerrorMessage(pg);
    PQclear(r);
  };
  const auto table = testing::unique_table("caller_pg");
  const auto business = table + "_payments";
  run("CREATE TABLE " + business + " (id TEXT)");
  auto conn = postgres::wrap(pg);
  postgres::create_schema(*conn, table);
  check_caller_transactions(
      postgres::make_pool(*url, 2),
      std::make_shared<postgres::PostgresOutboxStore>(
          postgres::PostgresOutboxStore::Options{.table = table}),
      business,
      {[&]() -> sql::Connection& { return *conn; }, run, [&] { run("BEGIN"); },
       [&] { run("COMMIT"); }, [&] { run("ROLLBACK"); }});
  run("DROP TABLE " + business + ", " + table);
  conn.reset();
  PQfinish(pg);
}

TEST(CallerOwnedTransaction, RawMysqlHandle) {
  auto url = testing::env("OUTBOX_TEST_MYSQL_URL");
  OUTBOX_REQUIRE_SERVER(url, "MariaDB");
  const auto o = mysql::parse_url(*url);
  MYSQL* my = mysql_init(nullptr);
  ASSERT_NE(mysql_real_connect(my, o.host.c_str(), o.user.c_str(), o.password.c_str(),
                               o.database.c_str(), o.port, nullptr, CLIENT_FOUND_ROWS),
            nullptr)
      << mysql_error(my);
  auto run = [my](const std::string& sql) {
    ASSERT_EQ(mysql_query(my, sql.c_str()), 0) << mysql_error(my);
  };
  run("SET time_zone = '+00:00'");
  const auto table = testing::unique_table("caller_my");
  const auto business = table + "_payments";
  run("CREATE TABLE " + business + " (id VARCHAR(32)) ENGINE=InnoDB");
  auto conn = mysql::wrap(my);
  mysql::create_schema(*conn, table);
  check_caller_transactions(
      mysql::make_pool(*url, 2),
      std::make_shared<mysql::MySqlOutboxStore>(mysql::MySqlOutboxStore::Options{.table = table}),
      business,
      {[&]() -> sql::Connection& { return *conn; }, run, [&] { run("START TRANSACTION"); },
       [&] { run("COMMIT"); }, [&] { run("ROLLBACK"); }});
  run("DROP TABLE " + business + ", " + table);
  conn.reset();
  mysql_close(my);
}

TEST(CallerOwnedTransaction, LibpqxxWork) {
  auto url = testing::env("OUTBOX_TEST_PG_URL");
  OUTBOX_REQUIRE_SERVER(url, "PostgreSQL");
  pqxx::connection c(*url);
  const auto table = testing::unique_table("caller_pqxx");
  const auto business = table + "_payments";
  {
    pqxx::work setup(c);
    setup.exec("CREATE TABLE " + business + " (id TEXT)");
    postgres::create_schema(*pqxx_adapter::wrap(setup), table);
    setup.commit();
  }
  // libpqxx owns begin/commit: each caller transaction is a fresh pqxx::work.
  std::unique_ptr<pqxx::work> work;
  std::unique_ptr<sql::Connection> conn;
  CallerTx caller;
  caller.conn = [&]() -> sql::Connection& { return *conn; };
  caller.begin = [&] {
    conn.reset();
    work = std::make_unique<pqxx::work>(c);
    conn = pqxx_adapter::wrap(*work);
  };
  caller.exec = [&](const std::string& sql) { work->exec(sql); };
  caller.commit = [&] { work->commit(); };
  caller.rollback = [&] { work->abort(); };
  auto store = std::make_shared<postgres::PostgresOutboxStore>(
      postgres::PostgresOutboxStore::Options{.table = table});
  check_caller_transactions(postgres::make_pool(*url, 2), store, business, caller);
  EXPECT_THROW(conn->begin(), std::logic_error);
  conn.reset();
  work.reset();  // already committed
  pqxx::work cleanup(c);
  cleanup.exec("DROP TABLE " + business + ", " + table);
  cleanup.commit();
}

// libpqxx's failures come out typed, and pqxx_adapter::commit reports the real outcome: after a
// duplicate event id the aborted transaction is not "committed" (libpqxx would take PostgreSQL's
// ROLLBACK answer for success), a session the server killed is a lost connection, and a COMMIT
// whose answer was lost (in_doubt_error) delivers nothing. Only the event committed normally is.
TEST(CallerOwnedTransaction, ErrorsOfALibpqxxWork) {
  auto url = testing::env("OUTBOX_TEST_PG_URL");
  OUTBOX_REQUIRE_SERVER(url, "PostgreSQL");
  const auto table = testing::unique_table("caller_pqxx_errors");
  auto pool = postgres::make_pool(*url, 2);
  postgres::create_schema(*pool->acquire(), table);
  auto store = std::make_shared<postgres::PostgresOutboxStore>(
      postgres::PostgresOutboxStore::Options{.table = table});
  std::atomic<int> delivered{0};
  auto listeners = std::make_shared<DefaultListenerRegistry>();
  listeners->register_listener(EventType::of("Paid"), [&](const EventEnvelope&) { ++delivered; });
  auto context = std::make_shared<ThreadLocalTxContext>();
  auto ob = Outbox::single_node({.connection_provider = pool,
                                 .tx_context = context,
                                 .store = store,
                                 .listeners = listeners,
                                 .poller = {.interval = 1h}});
  ob.start();
  auto paid = [](const std::string& id) {
    return EventEnvelope::builder(EventType::of("Paid")).event_id(id).payload_json("{}").build();
  };
  auto kill = [&](pqxx::connection& c) {
    const auto pid = std::to_string(c.backendpid());
    auto killer = pool->acquire();
    killer->query("SELECT pg_terminate_backend(" + pid + ")");
    ASSERT_TRUE(testing::wait_until([&] {
      return killer->query("SELECT count(*) FROM pg_stat_activity WHERE pid = " + pid)[0].get_int(
                 0) == 0;
    }));
  };
  // Each case a fresh libpqxx connection and work, as a caller's would be.
  auto in_work =
      [&](const std::function<void(pqxx::connection&, pqxx::work&, ExternalTransaction&)>& body) {
        pqxx::connection c(*url);
        pqxx::work w(c);
        auto conn = pqxx_adapter::wrap(w);
        ExternalTransaction ext(*context, *conn);
        body(c, w, ext);
      };
  in_work([&](pqxx::connection&, pqxx::work& w, ExternalTransaction& ext) {
    ob.writer().write(paid("p-0"));
    pqxx_adapter::commit(w, ext);
  });
  in_work([&](pqxx::connection&, pqxx::work& w, ExternalTransaction& ext) {
    ob.writer().write(paid("p-1"));
    EXPECT_THROW(ob.writer().write(paid("p-0")), DuplicateEventError);
    try {
      pqxx_adapter::commit(w, ext);
      ADD_FAILURE() << "an aborted transaction was reported committed";
    } catch (const StoreError& e) {
      EXPECT_EQ(e.sqlstate(), "25P02") << e.what();
    }
  });
  in_work([&](pqxx::connection& c, pqxx::work& w, ExternalTransaction& ext) {
    ob.writer().write(paid("p-2"));
    kill(c);
    EXPECT_THROW(ob.writer().write(paid("p-3")), ConnectionLostError);
    EXPECT_THROW(pqxx_adapter::commit(w, ext), ConnectionLostError);
  });
  in_work([&](pqxx::connection& c, pqxx::work& w, ExternalTransaction& ext) {
    ob.writer().write(paid("p-4"));
    kill(c);
    EXPECT_THROW(pqxx_adapter::commit(w, ext), CommitOutcomeUnknownError);
  });
  ob.close();
  EXPECT_EQ(delivered.load(), 1);
  auto conn = pool->acquire();
  EXPECT_TRUE(store->find(*conn, "p-0"));
  for (const std::string id : {"p-1", "p-2", "p-3", "p-4"}) {
    EXPECT_FALSE(store->find(*conn, id)) << id;
  }
  conn->execute("DROP TABLE " + table);
}

}  // namespace
}  // namespace outbox

// Driver behaviour of the server engines (SQLSTATE, binary safety, borrowed handles), dialect
// detection, and leases/due times on the database clock when node clocks are skewed.

#include <gtest/gtest.h>
#include <libpq-fe.h>

#include "outbox/detect/detect.hpp"
#include "outbox/errors.hpp"
#include "outbox/mysql/driver.hpp"
#include "outbox/mysql/store.hpp"
#include "outbox/postgres/driver.hpp"
#include "outbox/postgres/store.hpp"
#include "outbox/purge.hpp"
#include "outbox/sqlite/driver.hpp"
#include "outbox/sqlite/store.hpp"
#include "tests/support/servers.hpp"
#include "tests/support/tables.hpp"
#include "tests/support/test_support.hpp"

namespace outbox {
namespace {

using namespace std::chrono_literals;
using sql::TextRef;

struct Engine {
  std::string name;
  const char* url_variable;
};

class ServerEngine : public ::testing::TestWithParam<Engine> {
 protected:
  void SetUp() override {
    auto url = testing::env(GetParam().url_variable);
    OUTBOX_REQUIRE_SERVER(url, GetParam().name);
    url_ = *url;
    conn_ = mysql() ? mysql::connect(url_) : postgres::connect(url_);
    table_ = testing::unique_table("engine");
  }
  void TearDown() override {
    if (conn_) {
      conn_->execute("DROP TABLE IF EXISTS " + table_);
    }
  }
  bool mysql() const { return GetParam().name == "mysql"; }
  std::string p(int n) const { return mysql() ? "?" : "$" + std::to_string(n); }

  std::string url_;
  std::unique_ptr<sql::Connection> conn_;
  std::string table_;
};

TEST_P(ServerEngine, ErrorsCarrySqlstate) {
  conn_->execute("CREATE TABLE " + table_ + " (id VARCHAR(10) PRIMARY KEY)");
  conn_->execute("INSERT INTO " + table_ + " VALUES (" + p(1) + ")", {TextRef{"a"}});
  try {
    conn_->execute("INSERT INTO " + table_ + " VALUES (" + p(1) + ")", {TextRef{"a"}});
    FAIL() << "duplicate accepted";
  } catch (const StoreError& e) {
    EXPECT_EQ(e.sqlstate(), mysql() ? "23000" : "23505") << e.what();
  }
  try {
    conn_->execute("SELEKT 1");
    FAIL() << "syntax error accepted";
  } catch (const StoreError& e) {
    EXPECT_EQ(e.sqlstate(), mysql() ? "42000" : "42601") << e.what();
  }
}

TEST_P(ServerEngine, ParametersAreBinarySafeAndStatementsReused) {
  conn_->execute("CREATE TABLE " + table_ + " (t TEXT, b " + (mysql() ? "LONGBLOB" : "BYTEA") +
                 ", n BIGINT)");
  std::vector<std::uint8_t> bytes{0, 1, 0, 255, 39, 92, 34};
  const std::string tricky = "quote ' backslash \\ nul-free \xC3\xA9 $1 ?";
  const std::string insert =
      "INSERT INTO " + table_ + " VALUES (" + p(1) + ", " + p(2) + ", " + p(3) + ")";
  for (int i = 0; i < 3; ++i) {  // the same text reuses its prepared statement
    conn_->execute(insert, {TextRef{tricky}, sql::BlobRef{bytes}, std::int64_t{-9'000'000'000}});
  }
  auto rows = conn_->query("SELECT t, b, n FROM " + table_, {});
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].get_text(0), tricky);
  ASSERT_TRUE(rows[0].is_blob(1));
  EXPECT_EQ(std::get<sql::Blob>(rows[0].at(1)).bytes, bytes);
  EXPECT_EQ(rows[0].get_int(2), -9'000'000'000);
  conn_->execute(insert, {sql::Value{}, sql::Blob{}, sql::Value{}});
  auto nulls = conn_->query("SELECT t, b, n FROM " + table_ + " WHERE t IS NULL", {});
  ASSERT_EQ(nulls.size(), 1u);
  EXPECT_TRUE(nulls[0].is_null(0));
  EXPECT_TRUE(nulls[0].is_null(2));
}

TEST_P(ServerEngine, ManyDistinctStatementsStayUsable) {
  // More distinct texts than the statement caches hold: old statements are dropped, none clash.
  for (int i = 0; i < 300; ++i) {
    const std::string sql = "SELECT " + p(1) + " + " + std::to_string(i);
    ASSERT_EQ(conn_->query(sql, {std::int64_t{1}}).at(0).get_int(0), 1 + i);
  }
  EXPECT_EQ(conn_->query("SELECT " + p(1) + " + 0", {std::int64_t{7}}).at(0).get_int(0), 7);
}

TEST_P(ServerEngine, TransactionsAndDetection) {
  conn_->execute("CREATE TABLE " + table_ + " (id INT)");
  conn_->begin();
  EXPECT_TRUE(conn_->in_transaction());
  conn_->execute("INSERT INTO " + table_ + " VALUES (1)");
  conn_->rollback();
  EXPECT_FALSE(conn_->in_transaction());
  EXPECT_EQ(conn_->query("SELECT COUNT(*) FROM " + table_, {}).at(0).get_int(0), 0);
  EXPECT_EQ(conn_->dialect(), mysql() ? "mysql" : "postgres");

  const auto outbox_table = table_ + "_o";
  create_schema_for(*conn_, outbox_table);
  create_schema_for(*conn_, outbox_table);  // idempotent
  auto store = detect_store(*conn_, outbox_table);
  if (mysql()) {
    EXPECT_NE(dynamic_cast<mysql::MySqlOutboxStore*>(store.get()), nullptr);
  } else {
    EXPECT_NE(dynamic_cast<postgres::PostgresOutboxStore*>(store.get()), nullptr);
  }
  EXPECT_NE(detect_purger(*conn_, outbox_table), nullptr);
  store->insert_new(*conn_, EventEnvelope::of_json(EventType::of("T"), R"({"a":1})"));
  EXPECT_EQ(store->count_by_status(*conn_)[0], 1);
  EXPECT_THROW(detect_store(*conn_, "bad name"), std::invalid_argument);
  EXPECT_THROW(create_schema_for(*conn_, "x;DROP TABLE y"), std::invalid_argument);
  conn_->execute("DROP TABLE " + outbox_table);
}

TEST_P(ServerEngine, InvalidJsonPayloadIsRefusedAtInsert) {
  create_schema_for(*conn_, table_);
  auto store = detect_store(*conn_, table_);
  auto bad = EventEnvelope::of_json(EventType::of("T"), "{not json");
  EXPECT_THROW(store->insert_new(*conn_, bad), StoreError);
  EXPECT_FALSE(store->find(*conn_, bad.event_id()));
}

// Node clocks one hour off in either direction change nothing: leases, due times and done times
// come from the server.
TEST_P(ServerEngine, SkewedNodeClocksNeitherStealLiveLocksNorSkipDueRows) {
  create_schema_for(*conn_, table_);
  auto store = detect_store(*conn_, table_);
  const auto real = std::chrono::system_clock::now();
  const auto ahead = real + 1h;
  const auto behind = real - 1h;
  // A writer whose clock runs an hour ahead: its row is due now by the server's clock.
  store->insert_new(*conn_, EventEnvelope::builder(EventType::of("T"))
                                .event_id("skewed-writer")
                                .occurred_at(ahead)
                                .payload_json("{}")
                                .build());
  // A node an hour behind still sees it as due.
  auto due = store->poll_pending(*conn_, behind, 0us, 10);
  ASSERT_EQ(due.size(), 1u);
  // Node A claims it; node B, an hour ahead, must not take the live lock (60 s lease).
  ASSERT_EQ(store->claim_pending(*conn_, "node-a", behind, 60s, 0us, 10).size(), 1u);
  EXPECT_TRUE(store->claim_pending(*conn_, "node-b", ahead, 60s, 0us, 10).empty());
  // A retry due in 5 s is not polled by a node an hour ahead before the server says so.
  store->mark_retry(*conn_, "skewed-writer", ahead, 5000ms, "later");
  EXPECT_TRUE(store->poll_pending(*conn_, ahead, 0us, 10).empty());
  // After a 1 ms lease, the lock is expired for everyone, whatever their clock.
  store->insert_new(*conn_, EventEnvelope::of_json(EventType::of("T"), "{}"));
  ASSERT_EQ(store->claim_pending(*conn_, "node-a", ahead, 60s, 0us, 10).size(), 1u);
  ASSERT_TRUE(testing::wait_until(
      [&] { return store->claim_pending(*conn_, "node-b", behind, 1ms, 0us, 10).size() == 1; }));
}

// Found breaking issue 11: done_at is the server's time, but the purge cutoff was the node's, so a
// node eight days ahead purged, under a 7-day retention, an event that went DONE a moment ago.
TEST_P(ServerEngine, ASkewedNodeDoesNotPurgeWithinRetention) {
  create_schema_for(*conn_, table_);
  auto store = detect_store(*conn_, table_);
  auto purger = detect_purger(*conn_, table_);
  const auto real = std::chrono::system_clock::now();
  for (const char* id : {"done", "dead"}) {
    store->insert_new(
        *conn_, EventEnvelope::builder(EventType::of("T")).event_id(id).payload_json("{}").build());
  }
  ASSERT_EQ(store->mark_done(*conn_, "done", real), 1);
  ASSERT_EQ(store->mark_dead(*conn_, "dead", real, "gave up"), 1);
  const auto ahead = real + std::chrono::hours(24 * 8);
  EXPECT_EQ(purger->purge_older_than(*conn_, std::chrono::hours(24 * 7), ahead, 100), 0);
  OutboxPurgeScheduler scheduler({.connection_provider = open_pool(url_, 1),
                                  .purger = purger,
                                  .retention = std::chrono::hours(24 * 7),
                                  .clock = std::make_shared<testing::ManualClock>(ahead)});
  EXPECT_EQ(scheduler.run_once(), 0);
  EXPECT_EQ(store->count_by_status(*conn_)[1] + store->count_by_status(*conn_)[3], 2);
  // Past retention on the server's clock, whatever the node's: both go.
  EXPECT_EQ(purger->purge_older_than(*conn_, 0us, real - std::chrono::hours(24), 100), 2);
}

TEST_P(ServerEngine, MigrateByUrlIsVersionedAndIdempotent) {
  std::string url = url_;
  if (!mysql()) {  // the libpq key=value form and the URI form both open
    ASSERT_NE(url.find('='), std::string::npos);
  }
  auto pool = open_pool(url, 2);
  auto conn = pool->acquire();
  auto first = migrate(*conn, table_);
  EXPECT_EQ(first.from, 0);
  EXPECT_EQ(first.to, kSchemaVersion);
  auto again = migrate(*conn, table_);
  EXPECT_EQ(again.from, kSchemaVersion);
  auto store = detect_store(*conn, table_);
  store->insert_new(*conn, EventEnvelope::of_json(EventType::of("M"), "{}"));
  EXPECT_EQ(store->count_by_status(*conn)[0], 1);
  conn->execute("DELETE FROM outbox_schema_version WHERE table_name = '" + table_ + "'");
}

// MariaDB tells table names apart by case: two tables whose names differ only so each get their
// schema and their own version row.
TEST_P(ServerEngine, TablesWhoseNamesDifferOnlyByCaseAreMigratedApart) {
  if (!mysql()) {
    GTEST_SKIP() << "PostgreSQL folds unquoted names: one table";
  }
  const std::string upper = "Up_" + table_;
  const std::string lower = "up_" + table_;
  auto pool = open_pool(url_, 1);
  auto conn = pool->acquire();
  EXPECT_EQ(migrate(*conn, upper).from, 0);
  EXPECT_EQ(migrate(*conn, lower).from, 0);  // not "already at" the other's version
  for (const auto& t : {upper, lower}) {
    auto store = detect_store(*conn, t);
    store->insert_new(*conn, EventEnvelope::of_json(EventType::of("M"), "{}"));
    EXPECT_EQ(store->count_by_status(*conn)[0], 1) << t;
    EXPECT_EQ(schema_version(*conn, t), kSchemaVersion) << t;
    testing::drop_outbox_tables(*conn, t);
  }
}

// Schema version 8 keys MariaDB tables by stream_id; event ids must stay unique whatever the
// table looked like before (found by a hostile round: a user's plain index of the unique index's
// name, or a primary key already moved by hand, left duplicates accepted).
TEST_P(ServerEngine, MigrationToInsertOrderKeepsEventIdsUnique) {
  if (!mysql()) {
    GTEST_SKIP() << "PostgreSQL stores rows in insert order whatever the key";
  }
  auto pool = open_pool(url_, 1);
  auto conn = pool->acquire();
  const std::string index = derived_name(table_, "_event_id");
  for (const std::string& before :
       {"DROP INDEX " + index + ", ADD INDEX " + index + " (event_id)",
        "DROP INDEX " + index + ", ADD INDEX by_id (event_id)",
        "DROP INDEX " + index +
            ", DROP PRIMARY KEY, ADD PRIMARY KEY (event_id), ADD UNIQUE "
            "INDEX " +
            derived_name(table_, "_stream_id") + " (stream_id)"}) {
    SCOPED_TRACE(before);
    migrate(*conn, table_);
    conn->execute("ALTER TABLE " + table_ + " " + before);
    conn->execute("UPDATE outbox_schema_version SET version = 7 WHERE table_name = '" + table_ +
                  "'");
    auto store = detect_store(*conn, table_);
    store->insert_new(
        *conn,
        EventEnvelope::builder(EventType::of("M")).event_id("kept").payload_json("{}").build());
    EXPECT_EQ(migrate(*conn, table_).from, 7);
    std::string primary;
    for (const auto& row : conn->query("SHOW INDEX FROM " + table_)) {
      if (row.get_text(2) == "PRIMARY") {
        primary += row.get_text(4);
      }
    }
    EXPECT_EQ(primary, "stream_id");
    EXPECT_THROW(
        store->insert_new(
            *conn,
            EventEnvelope::builder(EventType::of("M")).event_id("kept").payload_json("{}").build()),
        UniqueViolationError);
    EXPECT_EQ(store->count_by_status(*conn)[0], 1);
    testing::drop_outbox_tables(*conn, table_);
    conn->execute("DELETE FROM outbox_schema_version WHERE table_name = '" + table_ + "'");
  }
}

INSTANTIATE_TEST_SUITE_P(Engines, ServerEngine,
                         ::testing::Values(Engine{"postgres", "OUTBOX_TEST_PG_URL"},
                                           Engine{"mysql", "OUTBOX_TEST_MYSQL_URL"}),
                         [](const auto& info) { return info.param.name; });

TEST(Drivers, ConnectFailuresAreStoreErrors) {
  try {
    postgres::connect("host=127.0.0.1 port=1 dbname=x connect_timeout=2");
    FAIL();
  } catch (const StoreError& e) {
    EXPECT_EQ(e.sqlstate(), "08001");
  }
  EXPECT_THROW(mysql::connect("mysql://root@127.0.0.1:1/x"), StoreError);
  EXPECT_THROW(postgres::wrap(nullptr), std::invalid_argument);
  EXPECT_THROW(mysql::wrap(nullptr), std::invalid_argument);
}

TEST(Drivers, MysqlUrls) {
  auto o = mysql::parse_url("mariadb://app:s3cret@db.local:3307/orders");
  EXPECT_EQ(o.user, "app");
  EXPECT_EQ(o.password, "s3cret");
  EXPECT_EQ(o.host, "db.local");
  EXPECT_EQ(o.port, 3307u);
  EXPECT_EQ(o.database, "orders");
  setenv("OUTBOX_TEST_SECRET", "from-env", 1);
  EXPECT_EQ(mysql::parse_url("mysql://app@h/d", "OUTBOX_TEST_SECRET").password, "from-env");
  EXPECT_EQ(mysql::parse_url("mysql://h/d", nullptr).port, 3306u);
  for (const char* bad :
       {"postgresql://h/d", "mysql://h", "mysql://h:port/d", "mysql://h:0/d", "mysql:///d"}) {
    EXPECT_THROW(mysql::parse_url(bad), std::invalid_argument) << bad;
  }
}

TEST(Drivers, BorrowedPgconnStaysOpen) {
  auto url = testing::env("OUTBOX_TEST_PG_URL");
  OUTBOX_REQUIRE_SERVER(url, "PostgreSQL");
  PGconn* pg = PQconnectdb(url->c_str());
  ASSERT_EQ(PQstatus(pg), CONNECTION_OK);
  for (int i = 0; i < 2; ++i) {  // two wrappers of one handle must not clash on statement names
    auto conn = postgres::wrap(pg);
    EXPECT_EQ(conn->query("SELECT $1::int + 1", {std::int64_t{41}}).at(0).get_int(0), 42);
  }
  EXPECT_EQ(PQstatus(pg), CONNECTION_OK);
  PQfinish(pg);
}

// A claim's 64-arm scan passed jit_above_cost on the planner's estimates, and compiling it cost
// more than running it: the library's own sessions plan without JIT, a borrowed one is left as is.
TEST(Drivers, PostgresSessionsOfTheLibraryPlanWithoutJit) {
  auto url = testing::env("OUTBOX_TEST_PG_URL");
  OUTBOX_REQUIRE_SERVER(url, "PostgreSQL");
  const auto jit_lines = [](sql::Connection& conn) {
    conn.execute("SET jit_above_cost = 0");
    int n = 0;
    for (const auto& row : conn.query("EXPLAIN (ANALYZE) SELECT sum(g * 2) FROM "
                                      "generate_series(1, 1000) g WHERE g % 3 = 1")) {
      n += row.get_text(0).find("JIT:") != std::string::npos ? 1 : 0;
    }
    return n;
  };
  auto own = postgres::connect(*url);
  EXPECT_EQ(own->query("SHOW jit").at(0).get_text(0), "off");
  auto pool = open_pool(*url, 1);
  EXPECT_EQ(pool->acquire()->query("SHOW jit").at(0).get_text(0), "off");
  const std::unique_ptr<PGconn, decltype(&PQfinish)> pg(PQconnectdb(url->c_str()), &PQfinish);
  ASSERT_EQ(PQstatus(pg.get()), CONNECTION_OK);
  auto borrowed = postgres::wrap(pg.get());
  // True only where a provider is installed and the session's jit is on (the server's default).
  if (borrowed->query("SELECT pg_jit_available()").at(0).get_text(0) != "t") {
    GTEST_SKIP() << "this server does not JIT-compile by default: only SHOW jit checked";
  }
  EXPECT_EQ(jit_lines(*borrowed), 1) << "the caller's session keeps its settings";
  EXPECT_EQ(jit_lines(*own), 0);
}

TEST(Detection, SqliteAndUnknownDialects) {
  testing::TempDir dir;
  auto conn = sqlite::open(dir.file("d.db"));
  create_schema_for(*conn);
  EXPECT_NE(dynamic_cast<sqlite::SqliteOutboxStore*>(detect_store(*conn).get()), nullptr);
  EXPECT_NE(dynamic_cast<sqlite::SqliteEventPurger*>(detect_purger(*conn).get()), nullptr);

  // A connection of a dialect this build has no store for.
  class OtherDialect final : public sql::Connection {
   public:
    using sql::Connection::execute;
    using sql::Connection::query;
    std::int64_t execute(std::string_view, std::span<const sql::Value>) override { return 0; }
    std::vector<sql::Row> query(std::string_view, std::span<const sql::Value>) override {
      return {};
    }
    void begin() override {}
    void commit() override {}
    void rollback() override {}
    bool in_transaction() const override { return false; }
    std::string_view dialect() const override { return "oracle"; }
  } other;
  EXPECT_THROW(detect_store(other), std::invalid_argument);
  EXPECT_THROW(detect_purger(other), std::invalid_argument);
  EXPECT_THROW(create_schema_for(other), std::invalid_argument);
}

// A connection may outlive the pool that lent it (the pool's state lives as long as the
// connection): `open_pool(url)->acquire()` used to return into freed memory (ASan).
TEST(Detection, AConnectionOutlivesThePoolThatLentIt) {
  testing::TempDir dir;
  auto conn = open_pool("sqlite://" + dir.file("p.db"), 1)->acquire();
  EXPECT_EQ(conn->query("SELECT 1")[0].get_int(0), 1);
  conn->begin();  // returned rolled back, into the pool's state, then closed with it
}

TEST(Detection, OpenPoolByUrlAndMigrateSqlite) {
  testing::TempDir dir;
  auto pool = open_pool("sqlite://" + dir.file("m.db"), 2);
  auto conn = pool->acquire();
  // A table made by create_schema (no version recorded) holding a DEAD row without done_at.
  create_schema_for(*conn);
  conn->execute(
      "INSERT INTO outbox_event (event_id, event_type, payload, status, available_at, created_at) "
      "VALUES ('before', 'T', '{}', 3, 0, 0)");
  const auto first = std::chrono::system_clock::now();
  EXPECT_EQ(migrate(*conn).from, 0);
  EXPECT_GE(detect_store(*conn)->find(*conn, "before")->done_at, first - std::chrono::seconds(1));
  EXPECT_EQ(migrate(*conn).from, kSchemaVersion);
  // Version 3 adds the lease table to a table of version 2.
  conn->execute("DROP TABLE outbox_event_lease");
  conn->execute("UPDATE outbox_schema_version SET version = 2");
  EXPECT_EQ(migrate(*conn).from, 2);
  EXPECT_FALSE(detect_lease_store(*conn)->find(*conn, "leader"));
  // Version 2 gives DEAD rows of version 1 (no done_at) a retention that starts at the upgrade.
  conn->execute("UPDATE outbox_schema_version SET version = 1");
  conn->execute(
      "INSERT INTO outbox_event (event_id, event_type, payload, status, available_at, created_at) "
      "VALUES ('legacy', 'T', '{}', 3, 0, 0), ('legacy-done', 'T', '{}', 1, 0, 0)");
  const auto before = std::chrono::system_clock::now();
  EXPECT_EQ(migrate(*conn).from, 1);
  auto store = detect_store(*conn);
  EXPECT_GE(store->find(*conn, "legacy")->done_at, before - std::chrono::seconds(1));
  EXPECT_FALSE(store->find(*conn, "legacy-done")->done_at);
  conn->execute("UPDATE outbox_schema_version SET version = 99");
  EXPECT_THROW(migrate(*conn), std::invalid_argument);
  EXPECT_THROW(migrate(*conn, "bad name"), std::invalid_argument);
  EXPECT_THROW(open_pool("oracle://x"), std::invalid_argument);
  EXPECT_THROW(open_pool("sqlite://"), std::invalid_argument);
}

// Found breaking issue 11: an unrecognised URL was repeated up to its first ':' (the password of
// "user:secret@host"), and a libpq connection string whose value held "://" was not recognised.
TEST(Detection, UnknownUrlsRepeatOnlyTheirScheme) {
  auto message = [](const std::string& url) {
    try {
      open_pool(url);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  const auto redis = message("redis://user:s3cret@host");
  EXPECT_NE(redis.find("redis://"), std::string::npos) << redis;
  EXPECT_EQ(redis.find("s3cret"), std::string::npos) << redis;
  const auto bare = message("user:s3cret@host/db");
  EXPECT_EQ(bare.find("s3cret"), std::string::npos) << bare;
  EXPECT_NE(bare.find("unsupported database URL"), std::string::npos) << bare;
  // A key=value string is PostgreSQL's whatever its values hold: connecting is what fails.
  EXPECT_THROW(open_pool("host=127.0.0.1 port=1 password=p://w connect_timeout=2")->acquire(),
               StoreError);
}

}  // namespace
}  // namespace outbox

// Rows written by a service in another language: the database's own command-line client (sqlite3,
// psql, mariadb) inserts them with only the columns docs/writing-rows.md lists, inside the
// client's transactions, and `outbox relay` delivers them to a webhook: metadata and headers
// forwarded, a group's rows in order, a rolled-back row never. And the migration that gives the
// table those defaults (schema version 6) keeps everything an older table had.

#include <gtest/gtest.h>
#include <httplib.h>

#include <cctype>
#include <map>
#include <mutex>

#include "outbox/detect/detect.hpp"
#include "outbox/envelope.hpp"
#include "outbox/errors.hpp"
#include "outbox/sql/connection.hpp"
#include "tests/support/http_server.hpp"
#include "tests/support/process.hpp"
#include "tests/support/relay_cli.hpp"
#include "tests/support/sql_client.hpp"
#include "tests/support/tables.hpp"

namespace outbox {
namespace {

using testing::RelayProcess;
using testing::wait_until;

std::string uppercase(std::string s) {
  for (auto& c : s) {
    c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  }
  return s;
}

class OutsideWriters : public testing::RelayDatabaseTest {
 protected:
  void SetUp() override {
    RelayDatabaseTest::SetUp();
    if (skipped_or_failed()) {
      return;
    }
    table_ = migrate_table("outside");
    http_.respond([this](const testing::ReceivedRequest& r, httplib::Response& res) {
      std::lock_guard lock(mutex_);
      received_.push_back(r);
      res.set_content("ok", "text/plain");
    });
  }

  testing::CommandResult run_client(const std::string& sql) {
    return testing::run_sql_client(dir_, GetParam(), url_, sql);
  }

  std::unique_ptr<RelayProcess> start_relay() {
    std::string config = "[database]\nurl = \"" + url_ + "\"\ntable = \"" + table_ + "\"\n";
    config += "[poller]\ninterval = \"50ms\"\n[admin]\nenabled = false\n";
    config += "[publishers.hook]\ntype = \"http\"\n";
    config += "[[routes]]\npublisher = \"hook\"\ntarget = \"" + http_.url("/events") + "\"\n";
    return std::make_unique<RelayProcess>(dir_, config, "relay");
  }

  std::vector<testing::ReceivedRequest> received() {
    std::lock_guard lock(mutex_);
    return received_;
  }
  std::vector<std::string> received_ids() {
    std::vector<std::string> ids;
    for (const auto& r : received()) {
      ids.push_back(r.header("X-Outbox-Event-Id"));
    }
    return ids;
  }

  void TearDown() override {
    if (GetParam() != "sqlite" && !url_.empty()) {
      auto pool = open_pool(url_, 1);
      for (const auto& t : drop_after_) {
        testing::drop_outbox_tables(*pool->acquire(), t);
      }
    }
    RelayDatabaseTest::TearDown();
  }

  std::string table_;
  std::vector<std::string> drop_after_;
  testing::HttpTestServer http_;
  std::mutex mutex_;
  std::vector<testing::ReceivedRequest> received_;
};

TEST_P(OutsideWriters, MinimalRowsFromTheCommandLineClientAreDelivered) {
  const std::string into = "INSERT INTO " + table_;
  // The statements docs/writing-rows.md shows, nothing else: each engine's client, each in its
  // own transactions.
  const std::string begin = GetParam() == "mysql"    ? "START TRANSACTION;\n"
                            : GetParam() == "sqlite" ? "BEGIN IMMEDIATE;\n"
                                                     : "BEGIN;\n";
  std::string sql = begin;
  sql += into +
         " (event_id, event_type, payload) VALUES "
         "('01JD0000000000000000000001', 'OrderPlaced', '{\"order\": \"o-1\"}');\n";
  sql += into +
         " (event_id, event_type, aggregate_type, aggregate_id, headers, payload) VALUES "
         "('01JD0000000000000000000002', 'OrderPaid', 'Order', 'o-1', "
         "'{\"source\": \"billing-py\"}', '{\"order\": \"o-1\", \"amount\": 12}');\n";
  sql += "COMMIT;\n";
  // A transaction the service rolls back: its row must never reach anyone.
  sql += begin + into +
         " (event_id, event_type, payload) VALUES "
         "('01JD0000000000000000000009', 'OrderPlaced', '{\"order\": \"rolled-back\"}');\n"
         "ROLLBACK;\n";
  // A message group: three events of one key, in insert order (one writer, one transaction).
  sql += begin;
  for (int n = 0; n < 3; ++n) {
    sql += into +
           " (event_id, event_type, message_group, payload) VALUES "
           "('01JD000000000000000000001" +
           std::to_string(n) + "', 'OrderShipped', 'order-7', '{\"n\": " + std::to_string(n) +
           "}');\n";
  }
  sql += "COMMIT;\n";
  const auto client = run_client(sql);
  ASSERT_EQ(client.exit_code, 0) << client.err << client.out;

  auto relay = start_relay();
  ASSERT_TRUE(wait_until([&] { return received().size() >= 5; })) << relay->log();
  auto pool = open_pool(url_, 1);
  auto conn = pool->acquire();
  auto store = detect_store(*conn, table_);
  ASSERT_TRUE(wait_until([&] { return store->count_by_status(*conn)[1] == 5; })) << relay->log();

  const auto ids = received_ids();
  EXPECT_EQ(std::count(ids.begin(), ids.end(), "01JD0000000000000000000009"), 0);
  std::map<std::string, testing::ReceivedRequest> by_id;
  std::vector<std::string> group_order;
  for (const auto& r : received()) {
    by_id[r.header("X-Outbox-Event-Id")] = r;
    if (r.header("X-Outbox-Message-Group") == "order-7") {
      group_order.push_back(r.header("X-Outbox-Event-Id"));
    }
  }
  ASSERT_TRUE(by_id.contains("01JD0000000000000000000001"));
  EXPECT_EQ(by_id["01JD0000000000000000000001"].header("X-Outbox-Event-Type"), "OrderPlaced");
  EXPECT_NE(by_id["01JD0000000000000000000001"].body.find("o-1"), std::string::npos);
  ASSERT_TRUE(by_id.contains("01JD0000000000000000000002"));
  const auto& paid = by_id["01JD0000000000000000000002"];
  EXPECT_EQ(paid.header("X-Outbox-Aggregate-Type"), "Order");
  EXPECT_EQ(paid.header("X-Outbox-Aggregate-Id"), "o-1");
  EXPECT_EQ(paid.header("source"), "billing-py");
  // Deduplicated by id: a re-send after a failure could repeat one, never reorder the group.
  group_order.erase(std::unique(group_order.begin(), group_order.end()), group_order.end());
  EXPECT_EQ(group_order,
            (std::vector<std::string>{"01JD0000000000000000000010", "01JD0000000000000000000011",
                                      "01JD0000000000000000000012"}));
  // Nothing waits: no row the client wrote is left pending.
  EXPECT_EQ(store->count_by_status(*conn)[0] + store->count_by_status(*conn)[2], 0);
  EXPECT_EQ(relay->terminate(), 0);
}

// A row that leaves out a column without a default is refused by the database itself, with the
// column named: the service's transaction fails, nothing half-written is delivered.
TEST_P(OutsideWriters, ARowWithoutItsRequiredColumnsIsRefusedByTheDatabase) {
  const auto client =
      run_client("INSERT INTO " + table_ + " (event_id, payload) VALUES ('no-type', '{}');\n");
  EXPECT_NE(client.exit_code, 0);
  EXPECT_NE((client.err + client.out).find("event_type"), std::string::npos)
      << client.err << client.out;
}

// A table of schema version 5 (no defaults) migrated to 6: every row kept with its stream
// position, the minimal insert then works. On SQLite the definition is edited in place: the
// AUTOINCREMENT high-water mark (past purged rows a subscription may have read), a column with its
// CHECK, an index, a trigger, a view and another table's trigger that name the table all survive,
// and the table named in another case is the same table.
TEST_P(OutsideWriters, MigratingAVersion5TableKeepsItsRowsAndGivesTheDefaults) {
  auto pool = open_pool(url_, 1);
  auto conn = pool->acquire();
  const std::string t = table_ + "_v5";
  std::string seqs_before;
  if (GetParam() == "sqlite") {
    conn->execute(
        "CREATE TABLE " + t +
        " (stream_seq INTEGER PRIMARY KEY AUTOINCREMENT, event_id TEXT NOT NULL UNIQUE, "
        "event_type TEXT NOT NULL, aggregate_type TEXT, aggregate_id TEXT, tenant_id TEXT, "
        "payload BLOB NOT NULL, headers TEXT, status INTEGER NOT NULL, attempts INTEGER NOT NULL "
        "DEFAULT 0, available_at INTEGER NOT NULL, created_at INTEGER NOT NULL, done_at INTEGER, "
        "last_error TEXT, locked_by TEXT, locked_at INTEGER, tags TEXT, message_group TEXT, "
        "partition_no INTEGER, region TEXT NOT NULL CHECK (region IN ('eu', 'us')) DEFAULT "
        "'eu')");
    conn->execute("CREATE VIEW " + t + "_waiting AS SELECT event_id FROM " + t +
                  " WHERE status IN (0, 2)");
    conn->execute("CREATE TABLE " + t + "_orders (id TEXT)");
    conn->execute("CREATE TRIGGER " + t + "_ordered AFTER INSERT ON " + t +
                  "_orders BEGIN INSERT INTO " + t +
                  " (event_id, event_type, payload, status, available_at, created_at) VALUES "
                  "(NEW.id, 'Ordered', '{}', 0, 1, 1); END");
    conn->execute("CREATE INDEX " + t + "_pending ON " + t +
                  " (created_at, event_id) WHERE status IN (0, 2) AND message_group IS NULL");
    conn->execute("CREATE INDEX " + t + "_groups ON " + t +
                  " (partition_no, message_group, stream_seq, available_at, event_id) WHERE "
                  "status IN (0, 2) AND message_group IS NOT NULL");
    conn->execute("CREATE INDEX " + t + "_region ON " + t + " (region)");
    conn->execute("CREATE TABLE " + t + "_audit (event_id TEXT)");
    conn->execute("CREATE TRIGGER " + t + "_audited AFTER INSERT ON " + t + " BEGIN INSERT INTO " +
                  t + "_audit VALUES (NEW.event_id); END");
    for (int i = 1; i <= 4; ++i) {
      conn->execute("INSERT INTO " + t +
                    " (event_id, event_type, payload, status, available_at, created_at) VALUES "
                    "('old-" +
                    std::to_string(i) + "', 'Old', '{}', 0, 1, " + std::to_string(i) + ")");
    }
    conn->execute("DELETE FROM " + t + " WHERE event_id IN ('old-1', 'old-4')");  // purged
  } else {
    ASSERT_EQ(testing::run_cli(dir_, "migrate --db '" + url_ + "' --table " + t).exit_code, 0);
    drop_after_.push_back(t);
    conn->execute("ALTER TABLE " + t +
                  " ALTER COLUMN status DROP DEFAULT, ALTER COLUMN available_at DROP DEFAULT, "
                  "ALTER COLUMN created_at DROP DEFAULT");
    auto store = detect_store(*conn, t);
    for (int i = 1; i <= 4; ++i) {
      store->insert_new(*conn, EventEnvelope::builder(EventType::of("Old"))
                                   .event_id("old-" + std::to_string(i))
                                   .payload_json("{}")
                                   .build());
    }
    conn->execute("DELETE FROM " + t + " WHERE event_id IN ('old-1', 'old-4')");
  }
  conn->execute(
      "CREATE TABLE IF NOT EXISTS outbox_schema_version (table_name VARCHAR(63) PRIMARY KEY, "
      "version INTEGER NOT NULL)");
  conn->execute("DELETE FROM outbox_schema_version WHERE table_name = '" + t + "'");
  conn->execute("INSERT INTO outbox_schema_version (table_name, version) VALUES ('" + t + "', 5)");
  const std::string minimal =
      "INSERT INTO " + t + " (event_id, event_type, payload) VALUES ('new-1', 'New', '{}')";
  EXPECT_THROW(conn->execute(minimal), StoreError);  // version 5: status has no default
  // MariaDB numbers rows in insert order in stream_id (stream_seq comes later, from the sequencer).
  const std::string seq = GetParam() == "mysql" ? "stream_id" : "stream_seq";
  const auto seqs = [&] {
    std::string out;
    for (const auto& r :
         conn->query("SELECT event_id, " + seq + " FROM " + t + " ORDER BY " + seq)) {
      out += r.get_text(0) + "=" + std::to_string(r.get_int(1)) + " ";
    }
    return out;
  };
  seqs_before = seqs();

  // SQLite and PostgreSQL names ignore case: the upper-case name is the same table.
  const auto result = migrate(*conn, GetParam() == "mysql" ? t : uppercase(t));
  EXPECT_EQ(result.from, 5);
  EXPECT_EQ(result.to, kSchemaVersion);
  EXPECT_EQ(seqs(), seqs_before);
  conn->execute(minimal);
  auto store = detect_store(*conn, t);
  const auto row = store->find(*conn, "new-1");
  ASSERT_TRUE(row);
  EXPECT_EQ(row->status, EventStatus::New);
  EXPECT_EQ(row->attempts, 0);
  // Stamped now by the database (within a minute of this host's clock).
  EXPECT_LT(std::chrono::abs(row->created_at - std::chrono::system_clock::now()),
            std::chrono::minutes(1));
  EXPECT_LE(row->available_at, std::chrono::system_clock::now() + std::chrono::minutes(1));
  const auto new_seq =
      conn->query("SELECT " + seq + " FROM " + t + " WHERE event_id = 'new-1'")[0].get_int(0);
  EXPECT_GT(new_seq, 4) << "a position at or before a purged row's: " << seqs();
  EXPECT_EQ(migrate(*conn, t).from, kSchemaVersion);  // idempotent
  if (GetParam() == "sqlite") {
    EXPECT_EQ(conn->query("SELECT region FROM " + t + " WHERE event_id = 'new-1'")[0].get_text(0),
              "eu");
    EXPECT_EQ(
        conn->query("SELECT COUNT(*) FROM " + t + "_audit WHERE event_id = 'new-1'")[0].get_int(0),
        1);
    EXPECT_THROW(conn->execute("INSERT INTO " + t +
                               " (event_id, event_type, payload, region) VALUES "
                               "('mars-1', 'New', '{}', 'mars')"),
                 StoreError);  // the column's CHECK still holds
    conn->execute("INSERT INTO " + t + "_orders VALUES ('order-9')");
    EXPECT_EQ(
        conn->query("SELECT COUNT(*) FROM " + t + "_waiting WHERE event_id = 'order-9'")[0].get_int(
            0),
        1);
    for (const char* index : {"_region", "_groups", "_pending"}) {
      EXPECT_EQ(
          conn->query("SELECT COUNT(*) FROM sqlite_master WHERE name = '" + t + index + "'")[0]
              .get_int(0),
          1)
          << index;
    }
    EXPECT_NE(conn->query("SELECT sql FROM sqlite_master WHERE name = '" + t + "_pending'")[0]
                  .get_text(0)
                  .find("message_group IS NULL"),
              std::string::npos);
  }
}

// SQLite keeps any type in any column: a row one column of which nothing can read (text in
// attempts) goes DEAD with the column named, a number where text belongs is read as text (a
// float payload is JSON), and the rows beside them are delivered, not stalled behind them.
TEST_P(OutsideWriters, ARowOfWrongTypesGoesDeadAloneOnSqlite) {
  if (GetParam() != "sqlite") {
    GTEST_SKIP() << "typed columns: the database refuses such rows";
  }
  const std::string into = "INSERT INTO " + table_;
  const auto client = run_client(
      "BEGIN IMMEDIATE;\n" + into +
      " (event_id, event_type, payload) VALUES ('good-1', 'E', '{\"n\": 1}');\n" + into +
      " (event_id, event_type, payload) VALUES ('float-1', 'E', 9.99);\n" + into +
      " (event_id, event_type, payload, attempts) VALUES ('bad-1', 'E', '{}', 'many');\n" + into +
      " (event_id, event_type, payload) VALUES ('good-2', 'E', '{\"n\": 2}');\nCOMMIT;\n");
  ASSERT_EQ(client.exit_code, 0) << client.err;
  auto relay = start_relay();
  auto pool = open_pool(url_, 1);
  auto conn = pool->acquire();
  auto store = detect_store(*conn, table_);
  ASSERT_TRUE(wait_until([&] {
    const auto counts = store->count_by_status(*conn);
    return counts[1] == 3 && counts[3] == 1;
  })) << relay->log();
  const auto bad = store->find(*conn, "bad-1");
  ASSERT_TRUE(bad);
  EXPECT_NE(bad->last_error->find("column attempts"), std::string::npos) << *bad->last_error;
  std::map<std::string, std::string> bodies;
  for (const auto& r : received()) {
    bodies[r.header("X-Outbox-Event-Id")] = r.body;
  }
  EXPECT_EQ(bodies.at("float-1"), "9.99");
  EXPECT_TRUE(bodies.contains("good-1"));
  EXPECT_TRUE(bodies.contains("good-2"));
  EXPECT_EQ(relay->terminate(), 0);
}

INSTANTIATE_TEST_SUITE_P(Engines, OutsideWriters, ::testing::Values("sqlite", "postgres", "mysql"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace outbox

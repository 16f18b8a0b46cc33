// Statements about the rows of the whole table, on every engine: the status report's counts (GET
// /api/status, which the dashboard asks for every 2 s, and `outbox status`) and the release of a
// stopping node's claims. Exact for rows of every kind (grouped or not, an outside client's
// status); on SQLite the counts read no row (at 1,000,000 rows the report read the table three
// times, 0.55 s; counted by status through the pending rows' indexes it read each grouped row,
// 1.4 s).

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "outbox/detect/detect.hpp"
#include "outbox/sql/connection.hpp"
#include "tests/support/group_contract_fixture.hpp"
#include "tests/support/plan_checking.hpp"
#include "tests/support/tables.hpp"

namespace outbox {
namespace {

using testing::PlanChecking;

class TableWide : public testing::GroupContractFixture {
 protected:
  // An instant `hours` before now as SQL of the engine.
  std::string hours_ago(int hours) const {
    if (engine_is("sqlite")) {
      const auto micros =
          std::chrono::duration_cast<std::chrono::microseconds>(
              (std::chrono::system_clock::now() - std::chrono::hours(hours)).time_since_epoch())
              .count();
      return std::to_string(micros);
    }
    const std::string h = std::to_string(hours);
    return engine_is("postgres") ? "now() - interval '" + h + " hours'"
                                 : "UTC_TIMESTAMP(6) - INTERVAL " + h + " HOUR";
  }
  // A row as another client writes it; `key` empty for an ungrouped one.
  void insert(const std::string& id, const std::string& type, int status, int age_hours,
              const std::string& key = {}, const std::string& locked_by = {}) {
    const std::string at = hours_ago(age_hours);
    const std::string group =
        key.empty() ? "NULL, NULL"
                    : "'" + key + "', " + std::to_string(message_group_partition(key));
    pool_->acquire()->execute(
        "INSERT INTO " + table_ +
        " (event_id, event_type, aggregate_type, payload, status, attempts, available_at, "
        "created_at, done_at, message_group, partition_no, locked_by, locked_at) VALUES ('" +
        id + "', '" + type + "', 'Order', '{}', " + std::to_string(status) + ", 0, " + at + ", " +
        at + ", " + (status == 1 || status == 3 ? at : "NULL") + ", " + group + ", " +
        (locked_by.empty() ? "NULL, NULL" : "'" + locked_by + "', " + at) + ")");
  }
  // `conn` itself, or on SQLite `conn` asking for each statement's plan: allowed to read the
  // indexes of the pending, grouped, terminal, RETRY and DEAD rows whole, never <table>_created.
  // (A count of a partial index's rows reads none of them, though SQLite's plan does not say
  // "COVERING": at 1,000,000 grouped pending rows 0.06 s; counted by status, 1.4 s.)
  sql::Connection& watched(sql::Connection& conn) {
    if (!engine_is("sqlite")) {
      return conn;
    }
    std::vector<std::string> allowed;
    for (const char* suffix :
         {"_pending", "_groups", "_groups_front", "_terminal", "_retry_dead"}) {
      allowed.push_back(table_ + suffix);
    }
    checking_.emplace(conn, table_, std::move(allowed));
    checking_->shunned_indexes = {table_ + "_created"};
    return *checking_;
  }
  std::optional<std::string> locked_by(const std::string& id) {
    const auto rows = pool_->acquire()->query("SELECT locked_by FROM " + table_ +
                                              " WHERE event_id = '" + id + "'");
    return rows.at(0).get_optional_text(0);
  }
  std::optional<PlanChecking> checking_;
};

TEST_P(TableWide, CountEveryKindOfRowOnceAndReadOnlyTheirIndexes) {
  // DONE and DEAD rows older than every pending one: a read of created_at from its oldest end
  // passes all of them before it finds a pending row.
  for (int i = 0; i < 4; ++i) {
    insert("done-" + std::to_string(i), "Shipped", 1, 5);
  }
  insert("done-grouped", "Shipped", 1, 5, "order-1");
  insert("dead-a", "Paid", 3, 4);
  insert("dead-b1", "Refunded", 3, 4);
  insert("dead-b2", "Refunded", 3, 4, "order-2");
  insert("plain-new", "Placed", 0, 1);
  insert("plain-retry", "Placed", 2, 1);
  insert("grouped-new-1", "Placed", 0, 2, "order-1");  // the oldest pending row
  insert("grouped-new-2", "Placed", 0, 1, "order-1");
  insert("grouped-new-3", "Placed", 0, 1, "order-3");
  insert("grouped-retry", "Placed", 2, 1, "order-3");
  insert("unknown-status", "Placed", 7, 1);  // an outside client's: counted nowhere

  auto conn = pool_->acquire();
  sql::Connection* c = &watched(*conn);
  EXPECT_EQ(store_->count_by_status(*c), (std::vector<std::int64_t>{4, 5, 2, 3}));
  EXPECT_EQ(store_->count_dead_by_type(*c),
            (std::vector<std::pair<std::string, std::int64_t>>{{"Refunded", 2}, {"Paid", 1}}));
  if (checking_) {
    EXPECT_EQ(checking_->scans, std::vector<std::string>{});
    EXPECT_EQ(checking_->statements, 2);
  }
  // With grouped rows pending, their oldest is looked for from the oldest created_at on (an index
  // of their own would cost each insert; read among them it cost a row read each).
  const auto oldest = store_->oldest_pending(*conn);
  ASSERT_TRUE(oldest.has_value());
  const auto age = std::chrono::system_clock::now() - *oldest;
  EXPECT_GT(age, std::chrono::minutes(90));
  EXPECT_LT(age, std::chrono::minutes(150));
}

TEST_P(TableWide, WithoutGroupedRowsPendingTheOldestPendingRowIsFoundWithoutWalkingTheRest) {
  // Settled rows older than the pending one: MIN(created_at) of the grouped pending rows walked
  // every row's created_at from its oldest end, to its end when none was pending.
  for (int i = 0; i < 4; ++i) {
    insert("done-" + std::to_string(i), "Shipped", 1, 5, "order-" + std::to_string(i));
  }
  insert("dead", "Paid", 3, 4, "order-1");
  insert("plain-new", "Placed", 0, 2);
  auto conn = pool_->acquire();
  const auto oldest = store_->oldest_pending(watched(*conn));
  ASSERT_TRUE(oldest.has_value());
  const auto age = std::chrono::system_clock::now() - *oldest;
  EXPECT_GT(age, std::chrono::minutes(90));
  EXPECT_LT(age, std::chrono::minutes(150));
  if (checking_) {
    EXPECT_EQ(checking_->scans, std::vector<std::string>{});
  }
}

TEST_P(TableWide, AnApplicationsTableNamedLikeTheRetryAndDeadIndexDoesNotStopTheMigration) {
  // <table>_retry_dead is the name of that index on SQLite and PostgreSQL, where indexes and
  // tables share names: a table of that name is left alone, and the counts read the table.
  const std::string t = testing::unique_table("named");
  auto conn = pool_->acquire();
  conn->execute("CREATE TABLE " + derived_name(t, "_retry_dead") + " (event_id VARCHAR(64))");
  try {
    EXPECT_EQ(migrate(*conn, t).to, kSchemaVersion);
    auto store = detect_store(*conn, t);
    store->insert_batch(
        *conn, {EventEnvelope::builder(EventType::of("Placed")).payload_json("{}").build()});
    EXPECT_EQ(store->count_by_status(*conn), (std::vector<std::int64_t>{1, 0, 0, 0}));
    EXPECT_EQ(store->count_dead_by_type(*conn).size(), 0U);
    EXPECT_EQ(migrate(*conn, t).from, kSchemaVersion);  // and again, as a no-op
  } catch (const std::exception& e) {
    ADD_FAILURE() << e.what();
  }
  testing::drop_outbox_tables(*conn, t);
  conn->execute("DROP TABLE IF EXISTS " + derived_name(t, "_retry_dead"));
}

TEST_P(TableWide, OnSqliteATriggerOfTheIndexsNameLeavesTheIndexMade) {
  if (!engine_is("sqlite")) {
    GTEST_SKIP() << "SQLite's triggers have names of their own";
  }
  const std::string t = testing::unique_table("trigger");
  auto conn = pool_->acquire();
  migrate(*conn, t);
  const std::string index = t + "_retry_dead";
  conn->execute("DROP INDEX " + index);
  conn->execute("CREATE TRIGGER " + index + " AFTER INSERT ON " + t + " BEGIN SELECT 1; END");
  conn->execute("UPDATE outbox_schema_version SET version = 12 WHERE table_name = '" + t + "'");
  migrate(*conn, t);
  EXPECT_EQ(conn->query("SELECT COUNT(*) FROM sqlite_master WHERE type = 'index' AND name = '" +
                        index + "'")[0]
                .get_int(0),
            1);
}

TEST_P(TableWide, AnEmptyTableAndOneWithoutPendingRowsCountNothing) {
  auto conn = pool_->acquire();
  EXPECT_EQ(store_->count_by_status(*conn), (std::vector<std::int64_t>{0, 0, 0, 0}));
  EXPECT_FALSE(store_->oldest_pending(*conn).has_value());
  insert("done", "Shipped", 1, 3, "order-1");
  insert("dead", "Paid", 3, 3, "order-1");
  EXPECT_EQ(store_->count_by_status(*conn), (std::vector<std::int64_t>{0, 1, 0, 1}));
  EXPECT_FALSE(store_->oldest_pending(*conn).has_value());
}

TEST_P(TableWide, ReleasingANodesClaimsFreesItsPendingRowsGroupedOrNotAndNothingElse) {
  for (int i = 0; i < 3; ++i) {
    insert("done-" + std::to_string(i), "Shipped", 1, 5, {}, "node-a");
  }
  insert("plain", "Placed", 0, 1, {}, "node-a");
  insert("plain-retry", "Placed", 2, 1, {}, "node-a");
  insert("held-head", "Placed", 2, 1, "order-1", "node-a");  // held before a failure was written
  insert("grouped-unnumbered", "Placed", 0, 1, "order-2", "node-a");
  insert("other-node", "Placed", 0, 1, {}, "node-b");
  insert("other-node-grouped", "Placed", 0, 1, "order-3", "node-b");
  insert("dead", "Paid", 3, 4, "order-1", "node-a");
  pool_->acquire()->execute("UPDATE " + table_ +
                            " SET partition_no = NULL WHERE event_id = 'grouped-unnumbered'");
  auto conn = pool_->acquire();
  EXPECT_EQ(store_->release_claims(*conn, "node-a"), 4);
  for (const char* id : {"plain", "plain-retry", "held-head", "grouped-unnumbered"}) {
    EXPECT_EQ(locked_by(id), std::nullopt) << id;
  }
  EXPECT_EQ(locked_by("other-node"), "node-b");
  EXPECT_EQ(locked_by("other-node-grouped"), "node-b");
  EXPECT_EQ(locked_by("done-0"), "node-a");  // settled rows are left as they are
  EXPECT_EQ(locked_by("dead"), "node-a");
  EXPECT_EQ(store_->release_claims(*conn, "node-a"), 0);
}

INSTANTIATE_TEST_SUITE_P(Engines, TableWide, testing::all_engines(), testing::engine_name);

}  // namespace
}  // namespace outbox

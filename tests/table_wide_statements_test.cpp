// Statements about the rows of the whole table, on every engine: the status report's counts (GET
// /api/status, which the dashboard asks for every 2 s, and `outbox status`) and the release of a
// stopping node's claims. Exact for rows of every kind (grouped or not, an outside client's
// status), and on SQLite read through the indexes of the rows they are about, never the whole
// table nor every row's created_at (at 1,000,000 rows the report read the table three times:
// 0.55 s; a release read it under the write lock: 0.13 s).

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "outbox/sql/connection.hpp"
#include "tests/support/group_contract_fixture.hpp"
#include "tests/support/plan_checking.hpp"

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
  // `conn` itself, or on SQLite `conn` asking for each statement's plan, allowed to read the
  // indexes of the pending, grouped, terminal and DEAD rows whole, never <table>_created.
  sql::Connection& watched(sql::Connection& conn) {
    if (!engine_is("sqlite")) {
      return conn;
    }
    checking_.emplace(
        conn, table_,
        std::vector<std::string>{table_ + "_pending", table_ + "_groups", table_ + "_groups_front",
                                 table_ + "_terminal", table_ + "_dead"});
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
  std::optional<PlanChecking> checking;
  sql::Connection* c = &*conn;
  if (engine_is("sqlite")) {
    checking.emplace(
        *conn, table_,
        std::vector<std::string>{table_ + "_pending", table_ + "_groups", table_ + "_groups_front",
                                 table_ + "_terminal", table_ + "_dead"});
    checking->shunned_indexes = {table_ + "_created"};
    c = &*checking;
  }
  EXPECT_EQ(store_->count_by_status(*c), (std::vector<std::int64_t>{4, 5, 2, 3}));
  EXPECT_EQ(store_->count_dead_by_type(*c),
            (std::vector<std::pair<std::string, std::int64_t>>{{"Refunded", 2}, {"Paid", 1}}));
  const auto oldest = store_->oldest_pending(*c);
  ASSERT_TRUE(oldest.has_value());
  const auto age = std::chrono::system_clock::now() - *oldest;
  EXPECT_GT(age, std::chrono::minutes(90));
  EXPECT_LT(age, std::chrono::minutes(150));
  if (checking_) {
    EXPECT_EQ(checking_->scans, std::vector<std::string>{});
    EXPECT_EQ(checking_->statements, 3);
  }
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
  EXPECT_EQ(store_->release_claims(watched(*conn), "node-a"), 4);
  for (const char* id : {"plain", "plain-retry", "held-head", "grouped-unnumbered"}) {
    EXPECT_EQ(locked_by(id), std::nullopt) << id;
  }
  EXPECT_EQ(locked_by("other-node"), "node-b");
  EXPECT_EQ(locked_by("other-node-grouped"), "node-b");
  EXPECT_EQ(locked_by("done-0"), "node-a");  // settled rows are left as they are
  EXPECT_EQ(locked_by("dead"), "node-a");
  if (checking_) {
    EXPECT_EQ(checking_->scans, std::vector<std::string>{});
  }
  EXPECT_EQ(store_->release_claims(*conn, "node-a"), 0);
}

INSTANTIATE_TEST_SUITE_P(Engines, TableWide, testing::all_engines(), testing::engine_name);

}  // namespace
}  // namespace outbox

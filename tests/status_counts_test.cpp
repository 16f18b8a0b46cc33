// The status report's counts on every engine (GET /api/status, which the dashboard asks for every
// 2 s, and `outbox status`): exact for rows of every kind (grouped or not, an outside client's
// status), and on SQLite read through the indexes of the rows they count, never the whole table
// nor every row's created_at (at 1,000,000 rows the report read the table three times: 0.55 s).

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

class StatusCounts : public testing::GroupContractFixture {
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
              const std::string& key = {}) {
    const std::string at = hours_ago(age_hours);
    const std::string group =
        key.empty() ? "NULL, NULL"
                    : "'" + key + "', " + std::to_string(message_group_partition(key));
    pool_->acquire()->execute(
        "INSERT INTO " + table_ +
        " (event_id, event_type, aggregate_type, payload, status, attempts, available_at, "
        "created_at, done_at, message_group, partition_no) VALUES ('" +
        id + "', '" + type + "', 'Order', '{}', " + std::to_string(status) + ", 0, " + at + ", " +
        at + ", " + (status == 1 || status == 3 ? at : "NULL") + ", " + group + ")");
  }
};

TEST_P(StatusCounts, CountEveryKindOfRowOnceAndReadOnlyTheirIndexes) {
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
  if (checking) {
    EXPECT_EQ(checking->scans, std::vector<std::string>{});
    EXPECT_EQ(checking->statements, 3);
  }
}

TEST_P(StatusCounts, AnEmptyTableAndOneWithoutPendingRowsCountNothing) {
  auto conn = pool_->acquire();
  EXPECT_EQ(store_->count_by_status(*conn), (std::vector<std::int64_t>{0, 0, 0, 0}));
  EXPECT_FALSE(store_->oldest_pending(*conn).has_value());
  insert("done", "Shipped", 1, 3, "order-1");
  insert("dead", "Paid", 3, 3, "order-1");
  EXPECT_EQ(store_->count_by_status(*conn), (std::vector<std::int64_t>{0, 1, 0, 1}));
  EXPECT_FALSE(store_->oldest_pending(*conn).has_value());
}

INSTANTIATE_TEST_SUITE_P(Engines, StatusCounts, testing::all_engines(), testing::engine_name);

}  // namespace
}  // namespace outbox

// Message groups' actions on one group on every engine (an operator's find, retry, skip-head and
// dead-letter, the relay's dead_letter_group policy, the correction of a wrong partition number):
// they take the group's rows, those other clients left without a number included, and, on
// SQLite, no statement of them reads the table whole. With the ranges of unnumbered rows OR-ed
// into one condition, each of them read every pending grouped row: at a million rows a backlog,
// a dead-lettered group held SQLite's write lock for about a second, and the admin API's list of
// 1,000 groups read the backlog 2,000 times.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "outbox/sql/connection.hpp"
#include "outbox/sql/group_store.hpp"
#include "tests/support/group_contract_fixture.hpp"
#include "tests/support/plan_checking.hpp"

namespace outbox {
namespace {

using testing::PlanChecking;

class GroupOperations : public testing::GroupContractFixture {
 protected:
  // Rows as another client writes them: `partition` as SQL (a number, NULL, or one out of range).
  struct Written {
    std::string id;
    std::string key;
    std::string partition;
  };
  void insert(const std::vector<Written>& rows) {
    const std::string now =
        engine_is("sqlite") ? "0" : (engine_is("postgres") ? "now()" : "UTC_TIMESTAMP(6)");
    auto conn = pool_->acquire();
    constexpr std::size_t kPerStatement = 500;
    for (std::size_t from = 0; from < rows.size(); from += kPerStatement) {
      std::string values;
      for (std::size_t i = from; i < std::min(rows.size(), from + kPerStatement); ++i) {
        values += (values.empty() ? "('" : ", ('") + rows[i].id + "', 'Moved', 'Order', '{}', " +
                  "0, 0, " + now + ", " + now + ", '" + rows[i].key + "', " + rows[i].partition +
                  ")";
      }
      conn->execute("INSERT INTO " + table_ +
                    " (event_id, event_type, aggregate_type, payload, status, attempts, "
                    "available_at, created_at, message_group, partition_no) VALUES " +
                    values);
    }
  }
  static std::string own(const std::string& key) {
    return std::to_string(message_group_partition(key));
  }
  // `conn` itself, or on SQLite `conn` asking for each statement's plan (checking_).
  sql::Connection& watched(sql::Connection& conn, std::vector<std::string> small_indexes = {}) {
    if (!engine_is("sqlite")) {
      return conn;
    }
    return checking_.emplace(conn, table_, std::move(small_indexes));
  }
  std::int64_t count(const std::string& where) { return count_rows(table_ + " WHERE " + where); }
  std::int64_t count_rows(const std::string& from) {
    return pool_->acquire()->query("SELECT COUNT(*) FROM " + from)[0].get_int(0);
  }
  std::optional<PlanChecking> checking_;
};

TEST_P(GroupOperations, TheActionsOnAGroupTakeItsUnnumberedRowsAndReadOnlyTheGroup) {
  std::vector<Written> rows;
  for (int k = 0; k < 30; ++k) {
    const std::string key = "around-" + std::to_string(k);
    rows.push_back({key + "-a", key, own(key)});
    rows.push_back({key + "-b", key, own(key)});
  }
  // Its head an unnumbered row, its other rows numbered or not by turns.
  std::vector<std::string> odd = {"NULL", "-1", "70"};
  if (engine_is("sqlite")) {
    odd.push_back("0.5");
  }
  rows.push_back({"ops-0", "ops", "NULL"});
  for (std::size_t i = 1; i < 2 * odd.size(); ++i) {
    rows.push_back({"ops-" + std::to_string(i), "ops", i % 2 == 1 ? own("ops") : odd[i / 2]});
  }
  const auto in_group = static_cast<std::int64_t>(2 * odd.size());
  const std::string wrong =
      std::to_string((message_group_partition("misfiled") + 1) % kMessageGroupPartitions);
  rows.push_back({"misfiled-1", "misfiled", wrong});
  insert(rows);

  auto conn = pool_->acquire();
  auto* c = &watched(*conn);
  const auto now = Clock::system()->now();
  const auto info = groups_->find(*c, "ops");
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->head_event_id, "ops-0");
  EXPECT_EQ(info->pending, in_group);
  EXPECT_FALSE(info->partition.has_value());
  EXPECT_TRUE(groups_->retry(*c, "ops", now));
  EXPECT_EQ(groups_->skip_head(*c, "ops", now), std::optional<std::string>("ops-0"));
  EXPECT_EQ(groups_->find(*c, "ops")->head_event_id, "ops-1");
  EXPECT_EQ(groups_->repartition(*c, "misfiled"), 1);
  EXPECT_EQ(groups_->dead_letter_group(*c, "ops", now), in_group - 1);
  EXPECT_FALSE(groups_->find(*c, "ops").has_value());
  if (checking_) {
    EXPECT_GT(checking_->statements, 8);
    EXPECT_EQ(checking_->scans, std::vector<std::string>{});
  }
  EXPECT_EQ(count("message_group = 'ops' AND status = 3"), in_group);
  EXPECT_EQ(count("message_group LIKE 'around-%' AND status = 0"), 60);
  EXPECT_EQ(count("message_group = 'misfiled' AND partition_no = " + own("misfiled")), 1);
}

// SQLite keeps whatever another client writes into partition_no: text, fractions, reals past
// any integer. Each row counts once, in the one arm it belongs to (-0.5 and 64.5 matched two,
// and were counted twice), and a head holding such a value is shown and acted on (its value made
// show, retry and skip-head fail on reading it as an integer).
TEST_P(GroupOperations, OnSqliteAnyValueOfThePartitionNumberCountsOnceAndNeverFailsAnAction) {
  if (!engine_is("sqlite")) {
    GTEST_SKIP() << "the other engines' column holds whole numbers only";
  }
  insert({{"odd-0", "odd", "'x'"},
          {"odd-1", "odd", "-0.5"},
          {"odd-2", "odd", "64.5"},
          {"odd-3", "odd", "0.5"},
          {"odd-4", "odd", own("odd")},
          {"odd-5", "odd", "1e300"}});
  auto conn = pool_->acquire();
  auto* c = &watched(*conn);
  const auto now = Clock::system()->now();
  const auto info = groups_->find(*c, "odd");
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->head_event_id, "odd-0");
  EXPECT_EQ(info->pending, 6);
  EXPECT_FALSE(info->partition.has_value());
  EXPECT_TRUE(groups_->retry(*c, "odd", now));
  EXPECT_EQ(groups_->skip_head(*c, "odd", now), std::optional<std::string>("odd-0"));
  const auto next = groups_->find(*c, "odd");
  EXPECT_EQ(next->head_event_id, "odd-1");
  EXPECT_FALSE(next->partition.has_value());
  EXPECT_EQ(next->pending, 5);
  EXPECT_EQ(groups_->dead_letter_group(*c, "odd", now), 5);
  EXPECT_EQ(checking_->scans, std::vector<std::string>{});
  EXPECT_EQ(count("message_group = 'odd' AND status = 3"), 6);
}

// Thousands of rows, numbered and unnumbered by turns: every one after the failed head goes DEAD
// with it, whatever arm it came from; the rows before the head (delivered, their DONE marks not
// yet written), DONE rows and other groups' stay as they are.
TEST_P(GroupOperations, ADeadLetteredGroupOfThousandsOfRowsGoesDeadFromItsHeadOn) {
  std::vector<Written> rows;
  for (int i = 0; i < 9000; ++i) {
    rows.push_back({"big-" + std::to_string(i), "big",
                    i % 3 == 0 ? own("big") : (i % 3 == 1 ? "NULL" : "64")});
  }
  rows.push_back({"small-0", "small", own("small")});
  insert(rows);
  auto conn = pool_->acquire();
  conn->execute("UPDATE " + table_ + " SET status = 1 WHERE event_id IN ('big-1', 'big-5000')");
  const std::string head = "big-3";  // big-0, big-1 (DONE) and big-2 before it
  const auto token = take(partition_lease_name(message_group_partition("big")));
  ASSERT_EQ(claim({head}, token), std::vector<std::string>{head});
  auto* c = &watched(*conn);
  EXPECT_EQ(groups_->dead_letter(*c, head, "big", "bad", Clock::system()->now(), "relay-a"),
            9000 - 3 - 1);
  if (checking_) {
    EXPECT_EQ(checking_->scans, std::vector<std::string>{});
  }
  EXPECT_EQ(count("message_group = 'big' AND status = 3"), 9000 - 3 - 1);
  EXPECT_EQ(count("event_id IN ('big-0', 'big-2') AND status = 0"), 2);
  EXPECT_EQ(count("event_id IN ('big-1', 'big-5000') AND status = 1"), 2);
  EXPECT_EQ(count("message_group = 'small' AND status = 0"), 1);
  EXPECT_EQ(groups_->find(*conn, "big")->pending, 2);
}

// An operator's list (the dashboard asks for it every 2 s): blocked groups, then groups whose
// head has failed, found through the block table and, on SQLite and PostgreSQL, the index of
// grouped rows that have failed (schema version 12). On SQLite no statement of it reads the
// pending rows (it read them all: 1.2 s at 1,000,000).
TEST_P(GroupOperations, AListOfGroupsReadsOnlyTheRowsThatFailed) {
  std::vector<Written> rows;
  for (int k = 0; k < 200; ++k) {
    const std::string key = "calm-" + std::to_string(k);
    rows.push_back({key, key, own(key)});
  }
  rows.push_back({"failing-0", "failing", own("failing")});
  rows.push_back({"failing-1", "failing", own("failing")});
  rows.push_back({"parked-0", "parked", own("parked")});
  insert(rows);
  auto conn = pool_->acquire();
  // Its head failed twice and waits for its next attempt, as a relay leaves it.
  conn->execute("UPDATE " + table_ +
                " SET status = 2, attempts = 2, last_error = 'HTTP 503' WHERE event_id = "
                "'failing-0'");
  const auto token = take(partition_lease_name(message_group_partition("parked")));
  ASSERT_EQ(claim({"parked-0"}, token), std::vector<std::string>{"parked-0"});
  ASSERT_TRUE(
      groups_->block(*conn, "parked-0", "parked", "HTTP 500", Clock::system()->now(), "relay-a"));
  auto* c = &watched(*conn, {table_ + "_groups_failing"});
  const auto listed = groups_->list(*c, 10);
  ASSERT_EQ(listed.size(), 2U);
  EXPECT_EQ(listed[0].message_group, "parked");
  EXPECT_TRUE(listed[0].blocked);
  EXPECT_EQ(listed[1].message_group, "failing");
  EXPECT_EQ(listed[1].attempts, 2);
  EXPECT_EQ(listed[1].pending, 2);
  if (checking_) {
    EXPECT_EQ(checking_->scans, std::vector<std::string>{});
  }
  if (engine_is("postgres")) {
    EXPECT_EQ(count_rows("pg_indexes WHERE indexname = lower('" + table_ + "_groups_failing')"), 1);
  }
}

INSTANTIATE_TEST_SUITE_P(Engines, GroupOperations, testing::all_engines(), testing::engine_name);

}  // namespace
}  // namespace outbox

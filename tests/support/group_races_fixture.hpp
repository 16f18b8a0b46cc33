#pragma once
// The fixture of the message-group race tests: a hooked node (tests/support/hooked_group_store.hpp)
// and rows as an outside client writes them, with or without their partition.

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "outbox/groups.hpp"
#include "tests/support/hooked_group_store.hpp"

namespace outbox::testing {

class GroupRacesFixture : public HookedGroupFixture {
 protected:
  // A row of `group` as an outside client writes it: (id, its number, with its partition or
  // without, the client not having computed it).
  struct OutsideRow {
    std::string id;
    int n;
    bool partitioned;
  };
  // An instant in SQL as the engine's columns keep it (SQLite: microseconds; 0 is long due).
  std::string sql_now() const {
    const auto& engine = GetParam().name;
    return engine == "sqlite" ? "0" : engine == "postgres" ? "now()" : "UTC_TIMESTAMP(6)";
  }
  // `rows` of `group` in one statement, in that order.
  std::string outside_rows(const std::string& group, const std::vector<OutsideRow>& rows) const {
    const std::string now = sql_now();
    std::string sql = "INSERT INTO " + table_ +
                      " (event_id, event_type, aggregate_type, payload, headers, status, "
                      "attempts, available_at, created_at, message_group, partition_no) VALUES ";
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const auto& r = rows[i];
      sql += (i == 0 ? "('" : ", ('") + r.id + "', 'E', NULL, '{\"n\":" + std::to_string(r.n) +
             "}', NULL, 0, 0, " + now + ", " + now + ", '" + group + "', " +
             (r.partitioned ? std::to_string(message_group_partition(group)) : "NULL") + ")";
    }
    return sql;
  }
  // Rows m0 … m<count - 1>, numbered 0 … count - 1, with their partition.
  static std::vector<OutsideRow> numbered_rows(int count) {
    std::vector<OutsideRow> rows;
    for (int n = 0; n < count; ++n) {
      rows.push_back({"m" + std::to_string(n), n, true});
    }
    return rows;
  }
  // Two rows of `group`: #0 without a partition, #1 with it.
  std::string outside_rows(const std::string& group) const {
    return outside_rows(group, {{"m0", 0, false}, {"m1", 1, true}});
  }

  // True when a runs() read asks for `group`.
  static bool reads(const std::vector<std::pair<int, std::string>>& asked,
                    const std::string& group) {
    return std::any_of(asked.begin(), asked.end(),
                       [&](const auto& g) { return g.second == group; });
  }
  // Starts the hooked node and waits until `group` has had `events` events delivered.
  ::testing::AssertionResult run_until_seen(
      const std::string& group, std::size_t events, const std::atomic<int>& stage,
      std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
    nodes_.front()->outbox->start();
    if (wait_until([&] { return ledger_.seen(group).size() == events; }, timeout)) {
      return ::testing::AssertionSuccess();
    }
    return ::testing::AssertionFailure()
           << "stage " << stage.load() << ", seen " << ledger_.seen(group).size();
  }
};

}  // namespace outbox::testing

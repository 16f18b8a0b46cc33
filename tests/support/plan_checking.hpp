#pragma once
// On SQLite, a connection that asks for each statement's plan as it runs it and records every
// step that reads the table whole, a range of it in rowid order, or a range of partition numbers:
// the statements a test runs through it are asked to use an index range of what they need.

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tests/support/delegating_connection.hpp"

namespace outbox::testing {

class PlanChecking final : public DelegatingConnection {
 public:
  // Whole reads of the indexes named in `small_indexes` (partial ones, empty while all is well)
  // are not recorded.
  PlanChecking(sql::Connection& inner, std::string table,
               std::vector<std::string> small_indexes = {})
      : DelegatingConnection(inner),
        table_(std::move(table)),
        small_indexes_(std::move(small_indexes)) {}
  std::int64_t execute(std::string_view sql, std::span<const sql::Value> params) override {
    check(sql, params);
    return inner().execute(sql, params);
  }
  std::vector<sql::Row> query(std::string_view sql, std::span<const sql::Value> params) override {
    check(sql, params);
    return inner().query(sql, params);
  }
  std::vector<std::string> scans;  // "statement: plan step" of each such read
  // Indexes whose use is recorded in `scans` too (one read in its order from an end, say).
  std::vector<std::string> shunned_indexes;
  int statements = 0;

 private:
  void check(std::string_view sql, std::span<const sql::Value> params) {
    ++statements;
    const std::string scan = "SCAN " + table_;
    // A range of the rowid reads the table in its order too: from an old row on, most of it.
    const std::string rowid_range = "SEARCH " + table_ + " USING INTEGER PRIMARY KEY (rowid";
    for (const auto& step : inner().query("EXPLAIN QUERY PLAN " + std::string(sql), params)) {
      const std::string detail = step.get_text(3);
      const bool whole = detail.rfind(scan, 0) == 0 &&
                         (detail.size() == scan.size() || detail[scan.size()] == ' ') &&
                         !small(detail.substr(scan.size()));
      const bool ranged = detail.rfind(rowid_range, 0) == 0 && detail.size() > rowid_range.size() &&
                          detail[rowid_range.size()] != '=';
      // A range of partition numbers reads the rows of every key in it: a group's rows are in
      // one partition (or in the indexes of rows without a number).
      const bool partitions = detail.find("(partition_no>") != std::string::npos ||
                              detail.find("(partition_no<") != std::string::npos;
      bool shunned = false;
      for (const auto& index : shunned_indexes) {
        const auto at = detail.find(" INDEX " + index);
        const auto end = at + 7 + index.size();
        shunned =
            shunned || (at != std::string::npos && (end == detail.size() || detail[end] == ' '));
      }
      if (whole || ranged || partitions || shunned) {
        scans.push_back(std::string(sql.substr(0, 120)) + ": " + detail);
      }
    }
  }
  bool small(const std::string& rest) const {
    for (const auto& index : small_indexes_) {
      for (const std::string how : {" USING INDEX ", " USING COVERING INDEX "}) {
        if (rest == how + index) {
          return true;
        }
      }
    }
    return false;
  }
  std::string table_;
  std::vector<std::string> small_indexes_;
};

}  // namespace outbox::testing

#pragma once
// The message-group store written once over a Dialect: scans of a partition, fenced claims of
// group heads, blocked groups and the operators' actions (the claim's reads in group_reads.cpp,
// the writes and reads of one group in group_actions.cpp).

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "outbox/groups.hpp"
#include "outbox/sql/dialect.hpp"

namespace outbox::sql {

/// The blocked-groups table of the outbox table `table`.
std::string group_block_table_name(const std::string& table);

/// "(partition_no < 0 OR partition_no >= 64)": a partition number outside the partitions, which
/// counts as none (the condition of the index of such rows, schema version 12).
std::string group_partition_out_of_range();

/// GroupStore over `dialect` (which must outlive it) on `table` at schema version 5.
/// `database_clock` as sql::StoreOptions::use_database_clock. Thread-safe (stateless apart from
/// configuration and where assign_partitions() resumes). Throws std::invalid_argument on a bad
/// table name.
class SqlGroupStore final : public GroupStore {
 public:
  SqlGroupStore(const Dialect& dialect, std::string table, bool database_clock);

  int assign_partitions(Connection& conn, const std::vector<LeaseToken>& partition_leases,
                        int limit) override;
  std::vector<GroupScanRow> scan(Connection& conn, const std::vector<GroupScanRange>& ranges,
                                 Timestamp now) override;
  bool has_fronts() const override { return fronts_; }
  /// Claims read in key order only (the table has no index of fronts yet). Before any use.
  void without_fronts() { fronts_ = false; }
  std::vector<GroupScanRow> front(Connection& conn, const std::vector<int>& partitions,
                                  int rows_each, Timestamp now) override;
  std::vector<GroupScanRow> runs(Connection& conn,
                                 const std::vector<std::pair<int, std::string>>& groups,
                                 int per_group, Timestamp now) override;
  std::vector<std::string> blocked(Connection& conn,
                                   const std::vector<std::string>& groups) override;
  std::vector<std::string> held_back(Connection& conn, const std::vector<std::string>& groups,
                                     const std::vector<std::string>& heads) override;
  int repartition(Connection& conn, const std::string& group) override;
  std::vector<std::string> unassigned(Connection& conn,
                                      const std::vector<std::string>& groups) override;
  std::vector<OutboxEvent> claim(Connection& conn, const std::vector<LeaseToken>& partition_leases,
                                 const std::vector<std::string>& event_ids) override;
  bool hold(Connection& conn, std::string_view event_id, const LeaseToken& partition_lease,
            std::string_view owner, Timestamp now) override;
  bool block(Connection& conn, std::string_view event_id, std::string_view message_group,
             std::string_view error, Timestamp now, std::string_view owner) override;
  int dead_letter(Connection& conn, std::string_view event_id, std::string_view message_group,
                  std::string_view error, Timestamp now, std::string_view owner) override;
  std::vector<GroupInfo> list(Connection& conn, int limit) override;
  std::optional<GroupInfo> find(Connection& conn, std::string_view message_group) override;
  bool retry(Connection& conn, std::string_view message_group, Timestamp now) override;
  std::optional<std::string> skip_head(Connection& conn, std::string_view message_group,
                                       Timestamp now) override;
  int dead_letter_group(Connection& conn, std::string_view message_group, Timestamp now) override;
  GroupStats stats(Connection& conn) override;

 private:
  Statement statement() const { return Statement(dialect_, database_clock_); }
  // The ranges of partition_no that hold no number (none, one outside 0 … 63, a fraction where
  // the column keeps one), disjoint: each read through an index on every engine (outside 0 … 63
  // through <table>_groups_outside where indexes may be partial).
  std::vector<std::string> unnumbered_ranges() const;
  // "SELECT <columns> FROM table WHERE <grouped pending> AND <range> AND message_group = ? …
  // UNION ALL …": the group's pending rows, an arm for its partition and one per unnumbered range
  // (each an index range; with the ranges OR-ed, SQLite read every pending grouped row). Only rows
  // after `after` in insert order when given; when limit > 0, each arm its first `limit` rows in
  // insert order (a derived table each where the engine needs one).
  void group_arms(Statement& s, const std::string& columns, const std::string& message_group,
                  std::optional<std::int64_t> after = std::nullopt, int limit = 0) const;
  // Opens arm `i` of a UNION ALL whose arms each have their own ORDER BY and LIMIT, and closes it
  // (aliased `alias` where the engine needs a derived table).
  void open_arm(Statement& s, std::size_t i) const;
  void close_arm(Statement& s, const std::string& alias) const;
  // " AND <grouped pending> AND ((partition_no = ? AND <its lease live>) OR …)": rows only under
  // their own partition's lease, live in the database with that epoch.
  // `share_lock` as append_fence_condition: true for a write.
  void fenced_by(Statement& s, const std::vector<LeaseToken>& partition_leases,
                 bool share_lock) const;
  // "EXISTS (…)": a block row counts while the head it names is still pending.
  std::string live_block() const;
  // "SELECT message_group FROM <block table> WHERE <live> AND message_group IN (…)".
  void select_blocked(Statement& s, const std::vector<std::string>& groups) const;
  // "SELECT <columns> FROM table WHERE <pending, grouped, one range of unnumbered> … UNION ALL …":
  // pending rows outside the partitions (written by an outside client), of groups[from, from + n)
  // when `groups` is given, after `*after` in key order when that is given.
  void unassigned_arms(Statement& s, const std::string& columns,
                       const std::vector<std::string>* groups, std::size_t from, std::size_t n,
                       const std::string* after = nullptr) const;
  // "SELECT DISTINCT message_group FROM (…) u": groups with pending rows outside the partitions
  // (written by an outside client), of groups[from, from + n) when `groups` is given, after
  // `*after` in key order when that is given.
  void select_unassigned(Statement& s, const std::vector<std::string>* groups, std::size_t from,
                         std::size_t n, const std::string* after = nullptr) const;
  // Every pending row of the group (after the one at `after` in insert order, when given) → DEAD
  // with `error`; the block row removed.
  int kill_group(Connection& conn, const std::string& message_group, const std::string& error,
                 Timestamp now, std::optional<std::int64_t> after = std::nullopt);
  void unblock(Connection& conn, const std::string& message_group);
  // "SELECT event_id, message_group, partition_no, due, seq, due_at, <arm> AS arm FROM table
  // WHERE " pending and grouped: the columns a GroupScanRow is read from (and the union arm it
  // came from), up to the rest of the WHERE.
  void select_scan_row(Statement& s, Timestamp now, std::size_t arm) const;

  const Dialect& dialect_;
  std::string table_;
  std::string block_table_;
  std::string lease_table_;
  bool database_clock_;
  bool fronts_;
  std::string columns_;
  // "<no number, or one outside 0 … 63, or a fraction where the column keeps one>".
  std::string unnumbered_;
  // "partition_no IN (<every partition but p>)" for each partition p: a number in range but not
  // the key's own, read as 63 index ranges (a range over 0 … 63 read every pending grouped row).
  std::vector<std::string> other_partitions_;
  std::mutex assign_mutex_;    // guards assign_cursor_
  std::string assign_cursor_;  // the last group assign_partitions() read ('' : from the start)
};

}  // namespace outbox::sql

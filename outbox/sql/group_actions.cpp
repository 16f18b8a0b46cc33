// SqlGroupStore's writes and reads of one group: a failed head dead-lettered with its group, and
// an operator's actions (find, list, retry, skip-head, dead-letter) and the blocked-groups gauge.
// A group's rows are read through its arms (group_arms): an index range each.

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "outbox/envelope.hpp"
#include "outbox/internal/in_transaction.hpp"
#include "outbox/sql/connection.hpp"
#include "outbox/sql/group_store.hpp"

namespace outbox::sql {

using internal::in_transaction;

void SqlGroupStore::group_arms(Statement& s, const std::string& columns,
                               const std::string& message_group, std::optional<std::int64_t> after,
                               int limit) const {
  auto ranges = unnumbered_ranges();
  ranges.insert(ranges.begin(),
                "partition_no = " + std::to_string(message_group_partition(message_group)));
  for (std::size_t i = 0; i < ranges.size(); ++i) {
    if (limit > 0) {
      open_arm(s, i);
    } else if (i > 0) {
      s.sql(" UNION ALL ");
    }
    s.sql("SELECT " + columns + " FROM " + table_ + " WHERE " + dialect_.group_pending_filter() +
          " AND " + ranges[i] + " AND message_group = ")
        .param(message_group);
    if (after) {
      s.sql(" AND " + dialect_.group_order_column() + " > ").param(*after);
    }
    if (limit > 0) {
      // The arms of ranges of numbers (outside 0 … 63, fractions) sort their few rows: ordered by
      // the column itself, SQLite read the whole table in its order for a LIMIT above a few rows.
      const bool ranged =
          ranges[i].find('<') != std::string::npos || ranges[i].find(">=") != std::string::npos;
      s.sql(" ORDER BY " + dialect_.group_order_column() + (ranged ? " + 0" : "") + " LIMIT " +
            std::to_string(limit));
      close_arm(s, "g" + std::to_string(i));
    }
  }
}

int SqlGroupStore::dead_letter(Connection& conn, std::string_view event_id,
                               std::string_view message_group, std::string_view error,
                               Timestamp now, std::string_view owner) {
  const std::string truncated = truncate_error(error);
  const std::string group(message_group);
  return in_transaction(conn, [&] {
    // Only the events after the head: those before it were delivered (their DONE marks may not
    // be written yet).
    Statement place = statement();
    place.sql("SELECT " + dialect_.group_order_column() + " FROM " + table_ + " WHERE event_id = ")
        .param(std::string(event_id));
    const auto found = place.query(conn);
    if (found.empty()) {
      return 0;
    }
    const std::int64_t head_place = found[0].get_int(0);
    Statement head = statement();
    head.sql("UPDATE " + table_ + " SET status = " + status_sql(EventStatus::Dead) +
             ", attempts = attempts + 1, last_error = ")
        .param(truncated)
        .sql(", done_at = ")
        .now(now)
        .sql(", locked_by = NULL, locked_at = NULL WHERE event_id = ")
        .param(std::string(event_id))
        .sql(" AND " + pending_statuses())
        .owned_by(owner);
    if (head.execute(conn) != 1) {
      return 0;
    }
    return 1 + kill_group(conn, group,
                          truncate_error("dead-lettered with its group: head event " +
                                         std::string(event_id) + " failed: " + truncated),
                          now, head_place);
  });
}

int SqlGroupStore::kill_group(Connection& conn, const std::string& message_group,
                              const std::string& error, Timestamp now,
                              std::optional<std::int64_t> after) {
  // One statement, one pass. With the unnumbered ranges OR-ed into its condition, SQLite read
  // every pending grouped row (a second at a million rows, holding the write lock) for each
  // dead-lettered group: there and on MariaDB the rows are chosen through the group's arms, each
  // an index range. Read and taken in pages by id instead, a group of 1,000,000 rows took 78 s
  // on PostgreSQL and 174 s on MariaDB (each page passed the index entries of the rows taken
  // before it).
  const std::string set = " = " + status_sql(EventStatus::Dead) + ", ";
  Statement s = statement();
  if (dialect_.unions_or_of_ranges()) {
    // One pass over the ranges' union in the table's order: 2.3 times as fast as the arms' ids
    // looked up one by one (PostgreSQL, a group of 300,000 rows).
    s.sql("UPDATE " + table_ + " SET status" + set + "last_error = ")
        .param(error)
        .sql(", done_at = ")
        .now(now)
        .sql(", locked_by = NULL, locked_at = NULL WHERE " + dialect_.group_pending_filter() +
             " AND message_group = ")
        .param(message_group)
        .sql(" AND (partition_no = " + std::to_string(message_group_partition(message_group)) +
             " OR " + unnumbered_ + ")");
    if (after) {
      s.sql(" AND " + dialect_.group_order_column() + " > ").param(*after);
    }
  } else if (dialect_.update_through_derived_table()) {
    s.sql("UPDATE (");
    group_arms(s, "event_id", message_group, after);
    s.sql(") d STRAIGHT_JOIN " + table_ + " t ON t.event_id = d.event_id SET t.status" + set +
          "t.last_error = ")
        .param(error)
        .sql(", t.done_at = ")
        .now(now)
        .sql(", t.locked_by = NULL, t.locked_at = NULL WHERE t." + dialect_.group_pending_filter());
  } else {
    s.sql("UPDATE " + table_ + " SET status" + set + "last_error = ")
        .param(error)
        .sql(", done_at = ")
        .now(now)
        .sql(", locked_by = NULL, locked_at = NULL WHERE " + dialect_.group_pending_filter() +
             " AND event_id IN (");
    group_arms(s, "event_id", message_group, after);
    s.sql(")");
  }
  const int changed = static_cast<int>(s.execute(conn));
  unblock(conn, message_group);
  return changed;
}

void SqlGroupStore::unblock(Connection& conn, const std::string& message_group) {
  Statement s = statement();
  s.sql("DELETE FROM " + block_table_ + " WHERE message_group = ").param(message_group);
  s.execute(conn);
}

std::optional<GroupInfo> SqlGroupStore::find(Connection& conn, std::string_view message_group) {
  const std::string group(message_group);
  // Each arm's first row, the earliest of them the head.
  Statement s = statement();
  group_arms(s,
             "event_id, event_type, attempts, last_error, " + dialect_.micros("created_at") +
                 ", partition_no, " + dialect_.group_order_column(),
             group, std::nullopt, 1);
  const auto heads = s.query(conn);
  if (heads.empty()) {
    return std::nullopt;
  }
  const auto head = std::min_element(heads.begin(), heads.end(), [](const Row& a, const Row& b) {
    return a.get_int(6) < b.get_int(6);
  });
  GroupInfo info;
  info.message_group = group;
  info.head_event_id = head->get_text(0);
  info.head_event_type = head->get_text(1);
  info.attempts = static_cast<int>(head->get_int(2));
  info.last_error = head->get_optional_text(3);
  info.head_created_at = from_micros(head->get_int(4));
  // As the row holds it when a whole number; another client's text or fraction (which counts as
  // none) made the whole command fail.
  if (const auto* p = std::get_if<std::int64_t>(&head->at(5));
      p != nullptr && *p >= std::numeric_limits<int>::min() &&
      *p <= std::numeric_limits<int>::max()) {
    info.partition = static_cast<int>(*p);
  }
  Statement count = statement();
  group_arms(count, "COUNT(*)", group);
  info.pending = 0;
  for (const auto& row : count.query(conn)) {
    info.pending += row.get_int(0);
  }
  Statement blocked = statement();
  blocked
      .sql("SELECT " + dialect_.micros("blocked_at") + " FROM " + block_table_ + " WHERE " +
           live_block() + " AND message_group = ")
      .param(group);
  if (const auto rows = blocked.query(conn); !rows.empty()) {
    info.blocked = true;
    info.blocked_at = from_micros(rows[0].get_int(0));
  }
  return info;
}

std::vector<GroupInfo> SqlGroupStore::list(Connection& conn, int limit) {
  std::vector<std::string> groups;
  Statement blocked = statement();
  blocked
      .sql("SELECT message_group FROM " + block_table_ + " WHERE " + live_block() +
           " ORDER BY blocked_at LIMIT ")
      .param(std::int64_t{limit});
  for (const auto& row : blocked.query(conn)) {
    groups.push_back(row.get_text(0));
  }
  if (static_cast<int>(groups.size()) < limit) {
    Statement failing = statement();
    failing
        .sql("SELECT DISTINCT message_group FROM " + table_ + " WHERE " +
             dialect_.group_pending_filter() + " AND attempts > 0 LIMIT ")
        .param(std::int64_t{limit});
    for (const auto& row : failing.query(conn)) {
      std::string group = row.get_text(0);
      if (static_cast<int>(groups.size()) < limit &&
          std::find(groups.begin(), groups.end(), group) == groups.end()) {
        groups.push_back(std::move(group));
      }
    }
  }
  std::vector<GroupInfo> out;
  for (const auto& group : groups) {
    if (auto info = find(conn, group); info && (info->blocked || info->attempts > 0)) {
      out.push_back(std::move(*info));
    } else if (!info) {
      unblock(conn, group);  // nothing pending any more: a stale block
    }
  }
  std::stable_sort(out.begin(), out.end(), [](const GroupInfo& a, const GroupInfo& b) {
    return a.blocked != b.blocked ? a.blocked : a.head_created_at < b.head_created_at;
  });
  return out;
}

bool SqlGroupStore::retry(Connection& conn, std::string_view message_group, Timestamp now) {
  const std::string group(message_group);
  return in_transaction(conn, [&] {
    const auto info = find(conn, group);
    unblock(conn, group);
    if (!info) {
      return false;
    }
    Statement s = statement();
    s.sql("UPDATE " + table_ + " SET attempts = 0, available_at = ")
        .now(now)
        .sql(" WHERE event_id = ")
        .param(info->head_event_id)
        .sql(" AND " + pending_statuses());
    return s.execute(conn) == 1;
  });
}

std::optional<std::string> SqlGroupStore::skip_head(Connection& conn,
                                                    std::string_view message_group, Timestamp now) {
  const std::string group(message_group);
  return in_transaction(conn, [&]() -> std::optional<std::string> {
    const auto info = find(conn, group);
    unblock(conn, group);
    if (!info) {
      return std::nullopt;
    }
    Statement s = statement();
    s.sql("UPDATE " + table_ + " SET status = " + status_sql(EventStatus::Dead) + ", last_error = ")
        .param(truncate_error("skipped by an operator" +
                              (info->last_error ? ": " + *info->last_error : std::string())))
        .sql(", done_at = ")
        .now(now)
        .sql(", locked_by = NULL, locked_at = NULL WHERE event_id = ")
        .param(info->head_event_id)
        .sql(" AND " + pending_statuses());
    if (s.execute(conn) != 1) {
      return std::nullopt;
    }
    return info->head_event_id;
  });
}

int SqlGroupStore::dead_letter_group(Connection& conn, std::string_view message_group,
                                     Timestamp now) {
  const std::string group(message_group);
  return in_transaction(
      conn, [&] { return kill_group(conn, group, "dead-lettered by an operator", now); });
}

GroupStats SqlGroupStore::stats(Connection& conn) {
  const auto rows = statement()
                        .sql("SELECT COUNT(*), " + dialect_.micros("MIN(blocked_at)") + " FROM " +
                             block_table_ + " WHERE " + live_block())
                        .query(conn);
  GroupStats out;
  if (!rows.empty()) {
    out.blocked = rows[0].get_int(0);
    if (auto v = rows[0].get_optional_int(1)) {
      out.oldest_blocked_at = from_micros(*v);
    }
  }
  return out;
}

}  // namespace outbox::sql

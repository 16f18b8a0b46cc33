// SqlGroupStore's reads of the claim path: a partition's groups in key order (scan), its front
// in write order, and the picked groups' runs, each one UNION ALL of an arm per partition or group.

#include "outbox/sql/group_store.hpp"

#include <algorithm>
#include <bit>
#include <iterator>
#include <set>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

#include "outbox/sql/connection.hpp"

namespace outbox::sql {

void SqlGroupStore::select_scan_row(Statement& s, Timestamp now, std::size_t arm) const {
  s.sql("SELECT event_id, message_group, partition_no, CASE WHEN available_at <= ")
      .now(now)
      .sql(" THEN 1 ELSE 0 END AS due, " + dialect_.group_order_column() + " AS seq, " +
           dialect_.micros("available_at") + " AS due_at, " + std::to_string(arm) +
           " AS arm FROM " + table_ + " WHERE " + dialect_.group_pending_filter());
}

// Parenthesized where the engine allows it; as a derived table, which MariaDB materialized one by
// one (64 temporary tables a statement, a quarter of the statement's time), only on SQLite.
void SqlGroupStore::open_arm(Statement& s, std::size_t i) const {
  if (i > 0) {
    s.sql(" UNION ALL ");
  }
  s.sql(dialect_.parenthesized_arms() ? "(" : "SELECT * FROM (");
}

void SqlGroupStore::close_arm(Statement& s, const std::string& alias) const {
  s.sql(dialect_.parenthesized_arms() ? ")" : ") " + alias);
}

namespace {

// How an arm orders its rows: a group's rows together (groups in the order the arm gives them,
// which is the column's collation) or by seq alone.
enum class ArmOrder { ByGroup, BySeq };

// The rows of a UNION ALL of arms (select_scan_row): arm after arm, each group's rows together and
// by seq. SQL promises no order of a union without an ORDER BY over the whole, and a head taken
// out of order would break its group's order: that much is put right here, whatever the engine
// gave (every engine here gives it already: the sort then moves nothing). The groups of an arm
// stay in the order the engine gave them: only it knows its collation (a scan's cursor follows
// it, so a different order there delays groups, never breaks their order).
std::vector<GroupScanRow> scan_rows(const Statement& s, Connection& conn, ArmOrder order) {
  struct Keyed {
    std::int64_t arm;
    std::size_t group_rank;  // of the group's first row in the arm (ByGroup)
    GroupScanRow row;
  };
  std::vector<Keyed> keyed;
  std::unordered_map<std::string, std::size_t> first_seen;  // "arm/group"
  for (const auto& row : s.query(conn)) {
    Keyed k{.arm = row.get_int(6),
            .group_rank = 0,
            .row = {.event_id = row.get_text(0),
                    .message_group = row.get_text(1),
                    .partition = static_cast<int>(row.get_int(2)),
                    .due = row.get_int(3) == 1,
                    .seq = row.is_null(4) ? 0 : row.get_int(4),
                    .due_at = row.get_int(5)}};
    if (order == ArmOrder::ByGroup) {
      const bool as_before = !keyed.empty() && keyed.back().arm == k.arm &&
                             keyed.back().row.message_group == k.row.message_group;
      k.group_rank = as_before ? keyed.back().group_rank
                               : first_seen
                                     .try_emplace(std::to_string(k.arm) + "/" + k.row.message_group,
                                                  keyed.size())
                                     .first->second;
    }
    keyed.push_back(std::move(k));
  }
  std::stable_sort(keyed.begin(), keyed.end(), [](const Keyed& a, const Keyed& b) {
    return std::tie(a.arm, a.group_rank, a.row.seq) < std::tie(b.arm, b.group_rank, b.row.seq);
  });
  std::vector<GroupScanRow> out;
  out.reserve(keyed.size());
  for (auto& k : keyed) {
    out.push_back(std::move(k.row));
  }
  return out;
}

}  // namespace

std::vector<GroupScanRow> SqlGroupStore::scan(Connection& conn,
                                              const std::vector<GroupScanRange>& ranges,
                                              Timestamp now) {
  if (ranges.empty()) {
    return {};
  }
  // One statement for every partition: each arm walks the group index of one partition (its rows
  // kept in the arm's order by scan_rows).
  Statement s = statement();
  // Rows with an empty key (an outside writer's; the key's partition is that of "") are read by
  // an arm of their own (the cursor below, '' when none, starts after them): they are settled as
  // undecodable instead of waiting for ever.
  const int empty_key_partition = message_group_partition("");
  std::size_t arm = 0;
  for (const auto& r : ranges) {
    if (r.partition != empty_key_partition) {
      continue;
    }
    open_arm(s, arm);
    select_scan_row(s, now, arm);
    s.sql(" AND partition_no = ")
        .param(std::int64_t{r.partition})
        .sql(" AND message_group = '' ORDER BY " + dialect_.group_order_column() + " LIMIT " +
             std::to_string(std::max(1, r.limit)));
    close_arm(s, "e");
    ++arm;
  }
  for (std::size_t i = 0; i < ranges.size(); ++i, ++arm) {
    const auto& r = ranges[i];
    open_arm(s, arm);
    select_scan_row(s, now, arm);
    s.sql(" AND partition_no = ")
        .param(std::int64_t{r.partition})
        .sql(" AND message_group > ")
        .param(r.after_group);  // '' when none (empty keys: the arm above)
    // The limit inline and every arm alike: the text then depends only on how many partitions
    // and what limit, so PostgreSQL plans it once per connection (planning the arms cost more
    // than running them).
    s.sql(" ORDER BY message_group, " + dialect_.group_order_column() + " LIMIT " +
          std::to_string(std::max(1, r.limit)));
    close_arm(s, "p" + std::to_string(i));
  }
  return scan_rows(s, conn, ArmOrder::ByGroup);
}

std::vector<GroupScanRow> SqlGroupStore::front(Connection& conn, const std::vector<int>& partitions,
                                               int rows_each, Timestamp now) {
  if (partitions.empty()) {
    return {};
  }
  // Each arm reads the head of one partition's write-order index; the text depends only on how
  // many partitions and rows, so it is prepared once.
  Statement s = statement();
  for (std::size_t i = 0; i < partitions.size(); ++i) {
    open_arm(s, i);
    select_scan_row(s, now, i);
    s.sql(" AND partition_no = ")
        .param(std::int64_t{partitions[i]})
        .sql(" ORDER BY " + dialect_.group_order_column() + " LIMIT " +
             std::to_string(std::max(1, rows_each)));
    close_arm(s, "f" + std::to_string(i));
  }
  return scan_rows(s, conn, ArmOrder::BySeq);
}

std::vector<GroupScanRow> SqlGroupStore::runs(Connection& conn,
                                              const std::vector<std::pair<int, std::string>>& asked,
                                              int per_group, Timestamp now) {
  // Each group once, where it was first asked for: asked twice, its rows came back twice.
  std::vector<std::pair<int, std::string>> groups;
  {
    std::set<std::pair<int, std::string_view>> seen;
    for (const auto& g : asked) {
      if (seen.emplace(g.first, g.second).second) {
        groups.push_back(g);
      }
    }
  }
  // In statements of at most 128 arms (SQLite allows 500 in a compound SELECT), each padded to a
  // power of two up to 8 arms and to a multiple of 8 above (the last group read again, its rows
  // dropped below): the texts then repeat and are prepared once per size (19 sizes). Padded to
  // a power of two, a quarter of the rows MariaDB read for the runs were padding.
  constexpr std::size_t kMaxArms = 128;
  std::vector<GroupScanRow> out;
  for (std::size_t from = 0; from < groups.size(); from += kMaxArms) {
    const std::size_t n = std::min(kMaxArms, groups.size() - from);
    const std::size_t arms = n <= 8 ? std::bit_ceil(n) : (n + 7) / 8 * 8;
    Statement s = statement();
    for (std::size_t i = 0; i < arms; ++i) {
      const auto& [partition, group] = groups[from + std::min(i, n - 1)];
      open_arm(s, i);
      select_scan_row(s, now, i);
      s.sql(" AND partition_no = ")
          .param(std::int64_t{partition})
          .sql(" AND message_group = ")
          .param(group)
          .sql(" ORDER BY message_group, " + dialect_.group_order_column() + " LIMIT " +
               std::to_string(std::max(1, per_group)));
      close_arm(s, "r" + std::to_string(i));
    }
    auto rows = scan_rows(s, conn, ArmOrder::ByGroup);
    if (arms > n) {
      std::unordered_set<std::string> seen;
      std::erase_if(rows, [&](const GroupScanRow& r) { return !seen.insert(r.event_id).second; });
    }
    std::move(rows.begin(), rows.end(), std::back_inserter(out));
  }
  return out;
}

}  // namespace outbox::sql

#include "outbox/sql/group_store.hpp"

#include <algorithm>
#include <bit>
#include <iterator>
#include <set>
#include <stdexcept>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

#include "outbox/envelope.hpp"
#include "outbox/internal/event_row.hpp"
#include "outbox/lease.hpp"
#include "outbox/sql/connection.hpp"
#include "outbox/sql/lease_store.hpp"

namespace outbox {

std::string_view to_string(GroupFailurePolicy policy) {
  switch (policy) {
    case GroupFailurePolicy::Block:
      return "block";
    case GroupFailurePolicy::Skip:
      return "skip";
    case GroupFailurePolicy::DeadLetterGroup:
      return "dead_letter_group";
  }
  return "block";
}

GroupFailurePolicy parse_group_failure_policy(std::string_view text) {
  for (auto p :
       {GroupFailurePolicy::Block, GroupFailurePolicy::Skip, GroupFailurePolicy::DeadLetterGroup}) {
    if (text == to_string(p)) {
      return p;
    }
  }
  throw std::invalid_argument("unknown group failure policy '" + std::string(text) +
                              "' (block, skip or dead_letter_group)");
}

std::string partition_lease_name(int partition) {
  return "part:" + std::to_string(partition);
}

std::optional<int> partition_of_lease(std::string_view name) {
  constexpr std::string_view kPrefix = "part:";
  if (!name.starts_with(kPrefix) || name.size() == kPrefix.size() ||
      name.size() > kPrefix.size() + 2) {
    return std::nullopt;
  }
  int n = 0;
  for (const char c : name.substr(kPrefix.size())) {
    if (c < '0' || c > '9') {
      return std::nullopt;
    }
    n = n * 10 + (c - '0');
  }
  if (n >= kMessageGroupPartitions || (name.size() == kPrefix.size() + 2 && name[5] == '0')) {
    return std::nullopt;
  }
  return n;
}

}  // namespace outbox

namespace outbox::sql {
namespace {

// A row without a partition number, or with one outside 0 … 63: a writer outside this library
// left it to the partition's holder to number.
const std::string kUnnumbered = "partition_no IS NULL OR partition_no < 0 OR partition_no >= " +
                                std::to_string(kMessageGroupPartitions);

// Runs `fn` in a transaction of its own unless the connection is in one already.
template <typename Fn>
auto in_transaction(Connection& conn, Fn&& fn) {
  if (conn.in_transaction()) {
    return fn();
  }
  conn.begin();
  try {
    auto result = fn();
    conn.commit();
    return result;
  } catch (...) {
    try {
      conn.rollback();
    } catch (const std::exception&) {
      // The original error is the one worth reporting.
    }
    throw;
  }
}

}  // namespace

std::string group_block_table_name(const std::string& table) {
  return derived_name(table, "_group_block");
}

SqlGroupStore::SqlGroupStore(const Dialect& dialect, std::string table, bool database_clock)
    : dialect_(dialect),
      table_(std::move(table)),
      database_clock_(database_clock),
      fronts_(dialect.group_fronts()) {
  validate_table_name(table_);
  block_table_ = group_block_table_name(table_);
  lease_table_ = lease_table_name(table_);
  columns_ = internal::event_columns(dialect_, true);
}

void SqlGroupStore::of_group(Statement& s, const std::string& message_group) const {
  s.sql(" AND message_group = ").param(message_group);
  s.sql(" AND (partition_no = ")
      .param(std::int64_t{message_group_partition(message_group)})
      .sql(" OR " + kUnnumbered + ")");
}

void SqlGroupStore::select_unassigned(Statement& s, const std::vector<std::string>* groups,
                                      std::size_t from, std::size_t n,
                                      const std::string* after) const {
  // Three arms, each one range of the group index: with the three ranges OR-ed, SQLite read the
  // whole table every cycle.
  const std::string ranges[] = {"partition_no IS NULL", "partition_no < 0",
                                "partition_no >= " + std::to_string(kMessageGroupPartitions)};
  s.sql("SELECT DISTINCT message_group FROM (");
  for (std::size_t i = 0; i < std::size(ranges); ++i) {
    s.sql(std::string(i == 0 ? "" : " UNION ALL ") + "SELECT message_group FROM " + table_ +
          " WHERE " + dialect_.group_pending_filter() + " AND " + ranges[i]);
    if (groups != nullptr) {
      s.sql(" AND");
      s.ids_in("message_group", *groups, from, n);
    }
    if (after != nullptr) {
      s.sql(" AND message_group > ").param(*after);
    }
  }
  s.sql(") u");
}

int SqlGroupStore::assign_partitions(Connection& conn,
                                     const std::vector<LeaseToken>& partition_leases, int limit) {
  std::unordered_map<int, const LeaseToken*> lease_of;
  for (const auto& lease : partition_leases) {
    const auto partition = partition_of_lease(lease.name);
    if (!partition) {
      throw std::invalid_argument("group assignment: lease '" + lease.name +
                                  "' is not a partition's");
    }
    lease_of.emplace(*partition, &lease);
  }
  if (lease_of.empty()) {
    return 0;
  }
  // From where the last call stopped, in key order: groups of partitions other nodes hold are
  // passed over, and however many of them wait for their holders, the next call reads on.
  std::string after;
  {
    std::lock_guard lock(assign_mutex_);
    after = assign_cursor_;
  }
  Statement find = statement();
  // From the start ('') takes the empty key too: its rows are settled as undecodable.
  select_unassigned(find, nullptr, 0, 0, after.empty() ? nullptr : &after);
  find.sql(" ORDER BY message_group LIMIT ").param(std::int64_t{limit});
  const auto found = find.query(conn);
  {
    std::lock_guard lock(assign_mutex_);
    assign_cursor_ =
        static_cast<int>(found.size()) < limit ? std::string() : found.back().get_text(0);
  }
  int assigned = 0;
  for (const auto& row : found) {
    const std::string group = row.get_text(0);
    const int partition = message_group_partition(group);
    const auto lease = lease_of.find(partition);
    if (lease == lease_of.end()) {
      continue;  // its partition's holder numbers it
    }
    // One statement per group: a scan never sees part of a group assigned. Pending rows only
    // (what the group index holds): a statement over every row of the table read all of it.
    // Fenced: a claim in the partition reads its runs, then asks which groups still have rows
    // without a number; a row numbered in between by anyone else would be overtaken.
    Statement s = statement();
    s.sql("UPDATE " + table_ + " SET partition_no = ")
        .param(std::int64_t{partition})
        .sql(" WHERE " + dialect_.group_pending_filter() + " AND message_group = ")
        .param(group)
        .sql(" AND (" + kUnnumbered + ")");
    append_fence(s, dialect_, lease_table_, *lease->second);
    assigned += static_cast<int>(s.execute(conn));
  }
  return assigned;
}

void SqlGroupStore::select_scan_row(Statement& s, Timestamp now, std::size_t arm) const {
  s.sql("SELECT event_id, message_group, partition_no, CASE WHEN available_at <= ")
      .now(now)
      .sql(" THEN 1 ELSE 0 END AS due, " + dialect_.group_order_column() + " AS seq, " +
           dialect_.micros("available_at") + " AS due_at, " + std::to_string(arm) +
           " AS arm FROM " + table_ + " WHERE " + dialect_.group_pending_filter());
}

namespace {

// Opens arm `i` of a UNION ALL whose arms each have their own ORDER BY and LIMIT: parenthesized
// where the engine allows it; as a derived table, which MariaDB materialized one by one (64
// temporary tables a statement, a quarter of the statement's time), only on SQLite.
void open_arm(Statement& s, const Dialect& dialect, std::size_t i) {
  if (i > 0) {
    s.sql(" UNION ALL ");
  }
  s.sql(dialect.parenthesized_arms() ? "(" : "SELECT * FROM (");
}

void close_arm(Statement& s, const Dialect& dialect, const std::string& alias) {
  s.sql(dialect.parenthesized_arms() ? ")" : ") " + alias);
}

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
    open_arm(s, dialect_, arm);
    select_scan_row(s, now, arm);
    s.sql(" AND partition_no = ")
        .param(std::int64_t{r.partition})
        .sql(" AND message_group = '' ORDER BY " + dialect_.group_order_column() + " LIMIT " +
             std::to_string(std::max(1, r.limit)));
    close_arm(s, dialect_, "e");
    ++arm;
  }
  for (std::size_t i = 0; i < ranges.size(); ++i, ++arm) {
    const auto& r = ranges[i];
    open_arm(s, dialect_, arm);
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
    close_arm(s, dialect_, "p" + std::to_string(i));
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
    open_arm(s, dialect_, i);
    select_scan_row(s, now, i);
    s.sql(" AND partition_no = ")
        .param(std::int64_t{partitions[i]})
        .sql(" ORDER BY " + dialect_.group_order_column() + " LIMIT " +
             std::to_string(std::max(1, rows_each)));
    close_arm(s, dialect_, "f" + std::to_string(i));
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
      open_arm(s, dialect_, i);
      select_scan_row(s, now, i);
      s.sql(" AND partition_no = ")
          .param(std::int64_t{partition})
          .sql(" AND message_group = ")
          .param(group)
          .sql(" ORDER BY message_group, " + dialect_.group_order_column() + " LIMIT " +
               std::to_string(std::max(1, per_group)));
      close_arm(s, dialect_, "r" + std::to_string(i));
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

std::vector<std::string> SqlGroupStore::unassigned(Connection& conn,
                                                   const std::vector<std::string>& groups) {
  std::vector<std::string> out;
  // In chunks: each group is a parameter in each of the three arms (SQLite allows 32766).
  constexpr std::size_t kChunk = 1000;
  for (std::size_t from = 0; from < groups.size(); from += kChunk) {
    Statement s = statement();
    select_unassigned(s, &groups, from, std::min(kChunk, groups.size() - from));
    for (const auto& row : s.query(conn)) {
      out.push_back(row.get_text(0));
    }
  }
  return out;
}

namespace {

std::vector<std::string> texts(const Statement& s, Connection& conn) {
  std::vector<std::string> out;
  for (const auto& row : s.query(conn)) {
    out.push_back(row.get_text(0));
  }
  return out;
}

}  // namespace

std::string SqlGroupStore::live_block() const {
  // Only while the head it names is still pending: a relay deposed while it published the head
  // can still mark it DONE after the new holder blocked it (its DONE mark counts: the event was
  // delivered), and the group must not then wait for an operator behind a head that is done.
  return "EXISTS (SELECT 1 FROM " + table_ + " o WHERE o.event_id = " + block_table_ +
         ".event_id AND o." + pending_statuses() + ")";
}

void SqlGroupStore::select_blocked(Statement& s, const std::vector<std::string>& groups) const {
  s.sql("SELECT message_group FROM " + block_table_ + " WHERE " + live_block() + " AND");
  s.ids_in("message_group", groups, 0, groups.size());
}

std::vector<std::string> SqlGroupStore::blocked(Connection& conn,
                                                const std::vector<std::string>& groups) {
  if (groups.empty()) {
    return {};
  }
  Statement s = statement();
  select_blocked(s, groups);
  return texts(s, conn);
}

std::vector<std::string> SqlGroupStore::held_back(Connection& conn,
                                                  const std::vector<std::string>& groups,
                                                  const std::vector<std::string>& heads) {
  if (groups.size() != heads.size()) {
    throw std::invalid_argument("GroupStore::held_back: one head per group");
  }
  if (groups.empty()) {
    return {};
  }
  Statement s = statement();
  select_blocked(s, groups);
  s.sql(" UNION SELECT message_group FROM " + table_ + " WHERE");
  s.ids_in("event_id", heads, 0, heads.size());
  // Only grouped rows: an id of an ungrouped row would bring back a NULL key.
  s.sql(" AND attempts > 1 AND message_group IS NOT NULL");
  return texts(s, conn);
}

int SqlGroupStore::repartition(Connection& conn, const std::string& group) {
  const std::int64_t partition = message_group_partition(group);
  Statement s = statement();
  s.sql("UPDATE " + table_ + " SET partition_no = ")
      .param(partition)
      .sql(" WHERE message_group = ")
      .param(group)
      .sql(" AND partition_no <> ")
      .param(partition)
      // In range only: a number outside 0 … 63 counts as none, and only the partition's holder
      // numbers those (assign_partitions, fenced).
      .sql(" AND partition_no >= 0 AND partition_no < " + std::to_string(kMessageGroupPartitions) +
           " AND " + pending_statuses());
  return static_cast<int>(s.execute(conn));
}

namespace {

int partition_of_partition_lease(const LeaseToken& lease) {
  const auto partition = partition_of_lease(lease.name);
  if (!partition) {
    throw std::invalid_argument("group claim: lease '" + lease.name + "' is not a partition's");
  }
  return *partition;
}

}  // namespace

void SqlGroupStore::fenced_by(Statement& s, const std::vector<LeaseToken>& partition_leases,
                              bool share_lock) const {
  s.sql(" AND " + dialect_.group_pending_filter() + " AND (");
  for (std::size_t i = 0; i < partition_leases.size(); ++i) {
    s.sql(i == 0 ? "(partition_no = " : " OR (partition_no = ")
        .param(std::int64_t{partition_of_partition_lease(partition_leases[i])})
        .sql(" AND ");
    append_fence_condition(s, dialect_, lease_table_, partition_leases[i], share_lock);
    s.sql(")");
  }
  s.sql(")");
}

std::vector<OutboxEvent> SqlGroupStore::claim(Connection& conn,
                                              const std::vector<LeaseToken>& partition_leases,
                                              const std::vector<std::string>& event_ids) {
  if (event_ids.empty() || partition_leases.empty()) {
    return {};
  }
  // A read, not an UPDATE: the partition's lease is what holds a grouped row (no other node
  // reads its partition while it is live), so a lock would only be written to be cleared by the
  // DONE mark (a row write per event: docs/performance.md, "Grouped rows held by the lease").
  Statement s = statement();
  s.sql("SELECT " + columns_ + " FROM " + table_ + " WHERE");
  s.ids_in("event_id", event_ids, 0, event_ids.size());
  fenced_by(s, partition_leases, false);  // a read: no lock on the lease rows
  auto rows = internal::events_from_rows(s.query(conn));
  // In the order asked for: group by group, each in insert order.
  std::unordered_map<std::string_view, std::size_t> place;
  for (std::size_t i = 0; i < event_ids.size(); ++i) {
    place.emplace(event_ids[i], i);
  }
  std::sort(rows.begin(), rows.end(), [&](const OutboxEvent& a, const OutboxEvent& b) {
    return place[a.event_id] < place[b.event_id];
  });
  return rows;
}

bool SqlGroupStore::hold(Connection& conn, std::string_view event_id,
                         const LeaseToken& partition_lease, std::string_view owner, Timestamp now) {
  Statement s = statement();
  s.sql("UPDATE " + table_ + " SET locked_by = ")
      .param(std::string(owner))
      .sql(", locked_at = ")
      .now(now)
      .sql(" WHERE event_id = ")
      .param(std::string(event_id));
  fenced_by(s, {partition_lease}, true);
  return s.execute(conn) == 1;
}

bool SqlGroupStore::block(Connection& conn, std::string_view event_id,
                          std::string_view message_group, std::string_view error, Timestamp now,
                          std::string_view owner) {
  const std::string truncated = truncate_error(error);
  const std::string group(message_group);
  return in_transaction(conn, [&] {
    Statement s = statement();
    s.sql("UPDATE " + table_ + " SET status = " + status_sql(EventStatus::Retry) +
          ", attempts = attempts + 1, last_error = ")
        .param(truncated)
        .sql(", available_at = ")
        .now(now)
        .sql(", locked_by = NULL, locked_at = NULL WHERE event_id = ")
        .param(std::string(event_id))
        .sql(" AND " + pending_statuses())
        .owned_by(owner);
    if (s.execute(conn) != 1) {
      return false;
    }
    unblock(conn, group);
    Statement insert = statement();
    insert
        .sql("INSERT INTO " + block_table_ +
             " (message_group, event_id, partition_no, blocked_at, attempts, last_error) "
             "SELECT message_group, event_id, partition_no, ")
        .now(now)
        .sql(", attempts, last_error FROM " + table_ + " WHERE event_id = ")
        .param(std::string(event_id));
    insert.execute(conn);
    return true;
  });
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
  Statement s = statement();
  s.sql("UPDATE " + table_ + " SET status = " + status_sql(EventStatus::Dead) + ", last_error = ")
      .param(error)
      .sql(", done_at = ")
      .now(now)
      .sql(", locked_by = NULL, locked_at = NULL WHERE " + dialect_.group_pending_filter());
  of_group(s, message_group);
  if (after) {
    s.sql(" AND " + dialect_.group_order_column() + " > ").param(*after);
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
  Statement s = statement();
  s.sql("SELECT event_id, event_type, attempts, last_error, " + dialect_.micros("created_at") +
        ", partition_no FROM " + table_ + " WHERE " + dialect_.group_pending_filter());
  of_group(s, group);
  s.sql(" ORDER BY " + dialect_.group_order_column() + " LIMIT 1");
  const auto head = s.query(conn);
  if (head.empty()) {
    return std::nullopt;
  }
  GroupInfo info;
  info.message_group = group;
  info.head_event_id = head[0].get_text(0);
  info.head_event_type = head[0].get_text(1);
  info.attempts = static_cast<int>(head[0].get_int(2));
  info.last_error = head[0].get_optional_text(3);
  info.head_created_at = from_micros(head[0].get_int(4));
  if (auto p = head[0].get_optional_int(5)) {
    info.partition = static_cast<int>(*p);
  }
  Statement count = statement();
  count.sql("SELECT COUNT(*) FROM " + table_ + " WHERE " + dialect_.group_pending_filter());
  of_group(count, group);
  info.pending = count.query(conn)[0].get_int(0);
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

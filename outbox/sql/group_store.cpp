#include "outbox/sql/group_store.hpp"

#include <algorithm>
#include <bit>
#include <map>
#include <set>
#include <stdexcept>
#include <unordered_map>
#include <utility>

#include "outbox/envelope.hpp"
#include "outbox/internal/event_row.hpp"
#include "outbox/internal/in_transaction.hpp"
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

using internal::in_transaction;

std::string group_block_table_name(const std::string& table) {
  return derived_name(table, "_group_block");
}

std::string group_partition_out_of_range() {
  return "(partition_no < 0 OR partition_no >= " + std::to_string(kMessageGroupPartitions) + ")";
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
  // A row without a partition number, or with one outside 0 … 63: a writer outside this library
  // left it to the partition's holder to number. (And, where the column keeps one, a number that
  // is not a whole number: Dialect::fractional_partition.)
  unnumbered_ = "partition_no IS NULL OR " + group_partition_out_of_range();
  if (const auto fractional = dialect_.fractional_partition(); !fractional.empty()) {
    unnumbered_ += " OR " + fractional;
  }
  for (int p = 0; p < kMessageGroupPartitions; ++p) {
    std::string in;
    for (int q = 0; q < kMessageGroupPartitions; ++q) {
      if (q != p) {
        in += (in.empty() ? "" : ", ") + std::to_string(q);
      }
    }
    other_partitions_.push_back("partition_no IN (" + in + ")");
  }
}

std::vector<std::string> SqlGroupStore::unnumbered_ranges() const {
  // Disjoint, so that a count over them counts a row once: a fraction only in range (-0.5 is
  // below it), tested on each row the index of fractions gives (`+`: with the range as an index
  // range, SQLite read every partition's rows for it).
  std::vector<std::string> ranges = {"partition_no IS NULL", group_partition_out_of_range()};
  if (const auto fractional = dialect_.fractional_partition(); !fractional.empty()) {
    ranges.push_back(fractional + " AND +partition_no >= 0 AND +partition_no < " +
                     std::to_string(kMessageGroupPartitions));
  }
  return ranges;
}

void SqlGroupStore::unassigned_arms(Statement& s, const std::string& columns,
                                    const std::vector<std::string>* groups, std::size_t from,
                                    std::size_t n, const std::string* after) const {
  // An arm per range (unnumbered_ranges), each read through an index: with the ranges OR-ed,
  // SQLite read the whole table every cycle.
  const auto ranges = unnumbered_ranges();
  for (std::size_t i = 0; i < ranges.size(); ++i) {
    s.sql(std::string(i == 0 ? "" : " UNION ALL ") + "SELECT " + columns + " FROM " + table_ +
          " WHERE " + dialect_.group_pending_filter() + " AND " + ranges[i]);
    if (groups != nullptr) {
      s.sql(" AND");
      s.ids_in("message_group", *groups, from, n);
    }
    if (after != nullptr) {
      s.sql(" AND message_group > ").param(*after);
    }
  }
}

void SqlGroupStore::select_unassigned(Statement& s, const std::vector<std::string>* groups,
                                      std::size_t from, std::size_t n,
                                      const std::string* after) const {
  s.sql("SELECT DISTINCT message_group FROM (");
  unassigned_arms(s, "message_group", groups, from, n, after);
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
  // The groups of partitions held here, and then their rows without a number, by id: read
  // through the question's arms (each an index range on every engine), numbered by id. One UPDATE
  // per group with the ranges OR-ed read every pending grouped row for each group on SQLite
  // without statistics and on MariaDB (17 ms a group at 100,000 rows: 500 groups a cycle held
  // SQLite's write lock for 9 s, delivered next to nothing and left the application's own
  // INSERTs waiting up to 30 s).
  std::vector<std::string> groups;
  for (const auto& row : found) {
    const std::string group = row.get_text(0);
    if (lease_of.contains(message_group_partition(group))) {
      groups.push_back(group);  // otherwise its partition's holder numbers it
    }
  }
  if (groups.empty()) {
    return 0;
  }
  std::map<int, std::vector<std::string>> ids_of;  // by partition
  std::map<int, std::set<std::string>> groups_of;
  {
    Statement rows = statement();
    unassigned_arms(rows, "event_id, message_group", &groups, 0, groups.size());
    for (const auto& row : rows.query(conn)) {
      std::string group = row.get_text(1);
      const int partition = message_group_partition(group);
      ids_of[partition].push_back(row.get_text(0));
      groups_of[partition].insert(std::move(group));
    }
  }
  // Fenced: a claim in the partition reads its runs, then asks which groups still have rows
  // without a number; a row numbered in between by anyone else would be overtaken. A group's rows
  // numbered in two statements (or its row written after the read, numbered next cycle) are
  // numbered in part meanwhile: that question keeps the claims behind such a group waiting.
  constexpr std::size_t kIdsPerUpdate = 512;
  int assigned = 0;
  for (const auto& [partition, ids] : ids_of) {
    const std::vector<std::string> keys(groups_of[partition].begin(), groups_of[partition].end());
    for (std::size_t from = 0; from < ids.size(); from += kIdsPerUpdate) {
      Statement s = statement();
      s.sql("UPDATE " + table_ + " SET partition_no = ")
          .param(std::int64_t{partition})
          .sql(" WHERE " + dialect_.group_pending_filter() + " AND (" + unnumbered_ + ") AND");
      s.ids_in("event_id", ids, from, std::min(kIdsPerUpdate, ids.size() - from));
      s.sql(" AND");
      s.ids_in("message_group", keys, 0, keys.size());
      append_fence(s, dialect_, lease_table_, *lease_of.at(partition));
      assigned += static_cast<int>(s.execute(conn));
    }
  }
  return assigned;
}

std::vector<std::string> SqlGroupStore::unassigned(Connection& conn,
                                                   const std::vector<std::string>& groups) {
  std::vector<std::string> out;
  // In chunks: each group is a parameter in each arm (SQLite allows 32766).
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
      // In range only: a number outside 0 … 63 counts as none, and only the partition's holder
      // numbers those (assign_partitions, fenced).
      .sql(" AND " + other_partitions_[static_cast<std::size_t>(partition)] + " AND " +
           pending_statuses());
  if (const auto fractional = dialect_.fractional_partition(); !fractional.empty()) {
    s.sql(" AND NOT (" + fractional + ")");
  }
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
  // Padded to a power of two by repeating the last lease (an OR of the same arm twice is the
  // same condition): the text then depends on a few counts of partitions, not on each.
  std::vector<LeaseToken> fences = partition_leases;
  const LeaseToken last = fences.back();  // not empty: returned above
  fences.resize(std::bit_ceil(fences.size()), last);
  fenced_by(s, fences, false);  // a read: no lock on the lease rows
  auto rows = internal::events_from_rows(s.query(conn));
  // In the order asked for: group by group, each in insert order. Each row's place looked up
  // once (looked up in the comparison, the hashing was a sixth of the claim's time).
  std::unordered_map<std::string_view, std::size_t> place;
  place.reserve(event_ids.size());
  for (std::size_t i = 0; i < event_ids.size(); ++i) {
    place.emplace(event_ids[i], i);
  }
  std::vector<std::pair<std::size_t, std::size_t>> order;  // (place asked, row)
  order.reserve(rows.size());
  for (std::size_t r = 0; r < rows.size(); ++r) {
    const auto it = place.find(rows[r].event_id);
    order.emplace_back(it == place.end() ? event_ids.size() : it->second, r);
  }
  std::sort(order.begin(), order.end());
  std::vector<OutboxEvent> out;
  out.reserve(rows.size());
  for (const auto& [asked, r] : order) {
    out.push_back(std::move(rows[r]));
  }
  return out;
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

}  // namespace outbox::sql

#pragma once
// Message groups: events of one key delivered one at a time in write order, many keys in parallel,
// partitions of keys leased to the nodes that deliver them (see docs/groups.md).

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "outbox/clock.hpp"
#include "outbox/store.hpp"

namespace outbox {

struct LeaseToken;

/// What happens to a group whose head event failed for good (attempts exhausted or a permanent
/// failure). Until then a failing head is retried with backoff and the group waits behind it.
enum class GroupFailurePolicy {
  Block,            ///< the head stays pending and the group is blocked until an operator acts
  Skip,             ///< the head goes DEAD and the next event of the group proceeds
  DeadLetterGroup,  ///< the head and every pending event of the group go DEAD together
};
/// "block", "skip", "dead_letter_group".
std::string_view to_string(GroupFailurePolicy policy);
/// Throws std::invalid_argument for another spelling.
GroupFailurePolicy parse_group_failure_policy(std::string_view text);

/// The lease a node holds to deliver partition `n`: "part:<n>".
std::string partition_lease_name(int partition);
/// The partition of a lease named "part:<n>"; nullopt for another name.
std::optional<int> partition_of_lease(std::string_view name);

/// Where a scan reads one partition: from the first group after `after_group` (empty: from the
/// start), at most `limit` rows.
struct GroupScanRange {
  int partition = 0;
  std::string after_group;
  int limit = 0;
};

/// A row seen by a scan: enough to pick due group heads.
struct GroupScanRow {
  std::string event_id;
  std::string message_group;
  int partition = 0;
  bool due = false;         ///< available_at has passed
  std::int64_t seq = 0;     ///< the row's place in write order (stream_seq; stream_id on MariaDB)
  std::int64_t due_at = 0;  ///< available_at, µs since the epoch (on the store's clock)
};

/// A group an operator may have to act on: blocked, or with a head that failed at least once.
struct GroupInfo {
  std::string message_group;
  std::optional<int> partition;
  std::string head_event_id;
  std::string head_event_type;
  int attempts = 0;
  std::optional<std::string> last_error;
  bool blocked = false;
  std::optional<Timestamp> blocked_at;
  Timestamp head_created_at;
  std::int64_t pending = 0;  ///< pending events of the group, head included
};

/// Blocked groups at a glance (for metrics).
struct GroupStats {
  std::int64_t blocked = 0;
  std::optional<Timestamp> oldest_blocked_at;
};

/// The storage of message groups. Implementations are thread-safe; database failures throw
/// outbox::StoreError. Failures written for a holder are conditioned on locked_by = owner (see
/// hold()).
class GroupStore {
 public:
  virtual ~GroupStore() = default;

  /// Sets partition_no on grouped pending rows written without one, or with one outside 0 … 63 (a
  /// writer outside this library), a whole group per statement, for the groups (among the next
  /// `limit` in key order, after where the last call stopped) whose partition's lease is among
  /// `partition_leases` and live in the database: only a partition's holder numbers its rows.
  /// Returns rows assigned. Throws std::invalid_argument for a lease that is not a partition's.
  virtual int assign_partitions(sql::Connection& conn,
                                const std::vector<LeaseToken>& partition_leases, int limit) = 0;
  /// Pending rows of each range's partition in (group, insert order) order, range after range,
  /// in one statement.
  virtual std::vector<GroupScanRow> scan(sql::Connection& conn,
                                         const std::vector<GroupScanRange>& ranges,
                                         Timestamp now) = 0;
  /// True when front() reads an index of its own (schema version 9, SQLite): claims then read
  /// each partition's front; elsewhere front() works but reads through settled rows.
  virtual bool has_fronts() const = 0;
  /// The first `rows_each` pending rows of each partition in `partitions`, in insert order,
  /// partition after partition, in one statement: a group's rows among them are its oldest, head
  /// first.
  virtual std::vector<GroupScanRow> front(sql::Connection& conn, const std::vector<int>& partitions,
                                          int rows_each, Timestamp now) = 0;
  /// The first `per_group` pending rows of each (partition, group) in `groups`, in insert order,
  /// group after group in the order first asked for (a group asked twice comes back once).
  virtual std::vector<GroupScanRow> runs(sql::Connection& conn,
                                         const std::vector<std::pair<int, std::string>>& groups,
                                         int per_group, Timestamp now) = 0;
  /// Those of `groups` that have a pending row without a partition yet.
  virtual std::vector<std::string> unassigned(sql::Connection& conn,
                                              const std::vector<std::string>& groups) = 0;
  /// Those of `groups` that are blocked.
  virtual std::vector<std::string> blocked(sql::Connection& conn,
                                           const std::vector<std::string>& groups) = 0;
  /// Those of `groups` that are blocked or whose head (`heads[i]`, the id of groups[i]'s first
  /// pending row) keeps failing (failed at least twice), in one statement. Throws
  /// std::invalid_argument when the two differ in size.
  virtual std::vector<std::string> held_back(sql::Connection& conn,
                                             const std::vector<std::string>& groups,
                                             const std::vector<std::string>& heads) = 0;
  /// Sets partition_no to the key's partition on the pending rows of `group` that have another
  /// one (a writer that computed it wrongly). Returns rows changed.
  virtual int repartition(sql::Connection& conn, const std::string& group) = 0;
  /// Reads the pending rows among `event_ids` whose partition's lease among `partition_leases`
  /// ("part:<n>") is live in the database, in the same statement; returns them in the order of
  /// `event_ids`. Writes nothing: a grouped row is held by its partition's lease, not locked
  /// (its DONE mark needs no lock; a failure is written after hold()). Throws
  /// std::invalid_argument for a lease that is not a partition's.
  virtual std::vector<OutboxEvent> claim(sql::Connection& conn,
                                         const std::vector<LeaseToken>& partition_leases,
                                         const std::vector<std::string>& event_ids) = 0;
  /// Locks the pending row `event_id` for `owner` (locked_by, locked_at = now) if its partition's
  /// lease `partition_lease` is live in the database, in the same statement: before a failure is
  /// written for it (those writes are conditioned on locked_by = owner). The lease row stays
  /// share-locked until the caller's transaction ends: a failure written in the same one cannot
  /// land after a takeover. False when the lease or the row is no longer there. Throws
  /// std::invalid_argument for a lease that is not a partition's.
  virtual bool hold(sql::Connection& conn, std::string_view event_id,
                    const LeaseToken& partition_lease, std::string_view owner, Timestamp now) = 0;
  /// The head `event_id` failed for good under Block: it stays pending (attempts + 1, the error
  /// kept) and its group is recorded as blocked. False when `owner` no longer holds its claim.
  virtual bool block(sql::Connection& conn, std::string_view event_id,
                     std::string_view message_group, std::string_view error, Timestamp now,
                     std::string_view owner) = 0;
  /// The head `event_id` failed for good under DeadLetterGroup: it and every pending row of its
  /// group after it go DEAD in one transaction (rows before it were delivered; their DONE marks
  /// may still be on their way). Returns rows changed (0 when `owner` no longer holds the
  /// head's claim).
  virtual int dead_letter(sql::Connection& conn, std::string_view event_id,
                          std::string_view message_group, std::string_view error, Timestamp now,
                          std::string_view owner) = 0;

  /// Blocked groups, then groups whose head has failed, oldest head first; at most `limit`.
  virtual std::vector<GroupInfo> list(sql::Connection& conn, int limit) = 0;
  /// One group's state (nullopt when it has no pending event).
  virtual std::optional<GroupInfo> find(sql::Connection& conn, std::string_view message_group) = 0;
  /// Operator: unblocks the group and makes its head due now with its attempts reset. False when
  /// the group has no pending event.
  virtual bool retry(sql::Connection& conn, std::string_view message_group, Timestamp now) = 0;
  /// Operator: the group's head goes DEAD and the group is unblocked. Returns the head's id, or
  /// nullopt when the group has no pending event.
  virtual std::optional<std::string> skip_head(sql::Connection& conn,
                                               std::string_view message_group, Timestamp now) = 0;
  /// Operator: every pending event of the group goes DEAD and the group is unblocked. Returns rows
  /// changed.
  virtual int dead_letter_group(sql::Connection& conn, std::string_view message_group,
                                Timestamp now) = 0;
  /// Blocked groups and the oldest block.
  virtual GroupStats stats(sql::Connection& conn) = 0;
};

}  // namespace outbox

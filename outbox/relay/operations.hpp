#pragma once
// Operator views shared by the `outbox` command and the admin API (their actions on DEAD events
// are DeadEventManager's).

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "outbox/clock.hpp"
#include "outbox/groups.hpp"
#include "outbox/lease.hpp"
#include "outbox/relay/subscription_ops.hpp"
#include "outbox/store.hpp"

namespace outbox::relay {

/// Counts by status, age of the oldest pending event, DEAD rows per type, the leases (who leads),
/// and, from a running relay, that relay's own view.
struct TableStatus;

struct StatusReport {
  std::int64_t new_count = 0, done = 0, retry = 0, dead = 0;
  std::optional<std::chrono::milliseconds> oldest_pending_age;  ///< nullopt: nothing pending
  std::vector<std::pair<std::string, std::int64_t>> dead_by_type;
  /// The lease table's rows; nullopt when it could not be read (a schema older than version 3).
  std::optional<std::vector<LeaseInfo>> leases;
  struct RelayView {
    std::string mode;     ///< "active" or "standby"
    std::string owner;    ///< this relay's claim and lease owner
    bool leader = false;  ///< standby mode: this relay holds the lease "leader" now
    /// admin.alert_oldest_pending: the age from which the dashboard shows the oldest in red.
    std::chrono::seconds alert_oldest_pending{300};
    struct Route {
      std::string table, event_type, aggregate_type, publisher, target;
    };
    std::vector<Route> routes;
    struct Publisher {
      std::string name, type;
      bool healthy = true;
    };
    std::vector<Publisher> publishers;
  };
  std::optional<RelayView> relay;
  /// The stream (head, what holds it back) and every subscription; nullopt when not read.
  std::optional<StreamReport> stream;
  /// Blocked message groups; nullopt when not read (a schema older than version 5).
  std::optional<GroupStats> groups;
  /// A relay draining several tables: each table's own report (leases not read), by name.
  std::vector<TableStatus> tables;
  /// Set instead of the counts when the table could not be read (one of `tables`).
  std::string error;
};

/// One table's report in StatusReport::tables.
struct TableStatus {
  std::string table;
  StatusReport report;
};

/// Reads the report (the leases through `leases`, blocked groups through `groups`, when given).
/// Throws outbox::StoreError.
StatusReport read_status(sql::Connection& conn, OutboxStore& store, Timestamp now,
                         LeaseStore* leases = nullptr, GroupStore* groups = nullptr);
/// {"new":…,"done":…,"retry":…,"dead":…,"oldest_pending_age_seconds":…|null,"dead_by_type":{…},
/// "leases":[{"name","owner","epoch","live","acquired_at","renewed_at","expires_at"}]|null,
/// "relay":{"mode","owner","leader"} (from a running relay), "stream":{…} (as
/// subscription_ops' to_json, when read), "groups":{"blocked","oldest_blocked_at"} (when read),
/// "tables":[{"table":…, the same fields, or "error"}] (a relay draining several tables)}
std::string to_json(const StatusReport& report);
/// Aligned lines for a terminal; the leases of message-group partitions summed up per owner.
std::string to_text(const StatusReport& report);

/// DEAD rows as a JSON array of {event_id, event_type, aggregate_type, aggregate_id, tenant_id,
/// attempts, created_at, last_error}.
std::string dead_to_json(const std::vector<OutboxEvent>& rows);
/// One line per DEAD row for a terminal.
std::string dead_to_text(const std::vector<OutboxEvent>& rows);

}  // namespace outbox::relay

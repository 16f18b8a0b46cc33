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
#include "outbox/store.hpp"

namespace outbox::relay {

/// Counts by status, age of the oldest pending event, DEAD rows per type.
struct StatusReport {
  std::int64_t new_count = 0, done = 0, retry = 0, dead = 0;
  std::optional<std::chrono::milliseconds> oldest_pending_age;  ///< nullopt: nothing pending
  std::vector<std::pair<std::string, std::int64_t>> dead_by_type;
};

/// Reads the report. Throws outbox::StoreError.
StatusReport read_status(sql::Connection& conn, OutboxStore& store, Timestamp now);
/// {"new":…,"done":…,"retry":…,"dead":…,"oldest_pending_age_seconds":…|null,"dead_by_type":{…}}
std::string to_json(const StatusReport& report);
/// Aligned lines for a terminal.
std::string to_text(const StatusReport& report);

/// DEAD rows as a JSON array of {event_id, event_type, aggregate_type, aggregate_id, tenant_id,
/// attempts, created_at, last_error}.
std::string dead_to_json(const std::vector<OutboxEvent>& rows);
/// One line per DEAD row for a terminal.
std::string dead_to_text(const std::vector<OutboxEvent>& rows);

}  // namespace outbox::relay

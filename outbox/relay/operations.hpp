#pragma once
// Operator views and actions shared by the `outbox` command and the admin API.

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
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

/// What replay_all_dead did.
struct ReplayAllResult {
  int replayed = 0;   ///< DEAD → NEW
  int skipped = 0;    ///< in the list but no longer DEAD when their turn came
  bool more = false;  ///< the list was capped at kReplayAllLimit: run again for the rest
};

/// The most DEAD rows one replay-all run takes.
inline constexpr int kReplayAllLimit = 100000;

/// Takes the ids of the DEAD rows matching the filters once, then replays each at most once (NEW,
/// attempts 0): events a running relay sends DEAD again are not replayed again by this run.
/// Throws outbox::StoreError (rows replayed before the failure stay replayed).
ReplayAllResult replay_all_dead(sql::Connection& conn, OutboxStore& store,
                                std::optional<std::string_view> event_type,
                                std::optional<std::string_view> aggregate_type, Timestamp now);

}  // namespace outbox::relay

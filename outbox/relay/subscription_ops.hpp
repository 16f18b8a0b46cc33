#pragma once
// Operator views of subscriptions and their actions, shared by the admin API and the `outbox`
// command.

#include <optional>
#include <string>
#include <vector>

#include "outbox/lease.hpp"
#include "outbox/stream.hpp"

namespace outbox::relay {

/// One subscription as an operator sees it.
struct SubscriptionReport {
  SubscriptionState state;
  StreamLag lag;                   ///< behind the readable end of the stream
  std::optional<LeaseInfo> lease;  ///< "sub:<name>": which relay runs it
  std::string waiting;             ///< from the relay that runs it: why it does not deliver now
  bool lagging = false;  ///< its first unread event is older than the relay's max_lag_retention
};

/// The stream as a whole.
struct StreamReport {
  StreamPosition head;
  std::optional<StreamHoldback> holdback;  ///< PostgreSQL: the oldest open transaction
  std::vector<SubscriptionReport> subscriptions;
};

/// Reads every subscription (or only `name`), its lag and its lease. Throws StoreError.
StreamReport read_stream(sql::Connection& conn, StreamStore& stream, LeaseStore* leases,
                         std::optional<std::string_view> name = std::nullopt);

/// {"head", "holdback":{"pid","age_seconds","state"}|null, "subscriptions":[…]}, each
/// {"name","status","cursor","publisher","target","filter":{…},"error_count","last_error",
///  "delivered","last_delivered_at","lag_events","lag_seconds","holder","waiting","lagging"}.
std::string to_json(const StreamReport& report);
/// One subscription's object as in to_json.
std::string to_json(const SubscriptionReport& report, Timestamp now);
/// Aligned lines for a terminal.
std::string to_text(const StreamReport& report);

/// Where a rewind goes: "start" (before the first event), "end" (after the last readable one),
/// an RFC 3339 time (before the first event created at or after it) or a position ("seq" or
/// "xid:seq"). Throws std::invalid_argument naming the accepted forms.
StreamPosition rewind_target(sql::Connection& conn, StreamStore& stream, std::string_view to);

/// Applies "pause" (from ACTIVE or FAILED), "resume" (from PAUSED), "reset" (FAILED → ACTIVE,
/// errors cleared) or "rewind" (to `to`, default "start"). Returns the subscription after it;
/// nullopt when there is none of that name. Throws std::invalid_argument for an unknown action or
/// target, std::logic_error when its status does not allow the action, StoreError.
std::optional<SubscriptionState> apply_subscription_action(sql::Connection& conn,
                                                           StreamStore& stream,
                                                           std::string_view name,
                                                           std::string_view action,
                                                           std::optional<std::string_view> to);

/// "2026-11-24T08:00:00Z", with optional fraction and a Z or ±HH:MM offset. Throws
/// std::invalid_argument.
Timestamp parse_rfc3339(std::string_view text);

}  // namespace outbox::relay

#pragma once
// Dead-letter triage as the admin API and the CLI show it: DEAD events grouped by failure
// fingerprint, and what a group action did.

#include <optional>
#include <string>
#include <vector>

#include "outbox/dead_event_manager.hpp"
#include "outbox/sql/connection.hpp"

namespace outbox::relay {

/// One group with its sample event's payload (nullopt: binary, or the row is gone).
struct DeadGroupView {
  DeadEventManager::Group group;
  std::optional<std::string> sample_payload;
};

/// The groups of `store`'s table (of its first `limit` DEAD rows), the `top` largest, with a
/// sample each: its error and payload at most 1,000 bytes (cut on a character boundary).
struct DeadGroupsView {
  std::vector<DeadGroupView> groups;
  std::size_t total = 0;  ///< groups found, `top` or not
  bool more = false;      ///< there were more DEAD rows than `limit`
};
/// Reads them. Throws StoreError.
DeadGroupsView read_dead_groups(DeadEventManager& manager, OutboxStore& store,
                                sql::ConnectionProvider& provider, int limit, std::size_t top);

/// {"more":…,"total_groups":…,"groups":[{"fingerprint","event_type","pattern","count",
/// "first_seen","last_seen","sample_event_id","sample_error","sample_payload"}]}.
std::string dead_groups_to_json(const DeadGroupsView& view);
/// One line per group for a terminal (count, fingerprint, type, first/last seen, pattern).
std::string dead_groups_to_text(const DeadGroupsView& view);
/// {"fingerprint","action","changed","skipped","more"}.
std::string group_action_to_json(const std::string& fingerprint, const std::string& action,
                                 const DeadEventManager::GroupActionResult& result);

}  // namespace outbox::relay

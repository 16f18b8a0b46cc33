#pragma once
// What the admin API and the `outbox groups` command share: message groups as JSON and the
// operators' actions on a group.

#include <optional>
#include <string>
#include <vector>

#include "outbox/groups.hpp"

namespace outbox::relay {

/// {"groups":[…], "blocked": n, "oldest_blocked_at": …}; ages counted to `now`.
std::string groups_to_json(const std::vector<GroupInfo>& groups, const GroupStats& stats,
                           Timestamp now);
/// One group as a JSON object.
std::string group_to_json(const GroupInfo& group, Timestamp now);

/// The actions an operator may take on a group.
enum class GroupAction { Retry, SkipHead, DeadLetter };
/// "retry", "skip-head", "dead-letter". Throws std::invalid_argument for another spelling.
GroupAction parse_group_action(std::string_view text);

/// What an action did, in one line for people ("retried", "skipped head e-1 (now DEAD)", …);
/// nullopt when the group has no pending event.
std::optional<std::string> apply_group_action(GroupStore& store, sql::Connection& conn,
                                              const std::string& group, GroupAction action);

}  // namespace outbox::relay

#include "outbox/relay/group_ops.hpp"

#include <stdexcept>

#include "outbox/relay/internal/json_text.hpp"

namespace outbox::relay {
namespace {

using internal::append_text;

void append_instant(std::string& out, const std::optional<Timestamp>& t) {
  internal::append_optional(out, t ? std::optional<std::string>(format_rfc3339(*t)) : std::nullopt);
}

std::string seconds_since(Timestamp t, Timestamp now) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now - t).count();
  return std::to_string(std::max<std::int64_t>(0, ms) / 1000.0);
}

}  // namespace

std::string group_to_json(const GroupInfo& g, Timestamp now) {
  std::string out = "{\"group\":";
  append_text(out, g.message_group);
  out += ",\"partition\":" + (g.partition ? std::to_string(*g.partition) : std::string("null"));
  out += ",\"blocked\":" + std::string(g.blocked ? "true" : "false") + ",\"blocked_at\":";
  append_instant(out, g.blocked_at);
  out += ",\"blocked_seconds\":" + (g.blocked_at ? seconds_since(*g.blocked_at, now) : "null");
  out += ",\"head\":{\"event_id\":";
  append_text(out, g.head_event_id);
  out += ",\"event_type\":";
  append_text(out, g.head_event_type);
  out += ",\"attempts\":" + std::to_string(g.attempts) + ",\"last_error\":";
  internal::append_optional(out, g.last_error);
  out += ",\"created_at\":";
  append_instant(out, g.head_created_at);
  out += "},\"pending\":" + std::to_string(g.pending) + "}";
  return out;
}

std::string groups_to_json(const std::vector<GroupInfo>& groups, const GroupStats& stats,
                           Timestamp now) {
  std::string out = "{\"blocked\":" + std::to_string(stats.blocked) + ",\"oldest_blocked_at\":";
  append_instant(out, stats.oldest_blocked_at);
  out += ",\"groups\":[";
  for (std::size_t i = 0; i < groups.size(); ++i) {
    out += (i ? "," : "") + group_to_json(groups[i], now);
  }
  return out + "]}";
}

GroupAction parse_group_action(std::string_view text) {
  if (text == "retry") {
    return GroupAction::Retry;
  }
  if (text == "skip-head") {
    return GroupAction::SkipHead;
  }
  if (text == "dead-letter") {
    return GroupAction::DeadLetter;
  }
  throw std::invalid_argument("unknown group action '" + std::string(text) +
                              "' (retry, skip-head or dead-letter)");
}

std::optional<std::string> apply_group_action(GroupStore& store, sql::Connection& conn,
                                              const std::string& group, GroupAction action) {
  const auto now = Clock::system()->now();
  switch (action) {
    case GroupAction::Retry:
      if (!store.retry(conn, group, now)) {
        return std::nullopt;
      }
      return "retried: the head is due now with its attempts reset";
    case GroupAction::SkipHead:
      if (auto head = store.skip_head(conn, group, now)) {
        return "skipped head " + *head + " (now DEAD; replay it with `outbox dead replay`)";
      }
      return std::nullopt;
    case GroupAction::DeadLetter: {
      const int dead = store.dead_letter_group(conn, group, now);
      if (dead == 0) {
        return std::nullopt;
      }
      return "dead-lettered " + std::to_string(dead) +
             " pending events (replayed, a group is delivered in its write order again)";
    }
  }
  return std::nullopt;
}

}  // namespace outbox::relay

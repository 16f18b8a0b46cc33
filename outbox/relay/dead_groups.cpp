#include "outbox/relay/dead_groups.hpp"

#include "outbox/json_codec.hpp"
#include "outbox/relay/internal/json_text.hpp"
#include "outbox/sql/connection.hpp"

namespace outbox::relay {
namespace {

using internal::append_optional;
using internal::append_text;

// Enough of a payload to recognise the events; the rest is a click away in the database.
constexpr std::size_t kSampleBytes = 1000;

}  // namespace

DeadGroupsView read_dead_groups(DeadEventManager& manager, OutboxStore& store,
                                sql::ConnectionProvider& provider, int limit, std::size_t top) {
  DeadGroupsView out;
  auto groups = manager.groups(limit, &out.more);
  out.total = groups.size();
  if (groups.size() > top) {
    groups.resize(top);  // the largest first
  }
  auto conn = provider.acquire();
  for (auto& g : groups) {
    if (g.sample_error.size() > kSampleBytes) {
      g.sample_error = sanitize_utf8(std::string_view(g.sample_error).substr(0, kSampleBytes));
    }
    DeadGroupView view{std::move(g), std::nullopt};
    if (const auto row = store.find(*conn, view.group.sample_event_id);
        row && row->payload_is_json) {
      view.sample_payload = sanitize_utf8(
          std::string_view(row->payload).substr(0, std::min(row->payload.size(), kSampleBytes)));
    }
    out.groups.push_back(std::move(view));
  }
  return out;
}

std::string dead_groups_to_json(const DeadGroupsView& view) {
  const auto& groups = view.groups;
  std::string out = std::string("{\"more\":") + (view.more ? "true" : "false") +
                    ",\"total_groups\":" + std::to_string(view.total) + ",\"groups\":[";
  for (std::size_t i = 0; i < groups.size(); ++i) {
    const auto& g = groups[i].group;
    out += i > 0 ? ",{\"fingerprint\":" : "{\"fingerprint\":";
    append_text(out, g.fingerprint.id);
    out += ",\"event_type\":";
    append_text(out, g.fingerprint.event_type);
    out += ",\"pattern\":";
    append_text(out, g.fingerprint.pattern);
    out += ",\"count\":" + std::to_string(g.count) + ",\"first_seen\":\"" +
           format_rfc3339(g.first_seen) + "\",\"last_seen\":\"" + format_rfc3339(g.last_seen) +
           "\",\"sample_event_id\":";
    append_text(out, g.sample_event_id);
    out += ",\"sample_error\":";
    append_text(out, g.sample_error);
    out += ",\"sample_payload\":";
    append_optional(out, groups[i].sample_payload);
    out += "}";
  }
  return out + "]}";
}

std::string dead_groups_to_text(const DeadGroupsView& view) {
  std::string out;
  for (const auto& shown : view.groups) {
    const auto& g = shown.group;
    out += std::to_string(g.count) + "  " + g.fingerprint.id + "  " + g.fingerprint.event_type +
           "  " + format_rfc3339(g.first_seen) + " .. " + format_rfc3339(g.last_seen) + "  " +
           g.fingerprint.pattern + "\n";
  }
  if (view.groups.empty()) {
    out += "no DEAD events\n";
  }
  if (view.total > view.groups.size()) {
    out += "(the " + std::to_string(view.groups.size()) + " largest of " +
           std::to_string(view.total) + " groups; raise --top)\n";
  }
  if (view.more) {
    out += "(grouped the oldest DEAD events only: there are more; raise --group-limit)\n";
  }
  return out;
}

std::string group_action_to_json(const std::string& fingerprint, const std::string& action,
                                 const DeadEventManager::GroupActionResult& result) {
  std::string out = "{\"fingerprint\":";
  append_text(out, fingerprint);
  out += ",\"action\":";
  append_text(out, action);
  out += ",\"changed\":" + std::to_string(result.changed) +
         ",\"skipped\":" + std::to_string(result.skipped) +
         ",\"more\":" + (result.more ? "true" : "false") + "}";
  return out;
}

}  // namespace outbox::relay

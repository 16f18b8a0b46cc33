#include "outbox/relay/dead_groups.hpp"

#include "outbox/json_codec.hpp"
#include "outbox/relay/internal/json_text.hpp"
#include "outbox/sql/connection.hpp"

namespace outbox::relay {
namespace {

using internal::append_optional;

// Enough of a payload to recognise the events; the rest is a click away in the database.
constexpr std::size_t kSampleBytes = 1000;

}  // namespace

std::vector<DeadGroupView> read_dead_groups(DeadEventManager& manager, OutboxStore& store,
                                            sql::ConnectionProvider& provider, int limit,
                                            bool& more) {
  auto groups = manager.groups(limit, &more);
  auto conn = provider.acquire();
  std::vector<DeadGroupView> out;
  for (auto& g : groups) {
    DeadGroupView view{std::move(g), std::nullopt};
    if (const auto row = store.find(*conn, view.group.sample_event_id);
        row && row->payload_is_json) {
      view.sample_payload = sanitize_utf8(
          std::string_view(row->payload).substr(0, std::min(row->payload.size(), kSampleBytes)));
    }
    out.push_back(std::move(view));
  }
  return out;
}

std::string dead_groups_to_json(const std::vector<DeadGroupView>& groups, bool more) {
  std::string out = std::string("{\"more\":") + (more ? "true" : "false") + ",\"groups\":[";
  for (std::size_t i = 0; i < groups.size(); ++i) {
    const auto& g = groups[i].group;
    out += i > 0 ? ",{\"fingerprint\":" : "{\"fingerprint\":";
    append_json_string(out, g.fingerprint.id);
    out += ",\"event_type\":";
    append_json_string(out, sanitize_utf8(g.fingerprint.event_type));
    out += ",\"pattern\":";
    append_json_string(out, sanitize_utf8(g.fingerprint.pattern));
    out += ",\"count\":" + std::to_string(g.count) + ",\"first_seen\":\"" +
           format_rfc3339(g.first_seen) + "\",\"last_seen\":\"" + format_rfc3339(g.last_seen) +
           "\",\"sample_event_id\":";
    append_json_string(out, sanitize_utf8(g.sample_event_id));
    out += ",\"sample_error\":";
    append_json_string(out, sanitize_utf8(g.sample_error));
    out += ",\"sample_payload\":";
    append_optional(out, groups[i].sample_payload);
    out += "}";
  }
  return out + "]}";
}

std::string dead_groups_to_text(const std::vector<DeadGroupView>& groups, bool more) {
  std::string out;
  for (const auto& view : groups) {
    const auto& g = view.group;
    out += std::to_string(g.count) + "  " + g.fingerprint.id + "  " + g.fingerprint.event_type +
           "  " + format_rfc3339(g.first_seen) + " .. " + format_rfc3339(g.last_seen) + "  " +
           g.fingerprint.pattern + "\n";
  }
  if (groups.empty()) {
    out += "no DEAD events\n";
  }
  if (more) {
    out += "(grouped the oldest DEAD events only: there are more; raise --limit)\n";
  }
  return out;
}

std::string group_action_to_json(const std::string& fingerprint, const std::string& action,
                                 const DeadEventManager::GroupActionResult& result) {
  std::string out = "{\"fingerprint\":";
  append_json_string(out, sanitize_utf8(fingerprint));
  out += ",\"action\":";
  append_json_string(out, action);
  out += ",\"changed\":" + std::to_string(result.changed) +
         ",\"skipped\":" + std::to_string(result.skipped) +
         ",\"more\":" + (result.more ? "true" : "false") + "}";
  return out;
}

}  // namespace outbox::relay

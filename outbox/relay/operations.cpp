#include "outbox/relay/operations.hpp"

#include <cstdio>
#include <map>

#include "outbox/errors.hpp"
#include "outbox/json_codec.hpp"
#include "outbox/relay/internal/json_text.hpp"

namespace outbox::relay {
namespace {

using internal::append_optional;
using internal::append_text;

}  // namespace

void append_instant(std::string& out, const std::optional<Timestamp>& t) {
  if (t) {
    out += "\"" + format_rfc3339(*t) + "\"";
  } else {
    out += "null";
  }
}

StatusReport read_status(sql::Connection& conn, OutboxStore& store, Timestamp now,
                         LeaseStore* leases, GroupStore* groups) {
  StatusReport r;
  const auto counts = store.count_by_status(conn);
  r.new_count = counts[0];
  r.done = counts[1];
  r.retry = counts[2];
  r.dead = counts[3];
  if (auto oldest = store.oldest_pending(conn)) {
    r.oldest_pending_age =
        std::max(std::chrono::milliseconds(0),
                 std::chrono::duration_cast<std::chrono::milliseconds>(now - *oldest));
  }
  r.dead_by_type = store.count_dead_by_type(conn);
  if (leases != nullptr) {
    try {
      r.leases = leases->list(conn);
    } catch (const StoreError&) {
      // No lease table yet: the counts above stand; to_text says to migrate.
    }
  }
  if (groups != nullptr) {
    try {
      r.groups = groups->stats(conn);
    } catch (const StoreError&) {
      // No group table yet (before schema version 5).
    }
  }
  return r;
}

std::string to_json(const StatusReport& r) {
  std::string out = "{\"new\":" + std::to_string(r.new_count) +
                    ",\"done\":" + std::to_string(r.done) +
                    ",\"retry\":" + std::to_string(r.retry) +
                    ",\"dead\":" + std::to_string(r.dead) + ",\"oldest_pending_age_seconds\":";
  if (r.oldest_pending_age) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3f", r.oldest_pending_age->count() / 1000.0);
    out += buf;
  } else {
    out += "null";
  }
  out += ",\"dead_by_type\":{";
  for (std::size_t i = 0; i < r.dead_by_type.size(); ++i) {
    if (i > 0) {
      out.push_back(',');
    }
    append_text(out, r.dead_by_type[i].first);
    out += ":" + std::to_string(r.dead_by_type[i].second);
  }
  out += "},\"leases\":";
  if (r.leases) {
    out += "[";
    for (std::size_t i = 0; i < r.leases->size(); ++i) {
      const auto& l = (*r.leases)[i];
      out += i > 0 ? ",{\"name\":" : "{\"name\":";
      append_text(out, l.name);
      out += ",\"owner\":";
      append_optional(out, l.owner);
      out += ",\"epoch\":" + std::to_string(l.epoch) + ",\"live\":" + (l.live ? "true" : "false");
      out += ",\"acquired_at\":";
      append_instant(out, l.acquired_at);
      out += ",\"renewed_at\":";
      append_instant(out, l.renewed_at);
      out += ",\"expires_at\":";
      append_instant(out, l.expires_at);
      out += "}";
    }
    out += "]";
  } else {
    out += "null";
  }
  if (r.groups) {
    out +=
        ",\"groups\":{\"blocked\":" + std::to_string(r.groups->blocked) + ",\"oldest_blocked_at\":";
    append_instant(out, r.groups->oldest_blocked_at);
    out += "}";
  }
  if (r.relay) {
    out += ",\"relay\":{\"mode\":";
    append_text(out, r.relay->mode);
    out += ",\"owner\":";
    append_text(out, r.relay->owner);
    out += std::string(",\"leader\":") + (r.relay->leader ? "true" : "false") +
           ",\"alert_oldest_pending_seconds\":" +
           std::to_string(r.relay->alert_oldest_pending.count()) + ",\"routes\":[";
    for (std::size_t i = 0; i < r.relay->routes.size(); ++i) {
      const auto& route = r.relay->routes[i];
      out += i > 0 ? ",{\"table\":" : "{\"table\":";
      append_text(out, route.table);
      out += ",\"event_type\":";
      append_text(out, route.event_type);
      out += ",\"aggregate_type\":";
      append_text(out, route.aggregate_type);
      out += ",\"publisher\":";
      append_text(out, route.publisher);
      out += ",\"target\":";
      append_text(out, route.target);
      out += "}";
    }
    out += "],\"publishers\":[";
    for (std::size_t i = 0; i < r.relay->publishers.size(); ++i) {
      const auto& p = r.relay->publishers[i];
      out += i > 0 ? ",{\"name\":" : "{\"name\":";
      append_text(out, p.name);
      out += ",\"type\":";
      append_text(out, p.type);
      out += std::string(",\"healthy\":") + (p.healthy ? "true" : "false") + "}";
    }
    out += "]}";
  }
  if (r.stream) {
    out += ",\"stream\":" + to_json(*r.stream);
  }
  if (!r.tables.empty()) {
    out += ",\"tables\":[";
    for (std::size_t i = 0; i < r.tables.size(); ++i) {
      out += i > 0 ? ",{\"table\":" : "{\"table\":";
      append_text(out, r.tables[i].table);
      if (!r.tables[i].report.error.empty()) {
        out += ",\"error\":";
        append_text(out, r.tables[i].report.error);
        out += "}";
        continue;
      }
      out += "," + to_json(r.tables[i].report).substr(1);  // its fields after the name
    }
    out += "]";
  }
  out += "}";
  return out;
}

std::string to_text(const StatusReport& r) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "new    %lld\nretry  %lld\ndone   %lld\ndead   %lld\n",
                static_cast<long long>(r.new_count), static_cast<long long>(r.retry),
                static_cast<long long>(r.done), static_cast<long long>(r.dead));
  std::string out = buf;
  if (r.oldest_pending_age) {
    std::snprintf(buf, sizeof buf, "oldest pending: %.3f s\n",
                  r.oldest_pending_age->count() / 1000.0);
    out += buf;
  } else {
    out += "oldest pending: none\n";
  }
  if (!r.dead_by_type.empty()) {
    out += "dead by type:\n";
    for (const auto& [type, n] : r.dead_by_type) {
      out += "  " + type + "  " + std::to_string(n) + "\n";
    }
  }
  if (!r.leases) {
    out += "leases: unknown (no lease table: run `outbox migrate`)\n";
  } else if (r.leases->empty()) {
    out += "leases: none\n";
  } else {
    out += "leases:\n";
    // 64 partition leases would drown the others: one line per owner.
    std::map<std::string, int> partitions;
    for (const auto& l : *r.leases) {
      if (l.name.starts_with("part:")) {
        partitions[l.live ? l.owner.value_or("?") : std::string()] += 1;
        continue;
      }
      out += "  " + l.name + "  " +
             (l.live ? "held by " + l.owner.value_or("?") : std::string("free")) + "  epoch " +
             std::to_string(l.epoch);
      if (l.live && l.acquired_at) {
        out += "  since " + format_rfc3339(*l.acquired_at);
      }
      if (l.live && l.expires_at) {
        out += "  expires " + format_rfc3339(*l.expires_at);
      }
      out += "\n";
    }
    for (const auto& [owner, n] : partitions) {
      out += "  message-group partitions  " + std::to_string(n) +
             (owner.empty() ? " free" : " held by " + owner) + "\n";
    }
  }
  if (r.groups) {
    out += "blocked message groups: " + std::to_string(r.groups->blocked);
    if (r.groups->oldest_blocked_at) {
      out += " (oldest since " + format_rfc3339(*r.groups->oldest_blocked_at) +
             "; see `outbox groups list`)";
    }
    out += "\n";
  }
  if (r.relay) {
    out += "this relay: " + r.relay->mode + ", owner " + r.relay->owner +
           (r.relay->leader ? ", leader\n" : "\n");
  }
  if (r.stream) {
    out += to_text(*r.stream);
  }
  return out;
}

std::string dead_to_json(const std::vector<OutboxEvent>& rows) {
  std::string out = "[";
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto& e = rows[i];
    out += i > 0 ? ",{\"event_id\":" : "{\"event_id\":";
    append_text(out, e.event_id);
    out += ",\"event_type\":";
    append_text(out, e.event_type);
    out += ",\"aggregate_type\":";
    append_text(out, e.aggregate_type);
    out += ",\"aggregate_id\":";
    append_optional(out, e.aggregate_id);
    out += ",\"tenant_id\":";
    append_optional(out, e.tenant_id);
    out += ",\"attempts\":" + std::to_string(e.attempts) + ",\"created_at\":\"" +
           format_rfc3339(e.created_at) + "\",\"last_error\":";
    append_optional(out, e.last_error);
    out += "}";
  }
  out += "]";
  return out;
}

std::string dead_to_text(const std::vector<OutboxEvent>& rows) {
  std::string out;
  for (const auto& e : rows) {
    out += e.event_id + "  " + e.event_type + "  " + e.aggregate_type + "/" +
           e.aggregate_id.value_or("-") + "  attempts=" + std::to_string(e.attempts) + "  " +
           format_rfc3339(e.created_at) + "  " + e.last_error.value_or("") + "\n";
  }
  return out;
}

}  // namespace outbox::relay

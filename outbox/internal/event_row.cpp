#include "outbox/internal/event_row.hpp"

#include "outbox/sql/dialect.hpp"

namespace outbox::internal {

std::string event_columns(const sql::Dialect& d, bool with_payloads) {
  const std::string payload = with_payloads ? d.json_text("payload") : d.typed("''", "text");
  std::string out = "event_id, event_type, aggregate_type, aggregate_id, tenant_id, " + payload +
                    ", " + d.json_text("headers") + ", status, attempts, " +
                    d.micros("available_at") + ", " + d.micros("created_at") + ", " +
                    d.micros("done_at") + ", last_error, locked_by, " + d.micros("locked_at") +
                    ", " + d.json_text("tags");
  if (d.has_bytes_column()) {
    out += with_payloads ? ", payload_bytes" : ", " + d.typed("NULL", "bytea");
  } else {
    out += ", NULL";  // the same layout on every engine: more columns may follow
  }
  return out + ", message_group, partition_no";
}

OutboxEvent event_from_row(const sql::Row& r) {
  OutboxEvent e;
  // Field by field: a column another client wrote with a type no reading fits (a REAL where text
  // belongs, text where an instant belongs) marks this row unreadable, with the first such
  // column named, instead of failing the whole read and stalling every row behind it.
  const auto read = [&](const char* column, auto&& assign) {
    try {
      assign();
    } catch (const std::exception& ex) {
      if (!e.unreadable) {
        e.unreadable = std::string(column) + ": " + ex.what();
      }
    }
  };
  read("event_id", [&] { e.event_id = r.get_text(0); });
  read("event_type", [&] { e.event_type = r.get_text(1); });
  read("aggregate_type", [&] {
    e.aggregate_type = r.get_optional_text(2).value_or(std::string(AggregateType::kGlobalName));
  });
  read("aggregate_id", [&] { e.aggregate_id = r.get_optional_text(3); });
  read("tenant_id", [&] { e.tenant_id = r.get_optional_text(4); });
  read("payload", [&] {
    if (r.is_null(5) && !r.is_null(16)) {
      e.payload_is_json = false;
      e.payload = r.get_text(16);
    } else {
      e.payload_is_json = !r.is_blob(5);
      e.payload = r.get_text(5);
    }
  });
  read("headers", [&] { e.headers_json = r.get_optional_text(6); });
  read("status", [&] { e.status = static_cast<EventStatus>(r.get_int(7)); });
  read("attempts", [&] { e.attempts = static_cast<int>(r.get_int(8)); });
  read("available_at", [&] { e.available_at = from_micros(r.get_int(9)); });
  read("created_at", [&] { e.created_at = from_micros(r.get_int(10)); });
  read("done_at", [&] {
    if (auto v = r.get_optional_int(11)) {
      e.done_at = from_micros(*v);
    }
  });
  read("last_error", [&] { e.last_error = r.get_optional_text(12); });
  read("locked_by", [&] { e.locked_by = r.get_optional_text(13); });
  read("locked_at", [&] {
    if (auto v = r.get_optional_int(14)) {
      e.locked_at = from_micros(*v);
    }
  });
  read("tags", [&] { e.tags_json = r.get_optional_text(15); });
  read("message_group", [&] { e.message_group = r.get_optional_text(17); });
  read("partition_no", [&] {
    if (auto v = r.get_optional_int(18)) {
      e.partition_no = static_cast<int>(*v);
    }
  });
  return e;
}

std::vector<OutboxEvent> events_from_rows(const std::vector<sql::Row>& rows) {
  std::vector<OutboxEvent> out;
  out.reserve(rows.size());
  for (const auto& r : rows) {
    out.push_back(event_from_row(r));
  }
  return out;
}

}  // namespace outbox::internal

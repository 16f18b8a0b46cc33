#include "outbox/internal/event_row.hpp"

namespace outbox::internal {

OutboxEvent event_from_row(const sql::Row& r) {
  OutboxEvent e;
  e.event_id = r.get_text(0);
  e.event_type = r.get_text(1);
  e.aggregate_type = r.get_optional_text(2).value_or(std::string(AggregateType::kGlobalName));
  e.aggregate_id = r.get_optional_text(3);
  e.tenant_id = r.get_optional_text(4);
  if (r.is_null(5) && r.size() > 15) {
    e.payload_is_json = false;
    e.payload = r.get_text(15);
  } else {
    e.payload_is_json = !r.is_blob(5);
    e.payload = r.get_text(5);
  }
  e.headers_json = r.get_optional_text(6);
  e.status = static_cast<EventStatus>(r.get_int(7));
  e.attempts = static_cast<int>(r.get_int(8));
  e.available_at = from_micros(r.get_int(9));
  e.created_at = from_micros(r.get_int(10));
  if (auto v = r.get_optional_int(11)) {
    e.done_at = from_micros(*v);
  }
  e.last_error = r.get_optional_text(12);
  e.locked_by = r.get_optional_text(13);
  if (auto v = r.get_optional_int(14)) {
    e.locked_at = from_micros(*v);
  }
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

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

std::vector<std::int64_t> count_by_status(sql::Connection& conn, const std::string& table) {
  std::vector<std::int64_t> counts(4, 0);
  for (const auto& r : conn.query("SELECT status, COUNT(*) FROM " + table + " GROUP BY status",
                                  std::span<const sql::Value>())) {
    const auto status = r.get_int(0);
    if (status >= 0 && status < 4) {
      counts[static_cast<std::size_t>(status)] = r.get_int(1);
    }
  }
  return counts;
}

std::vector<std::pair<std::string, std::int64_t>> count_dead_by_type(sql::Connection& conn,
                                                                     const std::string& table) {
  std::vector<std::pair<std::string, std::int64_t>> out;
  for (const auto& r : conn.query("SELECT event_type, COUNT(*) FROM " + table +
                                      " WHERE status = 3 GROUP BY event_type ORDER BY 2 DESC, 1",
                                  std::span<const sql::Value>())) {
    out.emplace_back(r.get_text(0), r.get_int(1));
  }
  return out;
}

int release_claims(sql::Connection& conn, const std::string& table, std::string_view marker,
                   std::string_view owner) {
  return static_cast<int>(conn.execute("UPDATE " + table +
                                           " SET locked_by = NULL, locked_at = NULL WHERE "
                                           "locked_by = " +
                                           std::string(marker) + " AND status IN (0, 2)",
                                       {sql::TextRef{owner}}));
}

std::optional<Timestamp> optional_micros(sql::Connection& conn, const std::string& sql) {
  const auto rows = conn.query(sql, std::span<const sql::Value>());
  if (rows.empty() || rows[0].is_null(0)) {
    return std::nullopt;
  }
  return from_micros(rows[0].get_int(0));
}

std::string question_marks(std::size_t n) {
  std::string s;
  s.reserve(n * 2);
  for (std::size_t i = 0; i < n; ++i) {
    s += i == 0 ? "?" : ",?";
  }
  return s;
}

}  // namespace outbox::internal

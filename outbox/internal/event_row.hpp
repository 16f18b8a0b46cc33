#pragma once
// Maps the canonical SELECT list every store uses to an OutboxEvent. Internal to the stores.
//
// Columns: 0 event_id, 1 event_type, 2 aggregate_type, 3 aggregate_id, 4 tenant_id,
// 5 payload (JSON text; a blob means a bytes payload; NULL when column 16 holds the bytes),
// 6 headers, 7 status, 8 attempts, 9 available_at, 10 created_at, 11 done_at (microseconds since
// the epoch), 12 last_error, 13 locked_by, 14 locked_at, 15 tags, 16 payload bytes (NULL where
// column 5 holds them). A query may add columns after these.

#include <string>
#include <vector>

#include "outbox/sql/connection.hpp"
#include "outbox/sql/value.hpp"
#include "outbox/store.hpp"

namespace outbox::sql {
class Dialect;
}

namespace outbox::internal {

/// The SELECT list above; `with_payloads` false reads empty payloads (listings).
std::string event_columns(const sql::Dialect& d, bool with_payloads);

OutboxEvent event_from_row(const sql::Row& row);
std::vector<OutboxEvent> events_from_rows(const std::vector<sql::Row>& rows);

}  // namespace outbox::internal

#include "outbox/sqlite/store.hpp"

#include <algorithm>

#include "outbox/internal/event_row.hpp"
#include "outbox/sql/connection.hpp"
#include "outbox/sql/lease_store.hpp"

namespace outbox::sqlite {
namespace {

class SqliteDialect final : public sql::Dialect {
 public:
  std::string_view name() const override { return "sqlite"; }
  std::string placeholder(int) const override { return "?"; }
  std::string instant(const std::string& marker) const override { return marker; }
  std::string micros_interval(const std::string& marker) const override { return marker; }
  // julianday('now') is fixed for the whole statement, like a server's statement time.
  std::string lease_now() const override {
    return "CAST((julianday('now') - 2440587.5) * 86400000000.0 AS INTEGER)";
  }
  bool has_bytes_column() const override { return false; }
  std::string insert_ignore(const std::string& into_values, const std::string&) const override {
    return "INSERT OR IGNORE " + into_values;
  }
};

}  // namespace

const sql::Dialect& dialect() {
  static const SqliteDialect instance;
  return instance;
}

void create_schema(sql::Connection& conn, const std::string& table) {
  validate_table_name(table);
  conn.execute("CREATE TABLE IF NOT EXISTS " + table +
               " ("
               "event_id TEXT PRIMARY KEY NOT NULL, "
               "event_type TEXT NOT NULL, "
               "aggregate_type TEXT, "
               "aggregate_id TEXT, "
               "tenant_id TEXT, "
               "payload BLOB NOT NULL, "
               "headers TEXT, "
               "status INTEGER NOT NULL, "
               "attempts INTEGER NOT NULL DEFAULT 0, "
               "available_at INTEGER NOT NULL, "
               "created_at INTEGER NOT NULL, "
               "done_at INTEGER, "
               "last_error TEXT, "
               "locked_by TEXT, "
               "locked_at INTEGER)");
  // Pending rows only, in poll order: poll and claim walk this small index instead of the whole
  // table, however many DONE rows wait for purge.
  conn.execute("CREATE INDEX IF NOT EXISTS " + table + "_pending ON " + table +
               " (created_at, event_id) WHERE " + sql::pending_statuses());
  // Terminal rows in purge order.
  conn.execute("CREATE INDEX IF NOT EXISTS " + table + "_terminal ON " + table +
               " (created_at) WHERE " + sql::terminal_statuses());
  conn.execute("CREATE INDEX IF NOT EXISTS " + table + "_created ON " + table + " (created_at)");
  create_lease_schema(conn, table);
}

void create_lease_schema(sql::Connection& conn, const std::string& table) {
  validate_table_name(table);
  // Instants in microseconds since the epoch, on the host's clock (Dialect::lease_now).
  conn.execute("CREATE TABLE IF NOT EXISTS " + sql::lease_table_name(table) +
               " (name TEXT PRIMARY KEY NOT NULL, owner TEXT, epoch INTEGER NOT NULL DEFAULT 0, "
               "acquired_at INTEGER, renewed_at INTEGER, expires_at INTEGER)");
}

SqliteOutboxStore::SqliteOutboxStore(Options options)
    : SqlOutboxStore(dialect(), std::move(options)) {}

std::vector<std::string> SqliteOutboxStore::renew_claims(sql::Connection& conn,
                                                         std::string_view owner,
                                                         const std::vector<std::string>& event_ids,
                                                         Timestamp now) {
  std::vector<std::string> renewed;
  const std::size_t chunk = id_chunk();
  for (std::size_t i = 0; i < event_ids.size(); i += chunk) {
    auto s = statement();
    s.sql("UPDATE " + table() + " SET locked_at = ")
        .now(now)
        .sql(" WHERE locked_by = ")
        .param(sql::TextRef{owner})
        .sql(" AND " + sql::pending_statuses() + " AND")
        .ids_in("event_id", event_ids, i, std::min(chunk, event_ids.size() - i))
        .sql(" RETURNING event_id");
    for (const auto& row : s.query(conn)) {
      renewed.push_back(row.get_text(0));
    }
  }
  return renewed;
}

std::vector<OutboxEvent> SqliteOutboxStore::claim_pending(sql::Connection& conn,
                                                          std::string_view owner, Timestamp now,
                                                          std::chrono::milliseconds lock_timeout,
                                                          std::chrono::microseconds skip_recent,
                                                          int limit, const PendingKey* after) {
  // One statement: SQLite runs it under the database write lock, so two processes can never
  // both claim a row.
  auto s = statement();
  s.sql("UPDATE " + table() + " SET locked_by = ")
      .param(sql::TextRef{owner})
      .sql(", locked_at = ")
      .now(now)
      .sql(" WHERE event_id IN (SELECT event_id FROM " + table());
  where_due(s, now, skip_recent);
  claimable(s, owner, now, lock_timeout, after);
  oldest_first(s, limit);
  s.sql(") RETURNING " + columns());
  auto events = internal::events_from_rows(s.query(conn));
  // RETURNING gives no order guarantee.
  std::sort(events.begin(), events.end(), [](const OutboxEvent& a, const OutboxEvent& b) {
    return a.created_at != b.created_at ? a.created_at < b.created_at : a.event_id < b.event_id;
  });
  return events;
}

}  // namespace outbox::sqlite

#pragma once
// The PostgreSQL OutboxStore, schema and purgers: TIMESTAMPTZ, JSONB, SMALLINT, partial indexes.

#include <string>

#include "outbox/sql/sql_store.hpp"

namespace outbox::postgres {

/// Creates the outbox table and its indexes if missing (idempotent). Throws outbox::StoreError,
/// std::invalid_argument on a bad table name.
void create_schema(sql::Connection& conn, const std::string& table = "outbox_event");
/// Creates the lease table of `table` (sql::lease_table_name) if missing: schema version 3, also
/// made by create_schema. Throws outbox::StoreError, std::invalid_argument on a bad table name.
void create_lease_schema(sql::Connection& conn, const std::string& table = "outbox_event");
/// Throws StoreError unless `table` has the index named `index`: CREATE INDEX IF NOT EXISTS also
/// skips a name another table's index holds (index names are per schema), and without its
/// indexes the table would work, slowly, and nobody would know.
void require_index(sql::Connection& conn, const std::string& table, const std::string& index);

/// Adds message groups to `table` if missing (schema version 5, also made by create_schema): the
/// message_group and partition_no columns, the index of grouped pending rows, the pending index
/// without them, and the table of blocked groups. Throws outbox::StoreError.
void create_group_schema(sql::Connection& conn, const std::string& table = "outbox_event");
/// Gives `table` the defaults an outside writer's minimal insert relies on (status PENDING,
/// available_at and created_at now): schema version 6, also made by create_schema. Throws
/// outbox::StoreError, std::invalid_argument on a bad table name.
void create_writer_defaults(sql::Connection& conn, const std::string& table = "outbox_event");
/// Adds the tracingspancontext column Debezium's outbox event router reads the trace from (schema
/// version 7, also made by create_schema). Throws outbox::StoreError, std::invalid_argument on a
/// bad table name.
void create_tracing_column(sql::Connection& conn, const std::string& table = "outbox_event");
/// Indexes the RETRY and DEAD rows by status and type (schema version 13, also made by
/// create_schema), which the status counts and the dead events' counts by type read; a name
/// another relation holds is logged and left (the counts then read the table). Throws
/// outbox::StoreError, std::invalid_argument on a bad table name.
void create_retry_dead_index(sql::Connection& conn, const std::string& table = "outbox_event");

/// The PostgreSQL dialect: TIMESTAMPTZ, JSONB and BYTEA columns, `$n` parameters, id arrays.
const sql::Dialect& dialect();

/// OutboxStore for PostgreSQL. Claims are one statement (SELECT … FOR UPDATE SKIP LOCKED feeding an
/// UPDATE … RETURNING). JSON payloads are stored as JSONB, so the poller delivers them in JSONB's
/// canonical text (same JSON value, possibly other spacing and key order); invalid JSON is refused
/// at insert with a StoreError. Thread-safe (stateless).
class PostgresOutboxStore final : public sql::SqlOutboxStore {
 public:
  /// Throws std::invalid_argument on a bad table name.
  explicit PostgresOutboxStore(Options options = {});

  std::vector<std::string> renew_claims(sql::Connection& conn, std::string_view owner,
                                        const std::vector<std::string>& event_ids,
                                        Timestamp now) override;
  std::vector<OutboxEvent> claim_pending(sql::Connection& conn, std::string_view owner,
                                         Timestamp now, std::chrono::milliseconds lock_timeout,
                                         std::chrono::microseconds skip_recent, int limit,
                                         const PendingKey* after = nullptr) override;
};

/// SqlEventPurger for PostgreSQL (status-based: DONE and DEAD rows past their retention).
class PostgresEventPurger final : public sql::SqlEventPurger {
 public:
  /// Throws std::invalid_argument on a bad table name.
  explicit PostgresEventPurger(std::string table = "outbox_event")
      : SqlEventPurger(dialect(), std::move(table)) {}
};

/// SqlAgeBasedPurger for PostgreSQL (writer-only tables).
class PostgresAgeBasedPurger final : public sql::SqlAgeBasedPurger {
 public:
  /// Throws std::invalid_argument on a bad table name.
  explicit PostgresAgeBasedPurger(std::string table = "outbox_event")
      : SqlAgeBasedPurger(dialect(), std::move(table)) {}
};

}  // namespace outbox::postgres

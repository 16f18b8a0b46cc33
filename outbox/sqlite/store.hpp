#pragma once
// The SQLite OutboxStore, schema and purgers. Timestamps are INTEGER microseconds since the epoch.

#include <string>

#include "outbox/sql/sql_store.hpp"

namespace outbox::sqlite {

/// Creates the outbox table and its indexes if missing (idempotent). Throws outbox::StoreError,
/// std::invalid_argument on a bad table name.
void create_schema(sql::Connection& conn, const std::string& table = "outbox_event");
/// Creates the lease table of `table` (sql::lease_table_name) if missing: schema version 3, also
/// made by create_schema. Throws outbox::StoreError, std::invalid_argument on a bad table name.
void create_lease_schema(sql::Connection& conn, const std::string& table = "outbox_event");
/// Adds message groups to `table` if missing (schema version 5, also made by create_schema): the
/// message_group and partition_no columns, the index of grouped pending rows, the pending index
/// without them, and the table of blocked groups. Throws outbox::StoreError.
void create_group_schema(sql::Connection& conn, const std::string& table = "outbox_event");

/// Gives `table` its stream column (stream_seq, the AUTOINCREMENT rowid: the table is copied once
/// when it had none), the tags column and the subscription table: schema version 4, also made by
/// create_schema. Throws outbox::StoreError, std::invalid_argument on a bad table name.
void create_stream_schema(sql::Connection& conn, const std::string& table = "outbox_event");

/// Gives `table` the defaults an outside writer's minimal insert relies on (status PENDING,
/// available_at and created_at now): schema version 6, also made by create_schema. An older
/// table's definition is edited in place (no copy). Throws outbox::StoreError (also when a
/// column's definition is not the one create_schema wrote), std::invalid_argument on a bad name.
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

/// The SQLite dialect: INTEGER microseconds, one payload column (text or blob), `?` parameters,
/// no server clock.
const sql::Dialect& dialect();

/// OutboxStore for SQLite. Claims are single UPDATE … RETURNING statements, atomic across
/// processes sharing the file. Always on the caller's clock (use_database_clock is ignored).
/// Thread-safe (stateless).
class SqliteOutboxStore final : public sql::SqlOutboxStore {
 public:
  /// Throws std::invalid_argument on a bad table name.
  explicit SqliteOutboxStore(Options options = {});

  std::vector<std::string> renew_claims(sql::Connection& conn, std::string_view owner,
                                        const std::vector<std::string>& event_ids,
                                        Timestamp now) override;
  std::vector<OutboxEvent> claim_pending(sql::Connection& conn, std::string_view owner,
                                         Timestamp now, std::chrono::milliseconds lock_timeout,
                                         std::chrono::microseconds skip_recent, int limit,
                                         const PendingKey* after = nullptr) override;
};

/// SqlEventPurger for SQLite (status-based: DONE and DEAD rows past their retention).
class SqliteEventPurger final : public sql::SqlEventPurger {
 public:
  /// Throws std::invalid_argument on a bad table name.
  explicit SqliteEventPurger(std::string table = "outbox_event")
      : SqlEventPurger(dialect(), std::move(table)) {}
};

/// SqlAgeBasedPurger for SQLite (writer-only tables).
class SqliteAgeBasedPurger final : public sql::SqlAgeBasedPurger {
 public:
  /// Throws std::invalid_argument on a bad table name.
  explicit SqliteAgeBasedPurger(std::string table = "outbox_event")
      : SqlAgeBasedPurger(dialect(), std::move(table)) {}
};

}  // namespace outbox::sqlite

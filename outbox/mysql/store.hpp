#pragma once
// The MariaDB/MySQL OutboxStore, schema and purgers: DATETIME(6) in UTC, JSON, TINYINT, and
// indexed generated columns standing in for the partial indexes these engines lack.

#include <mutex>
#include <string>
#include <unordered_set>

#include "outbox/sql/sql_store.hpp"

namespace outbox::mysql {

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
/// Gives `table` the defaults an outside writer's minimal insert relies on (status PENDING,
/// available_at and created_at now): schema version 6, also made by create_schema. Throws
/// outbox::StoreError, std::invalid_argument on a bad table name.
void create_writer_defaults(sql::Connection& conn, const std::string& table = "outbox_event");
/// Adds the tracingspancontext column Debezium's outbox event router reads the trace from (schema
/// version 7, also made by create_schema). Throws outbox::StoreError, std::invalid_argument on a
/// bad table name.
void create_tracing_column(sql::Connection& conn, const std::string& table = "outbox_event");
/// Indexes the RETRY and DEAD rows by status and type through the virtual column retry_dead (schema
/// version 13, also made by create_schema; online, no copy of the table). Throws
/// outbox::StoreError, std::invalid_argument on a bad table name.
void create_retry_dead_index(sql::Connection& conn, const std::string& table = "outbox_event");
/// Makes stream_id (insert order) the primary key of `table`, event_id a unique index: InnoDB
/// stores rows in primary key order, and random event ids (UUIDv4 from other writers) scattered
/// every claim, mark and poll over the whole table (schema version 8, also made by create_schema;
/// rebuilds an older table in place). Throws outbox::StoreError.
void cluster_by_insert_order(sql::Connection& conn, const std::string& table = "outbox_event");

/// The MariaDB/MySQL dialect: DATETIME(6) in UTC, JSON columns, `?` parameters, generated
/// pending_at / terminal_at columns as the pending and terminal indexes.
const sql::Dialect& dialect();

/// OutboxStore for MariaDB 10.6+ / MySQL 8. Claims run SELECT … FOR UPDATE SKIP LOCKED and an
/// UPDATE in one short transaction (joining the caller's if one is open). JSON payloads are kept as
/// written. Multi-row inserts stay under half the session's max_allowed_packet. Thread-safe (its
/// one state, the owners whose last claim found nothing, only decides whether a claim reads
/// first).
class MySqlOutboxStore final : public sql::SqlOutboxStore {
 public:
  /// Throws std::invalid_argument on a bad table name.
  explicit MySqlOutboxStore(Options options = {});

  std::vector<std::string> renew_claims(sql::Connection& conn, std::string_view owner,
                                        const std::vector<std::string>& event_ids,
                                        Timestamp now) override;
  std::vector<OutboxEvent> claim_pending(sql::Connection& conn, std::string_view owner,
                                         Timestamp now, std::chrono::milliseconds lock_timeout,
                                         std::chrono::microseconds skip_recent, int limit,
                                         const PendingKey* after = nullptr) override;

 protected:
  std::size_t insert_byte_budget(sql::Connection& conn) override;

 private:
  std::mutex mutex_;                             // guards idle_owners_
  std::unordered_set<std::string> idle_owners_;  // whose last claim found nothing
};

/// SqlEventPurger for MariaDB/MySQL (status-based: DONE and DEAD rows past their retention).
class MySqlEventPurger final : public sql::SqlEventPurger {
 public:
  /// Throws std::invalid_argument on a bad table name.
  explicit MySqlEventPurger(std::string table = "outbox_event")
      : SqlEventPurger(dialect(), std::move(table)) {}
};

/// SqlAgeBasedPurger for MariaDB/MySQL (writer-only tables).
class MySqlAgeBasedPurger final : public sql::SqlAgeBasedPurger {
 public:
  /// Throws std::invalid_argument on a bad table name.
  explicit MySqlAgeBasedPurger(std::string table = "outbox_event")
      : SqlAgeBasedPurger(dialect(), std::move(table)) {}
};

}  // namespace outbox::mysql

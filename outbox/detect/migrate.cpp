#include <stdexcept>

#include "outbox/detect/detect.hpp"
#include "outbox/sql/connection.hpp"
#include "outbox/sql/dialect.hpp"

namespace outbox {
namespace {

// Serializes concurrent migrations of one database (two `outbox migrate` runs, or relays
// starting together): without it both create the same objects and one fails.
class MigrationLock {
 public:
  MigrationLock(const sql::Engine& engine, sql::Connection& conn) : engine_(engine), conn_(conn) {
    engine_.lock_migrations(conn_);
  }
  void commit() {
    engine_.unlock_migrations(conn_, true);
    released_ = true;
  }
  ~MigrationLock() {
    if (released_) {
      return;
    }
    try {
      engine_.unlock_migrations(conn_, false);
    } catch (const std::exception&) {
      // The session's end releases the lock (and rolls back) anyway.
    }
  }
  MigrationLock(const MigrationLock&) = delete;
  MigrationLock& operator=(const MigrationLock&) = delete;

 private:
  const sql::Engine& engine_;
  sql::Connection& conn_;
  bool released_ = false;
};

}  // namespace

MigrationResult migrate(sql::Connection& conn, const std::string& table,
                        const MigrationStep& before_step) {
  validate_table_name(table);
  const sql::Engine& engine = engine_for(conn.dialect());
  const sql::Dialect& dialect = engine.dialect();
  MigrationLock lock(engine, conn);
  const std::span<const sql::Value> none;
  conn.execute(
      "CREATE TABLE IF NOT EXISTS outbox_schema_version (table_name VARCHAR(63) PRIMARY KEY, "
      "version INTEGER NOT NULL)",
      none);
  if (dialect.name() == "mysql") {
    // MariaDB tells table names apart by case (lower_case_table_names = 0, Linux's default)
    // while its default collation does not: Outbox_Event's version row would also answer for
    // outbox_event, and migrating the second would create nothing.
    const auto rows = conn.query(
        "SELECT @@lower_case_table_names, (SELECT COLLATION_NAME FROM information_schema.COLUMNS "
        "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'outbox_schema_version' AND "
        "COLUMN_NAME = 'table_name')",
        none);
    if (!rows.empty() && rows[0].get_int(0) == 0 &&
        rows[0].get_optional_text(1).value_or("") != "utf8mb4_bin") {
      conn.execute(
          "ALTER TABLE outbox_schema_version MODIFY table_name VARCHAR(63) CHARACTER SET utf8mb4 "
          "COLLATE utf8mb4_bin NOT NULL",
          none);
    }
  }
  // Table names are validated identifiers, so they can be inlined as literals. SQLite and
  // PostgreSQL (unquoted) names ignore case: OUTBOX_EVENT is outbox_event's row; MariaDB's
  // (on Linux) do not.
  const std::string row_of_table = dialect.name() == "mysql"
                                       ? "table_name = '" + table + "'"
                                       : "LOWER(table_name) = LOWER('" + table + "')";
  const auto rows =
      conn.query("SELECT MAX(version) FROM outbox_schema_version WHERE " + row_of_table, none);
  const auto step = [&](int version, std::string_view what) {
    if (before_step) {
      before_step(version, what);
    }
  };
  MigrationResult result;
  result.from = rows.empty() || rows[0].is_null(0) ? 0 : static_cast<int>(rows[0].get_int(0));
  if (result.from > kSchemaVersion) {
    throw std::invalid_argument("table " + table + " is at schema version " +
                                std::to_string(result.from) + ", newer than this build (" +
                                std::to_string(kSchemaVersion) + ")");
  }
  // Version 1: the table and its indexes. Later versions add a step here each.
  if (result.from < 1) {
    step(1, "the table and its indexes");
    engine.create_schema(conn, table);
  }
  // Version 2: DEAD rows record when they became DEAD in done_at (their purge retention counts
  // from then). Rows that went DEAD before have none: their retention starts now (purgers never
  // delete a DEAD row without done_at).
  if (result.from < 2) {  // 0 too: the table may have been made by create_schema
    step(2, "DEAD rows record when they went DEAD");
    sql::Statement s(dialect, true);
    s.sql("UPDATE " + table + " SET done_at = ")
        .now(Clock::system()->now())
        .sql(" WHERE status = " + sql::status_sql(EventStatus::Dead) + " AND done_at IS NULL")
        .execute(conn);
  }
  // Version 3: the lease table (leader election and fencing).
  if (result.from < 3) {
    step(3, "the lease table");
    engine.create_lease_schema(conn, table);
  }
  // Version 4: stream positions, tags and the subscription table (stream mode).
  if (result.from < 4) {
    step(4, "stream positions, tags and subscriptions");
    engine.create_stream_schema(conn, table);
  }
  // Version 5: message groups (group key, partition, blocked groups).
  if (result.from < 5) {
    step(5, "message groups");
    engine.create_group_schema(conn, table);
  }
  // Version 6: defaults for the minimal insert of a writer in another language (status,
  // available_at, created_at).
  if (result.from < 6) {
    step(6, "defaults for other languages' writers");
    engine.create_writer_defaults(conn, table);
  }
  // Version 7: the tracingspancontext column (Debezium's outbox event router reads the trace
  // context there).
  if (result.from < 7) {
    step(7, "the tracing column (Debezium)");
    engine.create_tracing_column(conn, table);
  }
  // Version 8: rows stored in insert order (MariaDB: the primary key becomes stream_id, the
  // table is rebuilt).
  if (result.from < 8 && engine.cluster_by_insert_order) {
    step(8, "rows stored in insert order (MariaDB rebuilds the table)");
    engine.cluster_by_insert_order(conn, table);
  }
  // Version 9: grouped rows indexed per partition in insert order where claims read the oldest
  // groups' heads there (SQLite: sql::Dialect::group_fronts).
  if (result.from < 9 && dialect.group_fronts()) {
    step(9, "grouped rows indexed in insert order");
    engine.create_group_schema(conn, table);
  }
  // Version 10: that index on the partition and stream_seq alone (the same order, a fraction of
  // the pages a DONE mark or an insert rewrites).
  if (result.from < 10 && dialect.group_fronts()) {
    step(10, "the index of grouped rows in insert order narrowed");
    engine.create_group_schema(conn, table);
  }
  // Version 11: an index of rows whose partition number is not a whole number, which count as
  // none (SQLite, whose columns keep a REAL whatever their type; elsewhere the column rounds it).
  if (result.from < 11 && dialect.name() == "sqlite") {
    step(11, "partition numbers that are not whole numbers count as none");
    engine.create_group_schema(conn, table);
  }
  // Version 12: indexes of the grouped rows that have failed, which an operator's list of groups
  // reads, and of those numbered outside the partitions, which an action on one group reads
  // (SQLite and PostgreSQL; MariaDB has no partial indexes, and reads the pending grouped rows).
  if (result.from < 12 && dialect.name() != "mysql") {
    step(12, "grouped rows that have failed or are numbered outside the partitions indexed");
    engine.create_group_schema(conn, table);
  }
  // Version 13: an index of the RETRY and DEAD rows by status and type, which the status counts
  // read (MariaDB: of a virtual column that holds the status of such a row, added online).
  if (result.from < 13) {
    step(13, "RETRY and DEAD rows indexed by status and type");
    engine.create_retry_dead_index(conn, table);
  }
  if (result.from == 0) {
    // Idempotent as well as serialized: a run that raced past the lock (a session that lost it)
    // still cannot fail on the key.
    conn.execute(
        dialect.insert_ignore("INTO outbox_schema_version (table_name, version) VALUES ('" + table +
                                  "', " + std::to_string(kSchemaVersion) + ")",
                              "table_name"),
        none);
  } else if (result.from < kSchemaVersion) {
    conn.execute("UPDATE outbox_schema_version SET version = " + std::to_string(kSchemaVersion) +
                     " WHERE " + row_of_table,
                 none);
  }
  result.to = kSchemaVersion;
  lock.commit();
  return result;
}

}  // namespace outbox

#include "outbox/detect/detect.hpp"

#include <stdexcept>

#include "outbox/errors.hpp"
#include "outbox/sql/connection.hpp"
#include "outbox/store.hpp"

#ifdef OUTBOX_HAVE_SQLITE
#include "outbox/sqlite/driver.hpp"
#include "outbox/sqlite/store.hpp"
#endif
#ifdef OUTBOX_HAVE_POSTGRES
#include "outbox/postgres/driver.hpp"
#include "outbox/postgres/store.hpp"
#endif
#ifdef OUTBOX_HAVE_MYSQL
#include "outbox/mysql/driver.hpp"
#include "outbox/mysql/store.hpp"
#endif

namespace outbox {
namespace {

[[noreturn]] void unsupported(std::string_view dialect) {
  throw std::invalid_argument("no outbox store for dialect '" + std::string(dialect) +
                              "' in this build");
}

}  // namespace

std::shared_ptr<OutboxStore> detect_store(sql::Connection& conn, const std::string& table,
                                          const JsonCodec& codec) {
  const auto dialect = conn.dialect();
#ifdef OUTBOX_HAVE_SQLITE
  if (dialect == "sqlite") {
    return std::make_shared<sqlite::SqliteOutboxStore>(table, codec);
  }
#endif
#ifdef OUTBOX_HAVE_POSTGRES
  if (dialect == "postgres") {
    return std::make_shared<postgres::PostgresOutboxStore>(
        postgres::PostgresOutboxStore::Options{.table = table, .codec = &codec});
  }
#endif
#ifdef OUTBOX_HAVE_MYSQL
  if (dialect == "mysql") {
    return std::make_shared<mysql::MySqlOutboxStore>(
        mysql::MySqlOutboxStore::Options{.table = table, .codec = &codec});
  }
#endif
  unsupported(dialect);
}

std::shared_ptr<EventPurger> detect_purger(sql::Connection& conn, const std::string& table) {
  const auto dialect = conn.dialect();
#ifdef OUTBOX_HAVE_SQLITE
  if (dialect == "sqlite") {
    return std::make_shared<sqlite::SqliteEventPurger>(table);
  }
#endif
#ifdef OUTBOX_HAVE_POSTGRES
  if (dialect == "postgres") {
    return std::make_shared<postgres::PostgresEventPurger>(table);
  }
#endif
#ifdef OUTBOX_HAVE_MYSQL
  if (dialect == "mysql") {
    return std::make_shared<mysql::MySqlEventPurger>(table);
  }
#endif
  unsupported(dialect);
}

void create_schema_for(sql::Connection& conn, const std::string& table) {
  const auto dialect = conn.dialect();
#ifdef OUTBOX_HAVE_SQLITE
  if (dialect == "sqlite") {
    return sqlite::create_schema(conn, table);
  }
#endif
#ifdef OUTBOX_HAVE_POSTGRES
  if (dialect == "postgres") {
    return postgres::create_schema(conn, table);
  }
#endif
#ifdef OUTBOX_HAVE_MYSQL
  if (dialect == "mysql") {
    return mysql::create_schema(conn, table);
  }
#endif
  unsupported(dialect);
}

std::shared_ptr<sql::ConnectionPool> open_pool(const std::string& url, std::size_t max_size,
                                               bool create_sqlite_file,
                                               const sql::NetworkTimeouts& timeouts) {
  auto starts = [&](std::string_view prefix) { return url.rfind(prefix, 0) == 0; };
  if (starts("sqlite://")) {
#ifdef OUTBOX_HAVE_SQLITE
    const std::string path = url.substr(9);
    if (path.empty()) {
      throw std::invalid_argument("database URL '" + url + "' has no file path");
    }
    return sqlite::make_pool(path, max_size, sqlite::OpenOptions{.create = create_sqlite_file});
#else
    unsupported("sqlite");
#endif
  }
  if (starts("postgresql://") || starts("postgres://") ||
      (url.find('=') != std::string::npos && url.find("://") == std::string::npos)) {
#ifdef OUTBOX_HAVE_POSTGRES
    return postgres::make_pool(url, max_size, timeouts);
#else
    unsupported("postgres");
#endif
  }
  if (starts("mysql://") || starts("mariadb://")) {
#ifdef OUTBOX_HAVE_MYSQL
    return mysql::make_pool(url, max_size, timeouts);
#else
    unsupported("mysql");
#endif
  }
  throw std::invalid_argument("unsupported database URL '" + url.substr(0, url.find(':')) +
                              ":…': use sqlite:///path.db, postgresql://… or mysql://…");
}

namespace {

// Serializes concurrent migrations of one database (two `outbox migrate` runs, or relays
// starting together): without it both create the same objects and one fails.
class MigrationLock {
 public:
  explicit MigrationLock(sql::Connection& conn) : conn_(conn), dialect_(conn.dialect()) {
    if (dialect_ == "mysql") {
      // DDL commits implicitly in MariaDB, so a transaction cannot hold this: a named lock can.
      const auto rows = conn_.query("SELECT GET_LOCK('outbox_migrate', 300)");
      if (rows.empty() || rows[0].is_null(0) || rows[0].get_int(0) != 1) {
        throw StoreError("migrate: another migration held the lock for 5 minutes", "55P03");
      }
      return;
    }
    // PostgreSQL and SQLite: DDL is transactional; the whole migration is one transaction,
    // begun under an advisory lock (PostgreSQL) or the write lock (SQLite's BEGIN IMMEDIATE).
    conn_.begin();
    if (dialect_ == "postgres") {
      try {
        conn_.query("SELECT pg_advisory_xact_lock(7100534263114217)");
      } catch (...) {
        conn_.rollback();
        throw;
      }
    }
  }
  void commit() {
    if (dialect_ != "mysql") {
      conn_.commit();
    }
    committed_ = true;
  }
  ~MigrationLock() {
    try {
      if (dialect_ == "mysql") {
        conn_.query("SELECT RELEASE_LOCK('outbox_migrate')");
      } else if (!committed_) {
        conn_.rollback();
      }
    } catch (const std::exception&) {
      // The session's end releases the lock (and rolls back) anyway.
    }
  }
  MigrationLock(const MigrationLock&) = delete;
  MigrationLock& operator=(const MigrationLock&) = delete;

 private:
  sql::Connection& conn_;
  std::string dialect_;
  bool committed_ = false;
};

}  // namespace

MigrationResult migrate(sql::Connection& conn, const std::string& table) {
  validate_table_name(table);
  MigrationLock lock(conn);
  const std::span<const sql::Value> none;
  conn.execute(
      "CREATE TABLE IF NOT EXISTS outbox_schema_version (table_name VARCHAR(63) PRIMARY KEY, "
      "version INTEGER NOT NULL)",
      none);
  // Table names are validated identifiers, so they can be inlined as literals.
  const auto rows = conn.query(
      "SELECT version FROM outbox_schema_version WHERE table_name = '" + table + "'", none);
  MigrationResult result;
  result.from = rows.empty() ? 0 : static_cast<int>(rows[0].get_int(0));
  if (result.from > kSchemaVersion) {
    throw std::invalid_argument("table " + table + " is at schema version " +
                                std::to_string(result.from) + ", newer than this build (" +
                                std::to_string(kSchemaVersion) + ")");
  }
  // Version 1: the table and its indexes. Later versions add a step here each.
  if (result.from < 1) {
    create_schema_for(conn, table);
  }
  // Version 2: DEAD rows record when they became DEAD in done_at (their purge retention counts
  // from then). Rows that went DEAD before have none: their retention starts now (purgers never
  // delete a DEAD row without done_at).
  if (result.from < 2) {  // 0 too: the table may have been made by create_schema
    const std::string_view dialect = conn.dialect();
    const std::string now = dialect == "postgres" ? "statement_timestamp()"
                            : dialect == "mysql"
                                ? "UTC_TIMESTAMP(6)"
                                : std::to_string(to_micros(Clock::system()->now()));
    conn.execute(
        "UPDATE " + table + " SET done_at = " + now + " WHERE status = 3 AND done_at IS NULL",
        none);
  }
  if (result.from == 0) {
    // Idempotent as well as serialized: a run that raced past the lock (a session that lost it)
    // still cannot fail on the key.
    const std::string_view dialect = conn.dialect();
    const std::string values = " INTO outbox_schema_version (table_name, version) VALUES ('" +
                               table + "', " + std::to_string(kSchemaVersion) + ")";
    conn.execute(dialect == "mysql" ? "INSERT IGNORE" + values
                 : dialect == "postgres"
                     ? "INSERT" + values + " ON CONFLICT (table_name) DO NOTHING"
                     : "INSERT OR IGNORE" + values,
                 none);
  } else if (result.from < kSchemaVersion) {
    conn.execute("UPDATE outbox_schema_version SET version = " + std::to_string(kSchemaVersion) +
                     " WHERE table_name = '" + table + "'",
                 none);
  }
  result.to = kSchemaVersion;
  lock.commit();
  return result;
}

}  // namespace outbox

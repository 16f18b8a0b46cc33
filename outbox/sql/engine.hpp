#pragma once
// What the library needs from one SQL engine. Database URLs, stores, purgers and migrations reach
// every engine through one registry of these (outbox/detect) instead of a list in each place.

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "outbox/change_watcher.hpp"
#include "outbox/sql/connection.hpp"
#include "outbox/sql/sql_store.hpp"
#include "outbox/stream.hpp"

namespace outbox::sql {

/// How to open a pool from a URL.
struct PoolOptions {
  std::size_t max_size = 8;
  /// False: a missing SQLite file is an error instead of a new empty database.
  bool create_sqlite_file = true;
  NetworkTimeouts timeouts;  ///< server engines only
};

/// One engine: its URLs, driver, dialect, store, purger, schema and migration lock.
struct Engine {
  std::string_view name;  ///< what its connections' Connection::dialect() reports
  /// True when `url` names a database of this engine.
  bool (*accepts)(std::string_view url);
  /// Opens a pool; throws std::invalid_argument on a malformed URL, StoreError when connecting
  /// fails.
  std::shared_ptr<ConnectionPool> (*open_pool)(const std::string& url, const PoolOptions& options);
  const Dialect& (*dialect)();
  std::shared_ptr<OutboxStore> (*make_store)(const StoreOptions& options);
  std::shared_ptr<EventPurger> (*make_purger)(const std::string& table);
  /// Creates the table and its indexes if missing (schema version 1).
  void (*create_schema)(Connection& conn, const std::string& table);
  /// Creates the lease table of `table` if missing (schema version 3).
  void (*create_lease_schema)(Connection& conn, const std::string& table);
  /// Adds stream positions, tags and the subscription table if missing (schema version 4).
  void (*create_stream_schema)(Connection& conn, const std::string& table);
  /// Adds message groups if missing (schema version 5).
  void (*create_group_schema)(Connection& conn, const std::string& table);
  /// Gives outside writers' minimal inserts their defaults (schema version 6).
  void (*create_writer_defaults)(Connection& conn, const std::string& table);
  /// Adds the tracingspancontext column if missing (schema version 7).
  void (*create_tracing_column)(Connection& conn, const std::string& table);
  /// Stores the rows in insert order (schema version 8: MariaDB's primary key becomes
  /// stream_id); nullptr where the engine does so already.
  void (*cluster_by_insert_order)(Connection& conn, const std::string& table) = nullptr;
  /// Indexes the RETRY and DEAD rows by status and type (schema version 13).
  void (*create_retry_dead_index)(Connection& conn, const std::string& table);
  std::shared_ptr<StreamStore> (*make_stream_store)(const std::string& table);
  /// Serializes migrations of one database: takes a lock (and begins the migration's transaction
  /// where DDL is transactional); unlock_migrations ends both, committing or not.
  void (*lock_migrations)(Connection& conn);
  void (*unlock_migrations)(Connection& conn, bool commit);
  /// What tells a poller of `table` that other connections committed (PostgreSQL LISTEN, SQLite
  /// data_version); nullptr when the engine has none (MariaDB: poll adaptively instead).
  std::unique_ptr<ChangeWatcher> (*make_change_watcher)(const std::string& url,
                                                        const std::string& table,
                                                        const NetworkTimeouts& timeouts) = nullptr;
};

/// Commits or rolls back `conn`'s transaction: unlock_migrations of engines whose lock is the
/// migration's transaction.
void finish_transaction(Connection& conn, bool commit);

}  // namespace outbox::sql

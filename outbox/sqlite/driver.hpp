#pragma once
// SQLite driver for the sql::Connection interface (libsqlite3; its header stays out of here).

#include <chrono>
#include <memory>
#include <string>

#include "outbox/sql/connection.hpp"
#include "outbox/sql/pool.hpp"

struct sqlite3;

namespace outbox::sqlite {

/// How connections to a database file are opened.
struct OpenOptions {
  std::chrono::milliseconds busy_timeout{10000};  ///< wait for locks held by other connections
  bool wal = true;                 ///< journal_mode=WAL (readers never block writers)
  bool synchronous_normal = true;  ///< synchronous=NORMAL (safe with WAL)
  bool create = true;              ///< false: a missing file is an error (tools that only read)
};

/// Opens (creating if needed, unless options.create is false) the database file. Throws
/// outbox::StoreError.
std::unique_ptr<sql::Connection> open(const std::string& path, const OpenOptions& options = {});

/// Wraps a caller-owned handle; the caller keeps ownership and must outlive the connection.
/// Applies nothing to the handle (the caller configures busy timeout and journal mode).
std::unique_ptr<sql::Connection> wrap(sqlite3* db);

/// A pool of connections to one file.
std::shared_ptr<sql::ConnectionPool> make_pool(const std::string& path, std::size_t max_size = 4,
                                               const OpenOptions& options = {});

}  // namespace outbox::sqlite

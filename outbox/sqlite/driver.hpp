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
  /// journal_size_limit: the WAL file is cut back to this after a checkpoint resets it.
  std::int64_t journal_size_limit = 64 * 1024 * 1024;
  /// SQLite's automatic checkpoint after a commit, in WAL pages (0: off). It keeps the WAL short:
  /// a pool's writers queue in the process, so the checkpoint a commit runs finishes before the
  /// next writer starts, which can then begin the WAL again from its start. With a SQLite that has
  /// the WAL-reset bug (before 3.51.3) the driver runs it instead, under the write lock (a
  /// `PRAGMA wal_autocheckpoint` run through the connection puts SQLite's own back).
  int wal_autocheckpoint = 1000;
  /// make_pool with WAL: how often a background thread checkpoints (0: never), when something was
  /// committed meanwhile. Readers that never pause keep the automatic checkpoints from resetting
  /// the WAL, which then grows without bound; this one waits briefly for them and truncates it.
  std::chrono::milliseconds checkpoint_interval{100};
  /// Truncating checkpoints start once the WAL holds this many pages (4 KiB each by default).
  int checkpoint_pages = 4096;
};

/// Opens (creating if needed, unless options.create is false) the database file. Throws
/// outbox::StoreError.
std::unique_ptr<sql::Connection> open(const std::string& path, const OpenOptions& options = {});

/// Wraps a caller-owned handle; the caller keeps ownership and must outlive the connection.
/// Applies nothing to the handle (the caller configures busy timeout and journal mode).
std::unique_ptr<sql::Connection> wrap(sqlite3* db);

/// A pool of connections to one file. Its connections queue in the process for SQLite's write
/// lock (no busy polling among themselves); with WAL and a checkpoint_interval, it owns the
/// background checkpointer (stopped when the last reference to the pool goes). A relative `path`
/// is made absolute first: connections opened later reach the same file after a chdir.
std::shared_ptr<sql::ConnectionPool> make_pool(const std::string& path, std::size_t max_size = 4,
                                               const OpenOptions& options = {});

}  // namespace outbox::sqlite

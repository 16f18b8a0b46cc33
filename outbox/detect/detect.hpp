#pragma once
// The engines this build has, and what picks one: a connection's dialect or a database URL.

#include <functional>
#include <memory>
#include <span>
#include <string>

#include "outbox/groups.hpp"
#include "outbox/json_codec.hpp"
#include "outbox/lease.hpp"
#include "outbox/purge.hpp"
#include "outbox/sql/engine.hpp"
#include "outbox/sql/pool.hpp"
#include "outbox/store.hpp"

namespace outbox {

/// Every engine in this build (sqlite, postgres, mysql when built).
std::span<const sql::Engine* const> engines();

/// The engine whose connections report `dialect`. Throws std::invalid_argument for an unknown
/// dialect or an engine not in this build.
const sql::Engine& engine_for(std::string_view dialect);

/// The OutboxStore for `conn`'s dialect (sqlite, postgres, mysql) on `table`. Server engines use
/// the database clock. Throws std::invalid_argument for an unknown or not-built dialect or a bad
/// table name.
std::shared_ptr<OutboxStore> detect_store(sql::Connection& conn,
                                          const std::string& table = "outbox_event",
                                          const JsonCodec& codec = JsonCodec::default_codec());

/// The status-based (DONE/DEAD) purger for `conn`'s dialect. Throws like detect_store.
std::shared_ptr<EventPurger> detect_purger(sql::Connection& conn,
                                           const std::string& table = "outbox_event");

/// The lease store (leader election, fencing) of `table` for `conn`'s dialect. Throws like
/// detect_store.
std::shared_ptr<LeaseStore> detect_lease_store(sql::Connection& conn,
                                               const std::string& table = "outbox_event");

/// The stream and subscriptions (stream mode) of `table` for `conn`'s dialect. Throws like
/// detect_store.
std::shared_ptr<StreamStore> detect_stream_store(sql::Connection& conn,
                                                 const std::string& table = "outbox_event");

/// The message groups of `table` for `conn`'s dialect, on the database clock where the engine has
/// one (as detect_store). Throws like detect_store.
std::shared_ptr<GroupStore> detect_group_store(sql::Connection& conn,
                                               const std::string& table = "outbox_event");

/// The schema version `outbox migrate` recorded for `table`; 0 when none was. Throws StoreError.
int schema_version(sql::Connection& conn, const std::string& table = "outbox_event");

/// Creates the outbox table and indexes for `conn`'s dialect (idempotent). Throws like
/// detect_store, and outbox::StoreError.
void create_schema_for(sql::Connection& conn, const std::string& table = "outbox_event");

/// Opens a connection pool for a database URL: `sqlite:///path/to.db`, `postgresql://…` /
/// `postgres://…` (or a libpq "key=value" string; password from PGPASSWORD), `mysql://…` /
/// `mariadb://…` (password from OUTBOX_DB_PASSWORD when the URL has none). Throws
/// std::invalid_argument for an unknown scheme or an engine not in this build, outbox::StoreError
/// when the first connection fails. With `create_sqlite_file` false a missing SQLite file is an
/// error instead of a new empty database (for tools that only read or change existing rows).
/// `timeouts` apply to PostgreSQL and MariaDB (a PostgreSQL URL's own settings win).
std::shared_ptr<sql::ConnectionPool> open_pool(const std::string& url, std::size_t max_size = 8,
                                               bool create_sqlite_file = true,
                                               const sql::NetworkTimeouts& timeouts = {});

/// The schema version this build creates.
inline constexpr int kSchemaVersion = 13;

/// Versions before and after a migrate() call.
struct MigrationResult {
  int from = 0;  ///< 0: the table had no recorded version
  int to = 0;
};

/// Called before each step of a migration with the version it brings and what it does; may
/// throw to stop the migration (as a failure would: see migrate).
using MigrationStep = std::function<void(int version, std::string_view what)>;

/// Creates or upgrades `table` to kSchemaVersion, recording the version per table in
/// `outbox_schema_version`. Idempotent. Throws std::invalid_argument for a bad table name or a
/// database newer than this build, outbox::StoreError on database errors. Stopped midway (a
/// failure, or `before_step` throwing), PostgreSQL and SQLite keep none of it (one transaction);
/// on MariaDB, whose DDL commits by itself, the steps done stay and the next run does them again
/// harmlessly (each is idempotent).
MigrationResult migrate(sql::Connection& conn, const std::string& table = "outbox_event",
                        const MigrationStep& before_step = {});

}  // namespace outbox

#pragma once
// The small SQL interface the stores speak. Drivers (SQLite, PostgreSQL, MySQL) implement it.

#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "outbox/sql/value.hpp"

namespace outbox {
class Savepoint;
}  // namespace outbox

namespace outbox::sql {

/// How long a network engine waits for its server before a call fails, so that nothing (a
/// claim, a status write, a relay's stop) hangs on a server that vanished.
struct NetworkTimeouts {
  std::chrono::milliseconds connect{10000};  ///< to establish a connection
  /// Idle time before TCP keepalive probes start (PostgreSQL; 3 probes 10 s apart follow).
  std::chrono::milliseconds keepalive_idle{30000};
  /// PostgreSQL: unacknowledged data (tcp_user_timeout); MariaDB: each read and each write.
  std::chrono::milliseconds io{30000};
};

/// One database connection. Not thread-safe: one thread at a time. Errors throw outbox::StoreError.
class Connection {
 public:
  virtual ~Connection() = default;

  /// Runs a statement with positional parameters in the engine's own syntax (`?` for SQLite and
  /// MySQL, `$1` for PostgreSQL); returns the number of rows changed. Without parameters the text
  /// may hold several statements.
  virtual std::int64_t execute(std::string_view sql, std::span<const Value> params) = 0;
  /// Runs a query with positional parameters (as execute) and returns every row.
  virtual std::vector<Row> query(std::string_view sql, std::span<const Value> params) = 0;
  /// Starts a transaction that takes the write lock at once where the engine distinguishes it.
  virtual void begin() = 0;
  virtual void commit() = 0;
  virtual void rollback() = 0;
  /// True between begin() and commit()/rollback().
  virtual bool in_transaction() const = 0;
  /// The SQL dialect: "sqlite", "postgres" or "mysql".
  virtual std::string_view dialect() const = 0;
  /// True when the database runs one writing transaction at a time (SQLite): writes are then
  /// cheapest when a thread that holds the write lock anyway makes them.
  virtual bool single_writer() const { return false; }
  /// True when the link to the server is lost; a pool then discards the connection.
  virtual bool is_broken() const { return false; }
  /// False when the session was changed in a way the next borrower would not expect (MariaDB:
  /// autocommit switched off); a pool then discards the connection.
  virtual bool session_reusable() const { return true; }
  /// Checks cheaply that a connection left idle for `idle_for` still reaches its server (a
  /// restarted server closed it meanwhile); a pool drops it and opens another instead of
  /// failing the borrower's first statement. Never throws.
  virtual bool alive(std::chrono::milliseconds /*idle_for*/) noexcept { return true; }
  /// True when a statement run through execute()/query() since the transaction began could have
  /// undone or ended part of it: its text holds a transaction-control word (SAVEPOINT, ROLLBACK,
  /// COMMIT, RELEASE, BEGIN, START, END, ABORT, CHAIN, PREPARE, EXECUTE, CALL, XA). OutboxWriter
  /// then checks after commit that each event's row exists before the hot path delivers it.
  bool transaction_suspect() const noexcept { return suspect_; }

  std::int64_t execute(std::string_view sql, std::initializer_list<Value> params = {}) {
    return execute(sql, std::span<const Value>(params.begin(), params.size()));
  }
  std::vector<Row> query(std::string_view sql, std::initializer_list<Value> params = {}) {
    return query(sql, std::span<const Value>(params.begin(), params.size()));
  }

 protected:
  /// Drivers call this with every statement text they run, and reset_suspect() in begin() (a
  /// wrapped caller-owned handle, whose transactions do not begin here, stays suspect once marked:
  /// that costs a check after each commit, never a missed undo).
  void track_statement(std::string_view sql) noexcept;
  void reset_suspect() noexcept { suspect_ = false; }

 private:
  // Savepoint runs its own statements without making the transaction suspect (it keeps its own
  // frame's callbacks in step, and marks the connection when it rolls back).
  friend class outbox::Savepoint;
  bool suspect_ = false;
};

class ConnectionPool;

/// A connection borrowed from a provider; returned (rolled back if a transaction is open) on
/// destruction. Move-only.
class PooledConnection {
 public:
  using Releaser = void (*)(void* owner, std::unique_ptr<Connection> conn, bool broken);

  /// `keep_alive` (optional) holds what `owner` points into until the connection is returned,
  /// so a connection may outlive the provider that lent it (`open_pool(url)->acquire()`).
  PooledConnection(std::unique_ptr<Connection> conn, void* owner, Releaser releaser,
                   std::shared_ptr<void> keep_alive = {})
      : conn_(std::move(conn)),
        owner_(owner),
        releaser_(releaser),
        keep_alive_(std::move(keep_alive)) {}
  PooledConnection(PooledConnection&& other) noexcept;
  PooledConnection& operator=(PooledConnection&& other) noexcept;
  PooledConnection(const PooledConnection&) = delete;
  PooledConnection& operator=(const PooledConnection&) = delete;
  ~PooledConnection();

  Connection& operator*() const noexcept { return *conn_; }
  Connection* operator->() const noexcept { return conn_.get(); }
  Connection& get() const noexcept { return *conn_; }
  /// Marks the connection unusable (after a lost link): it is closed instead of reused.
  void mark_broken() noexcept { broken_ = true; }

 private:
  void release() noexcept;
  std::unique_ptr<Connection> conn_;
  void* owner_ = nullptr;
  Releaser releaser_ = nullptr;
  std::shared_ptr<void> keep_alive_;
  bool broken_ = false;
};

/// Hands out short-lived connections outside business transactions. Thread-safe.
class ConnectionProvider {
 public:
  virtual ~ConnectionProvider() = default;
  /// Borrows a connection. Throws outbox::StoreError when none can be had in time.
  virtual PooledConnection acquire() = 0;
  /// A connection of its own for a background task that must not wait behind borrowers (the
  /// claim heartbeat), outside any size limit; nullptr when the provider cannot make one.
  /// Throws outbox::StoreError when the database refuses it.
  virtual std::unique_ptr<Connection> open_dedicated() { return nullptr; }
};

}  // namespace outbox::sql

#include "outbox/sqlite/driver.hpp"

#include <sqlite3.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>

#include "outbox/errors.hpp"
#include "outbox/log.hpp"
#include "outbox/sqlite/internal/wal_checkpointer.hpp"
#include "outbox/sqlite/internal/wal_guard.hpp"
#include "outbox/sqlite/internal/write_gate.hpp"

namespace outbox::sqlite {

using internal::WalCheckpointer;
using internal::WriteGate;

namespace {

// Statements are cached per SQL text; past this many the cache is emptied (multi-row inserts of
// varying sizes would otherwise grow it without bound).
constexpr std::size_t kMaxCachedStatements = 128;

class SqliteConnection final : public sql::Connection {
 public:
  SqliteConnection(sqlite3* db, bool owned) : db_(db), owned_(owned) {}
  ~SqliteConnection() override {
    release_gate();
    clear_cache();
    if (owned_) {
      sqlite3_close_v2(db_);
    }
  }
  SqliteConnection(const SqliteConnection&) = delete;
  SqliteConnection& operator=(const SqliteConnection&) = delete;

  using sql::Connection::execute;
  using sql::Connection::query;

  std::int64_t execute(std::string_view sql, std::span<const sql::Value> params) override {
    track_statement(sql);
    if (params.empty() && has_second_statement(sql)) {
      return execute_script(sql);
    }
    Statement st(*this, sql, params);
    GateForStatement gate(*this, st.stmt);
    for (;;) {
      int rc = sqlite3_step(st.stmt);
      if (rc == SQLITE_DONE) {
        break;
      }
      if (rc != SQLITE_ROW) {
        fail(rc, sql);
      }
    }
    return sqlite3_changes64(db_);
  }

  std::vector<sql::Row> query(std::string_view sql, std::span<const sql::Value> params) override {
    track_statement(sql);
    Statement st(*this, sql, params);
    GateForStatement gate(*this, st.stmt);
    std::vector<sql::Row> rows;
    for (;;) {
      int rc = sqlite3_step(st.stmt);
      if (rc == SQLITE_DONE) {
        break;
      }
      if (rc != SQLITE_ROW) {
        fail(rc, sql);
      }
      const int n = sqlite3_column_count(st.stmt);
      std::vector<sql::Value> values;
      values.reserve(static_cast<std::size_t>(n));
      for (int i = 0; i < n; ++i) {
        values.push_back(column(st.stmt, i));
      }
      rows.emplace_back(std::move(values));
    }
    return rows;
  }

  void begin() override {
    reset_suspect();
    const SettleGate settle{*this};
    take_gate();
    simple("BEGIN IMMEDIATE");
    begun_ = true;
    ended_by_error_ = false;
  }
  void commit() override {
    const SettleGate settle{*this};
    const bool begun = std::exchange(begun_, false);
    if (begun && sqlite3_get_autocommit(db_) != 0) {
      throw StoreError(ended_by_error_
                           ? "sqlite: COMMIT refused: SQLite rolled the transaction back after an "
                             "earlier error; nothing was committed"
                           : "sqlite: COMMIT refused: the transaction had already ended (a COMMIT "
                             "or ROLLBACK ran through the connection); statements after it were "
                             "autocommitted");
    }
    simple("COMMIT");
  }
  void rollback() override {
    const SettleGate settle{*this};
    const bool begun = std::exchange(begun_, false);
    if (begun && sqlite3_get_autocommit(db_) != 0) {
      if (ended_by_error_) {
        return;  // SQLite rolled it back already
      }
      throw StoreError(
          "sqlite: ROLLBACK impossible: the transaction had already been committed through the "
          "connection");
    }
    simple("ROLLBACK");
  }
  bool in_transaction() const override { return sqlite3_get_autocommit(db_) == 0; }

  // SQLite's own busy_timeout sleeps 1, 2, 5, 10 … 100 ms between tries; a writer holding the lock
  // for a few hundred microseconds then costs a waiting worker milliseconds. This handler retries
  // after 20 µs, doubling up to 1 ms, until the timeout is spent.
  void set_busy_timeout(std::chrono::milliseconds timeout) {
    busy_timeout_ = timeout;
    sqlite3_busy_handler(db_, &SqliteConnection::on_busy, this);
  }
  std::string_view dialect() const override { return "sqlite"; }
  bool single_writer() const override { return true; }

  void set_write_gate(std::shared_ptr<WriteGate> gate) { gate_ = std::move(gate); }
  void set_commit_checkpoints(std::shared_ptr<internal::CommitCheckpoints> record) {
    commit_checkpoints_ = std::move(record);
  }
  sqlite3* handle() const { return db_; }

  // SQLite's automatic checkpoint after a commit of `pages` or more WAL pages, run under the
  // write lock of a guard (internal/wal_guard.hpp). Only tried once: a write lock held elsewhere
  // leaves it to the next commit or the pool's checkpointer rather than stall this writer.
  void guard_checkpoints(int pages) {
    wal_guard_ = std::make_unique<internal::WalGuard>(db_);
    wal_pages_ = pages;
    sqlite3_wal_hook(db_, &SqliteConnection::on_wal_commit, this);
  }

 private:
  // The gate's wait counts against the busy timeout: SQLite's own wait after it gets only what
  // is left, so a statement gives up when it did without the gate. A thread that holds the gate
  // already (through another connection) does not wait for itself: the second write transaction
  // fails as it did without the gate.
  void take_gate() {
    if (gate_ && !holding_gate_) {
      waiting_since_ = std::chrono::steady_clock::now();
      holding_gate_ = gate_->take(busy_timeout_);
    }
  }
  void release_gate() {
    if (holding_gate_) {
      holding_gate_ = false;
      gate_->release();
    }
  }
  // Whatever ended the transaction (COMMIT, ROLLBACK, or SQLite rolling it back after an error),
  // the gate goes with it; the wait just spent no longer counts.
  struct SettleGate {
    SqliteConnection& c;
    ~SettleGate() {
      c.waiting_since_.reset();
      if (sqlite3_get_autocommit(c.db_) != 0) {
        c.release_gate();
      }
    }
  };
  // An autocommitted write (not a read) takes the gate for its own run.
  struct GateForStatement {
    GateForStatement(SqliteConnection& c, sqlite3_stmt* stmt) : settle{c} {
      if (c.gate_ && sqlite3_get_autocommit(c.db_) != 0 && !c.holding_gate_ &&
          sqlite3_stmt_readonly(stmt) == 0) {
        c.take_gate();
      }
    }
    SettleGate settle;
  };

  // True when `sql` holds a statement after its first (comments and blanks aside).
  bool has_second_statement(std::string_view sql) {
    if (sql.find(';') == std::string_view::npos) {
      return false;
    }
    sqlite3_stmt* first = nullptr;
    const char* tail = nullptr;
    if (sqlite3_prepare_v2(db_, sql.data(), static_cast<int>(sql.size()), &first, &tail) !=
        SQLITE_OK) {
      sqlite3_finalize(first);
      return false;  // the cached path reports the error
    }
    sqlite3_finalize(first);
    const std::string_view rest(tail, static_cast<std::size_t>(sql.data() + sql.size() - tail));
    sqlite3_stmt* second = nullptr;
    const bool more = sqlite3_prepare_v2(db_, rest.data(), static_cast<int>(rest.size()), &second,
                                         nullptr) != SQLITE_OK ||
                      second != nullptr;
    sqlite3_finalize(second);
    return more;
  }

  // Several statements without parameters (a migration, a script): run one after the other.
  std::int64_t execute_script(std::string_view sql) {
    const SettleGate settle{*this};
    if (sqlite3_get_autocommit(db_) != 0) {
      take_gate();
    }
    simple(std::string(sql).c_str());
    return sqlite3_changes64(db_);
  }

  // A cached statement bound for one call; reset (and unbound) when it goes out of scope.
  struct Statement {
    Statement(SqliteConnection& c, std::string_view sql, std::span<const sql::Value> params)
        : stmt(c.prepare(sql)) {
      const int expected = sqlite3_bind_parameter_count(stmt);
      if (expected != static_cast<int>(params.size())) {
        sqlite3_reset(stmt);
        throw StoreError("sqlite: statement expects " + std::to_string(expected) +
                         " parameters, got " + std::to_string(params.size()) + ": " +
                         std::string(sql));
      }
      for (std::size_t i = 0; i < params.size(); ++i) {
        c.bind(stmt, static_cast<int>(i + 1), params[i], sql);
      }
    }
    ~Statement() {
      sqlite3_reset(stmt);
      sqlite3_clear_bindings(stmt);
    }
    Statement(const Statement&) = delete;
    Statement& operator=(const Statement&) = delete;
    sqlite3_stmt* stmt;
  };

  [[noreturn]] void fail(int rc, std::string_view sql) {
    if (begun_ && sqlite3_get_autocommit(db_) != 0) {
      ended_by_error_ = true;  // SQLITE_FULL, IOERR, NOMEM, … may roll the whole transaction back
    }
    // Otherwise SQLite undid the failed statement alone: a transaction still open goes on.
    const bool usable = sqlite3_get_autocommit(db_) == 0;
    const std::string message = "sqlite error " + std::to_string(rc) + " (" + sqlite3_errstr(rc) +
                                "): " + sqlite3_errmsg(db_) + " [" +
                                std::string(sql.substr(0, 200)) + "]";
    const int extended = sqlite3_extended_errcode(db_);
    if (extended == SQLITE_CONSTRAINT_PRIMARYKEY || extended == SQLITE_CONSTRAINT_UNIQUE) {
      throw UniqueViolationError(message, {}, usable);
    }
    throw StoreError(message, {}, usable);
  }

  void simple(const char* sql) {
    char* err = nullptr;
    int rc = sqlite3_exec(db_, sql, nullptr, nullptr, &err);
    if (rc != SQLITE_OK) {
      if (begun_ && sqlite3_get_autocommit(db_) != 0) {
        ended_by_error_ = true;
      }
      std::string msg = err ? err : sqlite3_errstr(rc);
      sqlite3_free(err);
      throw StoreError(std::string("sqlite: ") + sql + " failed: " + msg);
    }
  }

  sqlite3_stmt* prepare(std::string_view sql) {
    if (begun_ && sqlite3_get_autocommit(db_) != 0) {
      // Run now, it would autocommit: an outbox row could then outlive a rollback of the rest.
      throw StoreError(std::string("sqlite: the transaction begun on this connection has already "
                                   "ended (") +
                       (ended_by_error_ ? "rolled back by SQLite after an error"
                                        : "a COMMIT or ROLLBACK ran through it") +
                       "); roll back and begin again [" + std::string(sql.substr(0, 200)) + "]");
    }
    auto it = cache_.find(sql);
    if (it != cache_.end()) {
      return it->second;
    }
    if (cache_.size() >= kMaxCachedStatements) {
      clear_cache();
    }
    sqlite3_stmt* stmt = nullptr;
    int rc = sqlite3_prepare_v3(db_, sql.data(), static_cast<int>(sql.size()),
                                SQLITE_PREPARE_PERSISTENT, &stmt, nullptr);
    if (rc != SQLITE_OK) {
      fail(rc, sql);
    }
    cache_.emplace(std::string(sql), stmt);
    return stmt;
  }

  void clear_cache() {
    for (auto& [sql, stmt] : cache_) {
      sqlite3_finalize(stmt);
    }
    cache_.clear();
  }

  void bind(sqlite3_stmt* stmt, int index, const sql::Value& v, std::string_view sql) {
    static const char kEmpty[] = "";
    auto bind_text = [&](std::string_view s) {
      return sqlite3_bind_text64(stmt, index, s.empty() ? kEmpty : s.data(), s.size(),
                                 SQLITE_STATIC, SQLITE_UTF8);
    };
    auto bind_blob = [&](const std::uint8_t* p, std::size_t n) {
      return n == 0 ? sqlite3_bind_zeroblob(stmt, index, 0)
                    : sqlite3_bind_blob64(stmt, index, p, n, SQLITE_STATIC);
    };
    int rc = std::visit(
        [&](const auto& x) -> int {
          using T = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<T, std::monostate>) {
            return sqlite3_bind_null(stmt, index);
          } else if constexpr (std::is_same_v<T, std::int64_t>) {
            return sqlite3_bind_int64(stmt, index, x);
          } else if constexpr (std::is_same_v<T, double>) {
            return sqlite3_bind_double(stmt, index, x);
          } else if constexpr (std::is_same_v<T, std::string>) {
            return bind_text(x);
          } else if constexpr (std::is_same_v<T, sql::TextRef>) {
            return bind_text(x.text);
          } else if constexpr (std::is_same_v<T, sql::Blob>) {
            return bind_blob(x.bytes.data(), x.bytes.size());
          } else {
            return bind_blob(x.bytes.data(), x.bytes.size());
          }
        },
        v);
    if (rc != SQLITE_OK) {
      fail(rc, sql);
    }
  }

  static sql::Value column(sqlite3_stmt* stmt, int i) {
    switch (sqlite3_column_type(stmt, i)) {
      case SQLITE_INTEGER:
        return sqlite3_column_int64(stmt, i);
      case SQLITE_FLOAT:
        return sqlite3_column_double(stmt, i);
      case SQLITE_TEXT: {
        const auto* p = reinterpret_cast<const char*>(sqlite3_column_text(stmt, i));
        return std::string(p, static_cast<std::size_t>(sqlite3_column_bytes(stmt, i)));
      }
      case SQLITE_BLOB: {
        const auto* p = static_cast<const std::uint8_t*>(sqlite3_column_blob(stmt, i));
        const auto n = static_cast<std::size_t>(sqlite3_column_bytes(stmt, i));
        return sql::Blob{std::vector<std::uint8_t>(p, p + n)};
      }
      default:
        return std::monostate{};
    }
  }

  static int on_wal_commit(void* self, sqlite3* db, const char* schema, int pages) {
    auto* c = static_cast<SqliteConnection*>(self);
    if (pages >= c->wal_pages_) {
      const auto frames = c->wal_guard_->checkpoint(db, schema, std::chrono::milliseconds(0));
      if (frames && c->commit_checkpoints_ && std::string_view(schema) == "main") {
        c->commit_checkpoints_->log = frames->log;
        c->commit_checkpoints_->at = std::chrono::steady_clock::now().time_since_epoch().count();
      }
    }
    return SQLITE_OK;
  }

  static int on_busy(void* self, int count) {
    auto* c = static_cast<SqliteConnection*>(self);
    const auto now = std::chrono::steady_clock::now();
    if (count == 0) {
      c->busy_since_ = c->waiting_since_.value_or(now);
    } else if (now - c->busy_since_ >= c->busy_timeout_) {
      return 0;  // give up: the statement fails with SQLITE_BUSY
    }
    const auto pause = std::chrono::microseconds(20L << std::min(count, 6));
    std::this_thread::sleep_for(
        std::min<std::chrono::microseconds>(pause, std::chrono::milliseconds(1)));
    return 1;
  }

  sqlite3* db_;
  bool owned_;
  std::shared_ptr<WriteGate> gate_;
  bool holding_gate_ = false;
  std::optional<std::chrono::steady_clock::time_point> waiting_since_;  // for the gate, then SQLite
  bool begun_ = false;           // between begin() and commit()/rollback()
  bool ended_by_error_ = false;  // SQLite rolled back the transaction begun here
  std::chrono::milliseconds busy_timeout_{0};
  std::chrono::steady_clock::time_point busy_since_;
  std::unique_ptr<internal::WalGuard> wal_guard_;                    // set by guard_checkpoints
  std::shared_ptr<internal::CommitCheckpoints> commit_checkpoints_;  // the pool's, if any
  int wal_pages_ = 0;
  struct SqlHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::unordered_map<std::string, sqlite3_stmt*, SqlHash, std::equal_to<>> cache_;
};

}  // namespace

std::unique_ptr<sql::Connection> open(const std::string& path, const OpenOptions& options) {
  sqlite3* db = nullptr;
  int rc = sqlite3_open_v2(
      path.c_str(), &db,
      SQLITE_OPEN_READWRITE | (options.create ? SQLITE_OPEN_CREATE : 0) | SQLITE_OPEN_NOMUTEX,
      nullptr);
  if (rc == SQLITE_CANTOPEN && !options.create && access(path.c_str(), F_OK) != 0) {
    sqlite3_close(db);
    throw StoreError("sqlite: no database at " + path + " (run `outbox migrate` first?)", "08001");
  }
  if (rc != SQLITE_OK) {
    std::string msg = db ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
    sqlite3_close_v2(db);
    throw StoreError("sqlite: cannot open '" + path + "': " + msg);
  }
  auto conn = std::make_unique<SqliteConnection>(db, true);
  conn->set_busy_timeout(options.busy_timeout);
  if (options.wal) {
    // Switching a new file to WAL can answer "database is locked" without calling the busy
    // handler while other connections open it at the same time (concurrent first starts or
    // migrations): retried within the busy timeout.
    const auto deadline = std::chrono::steady_clock::now() + options.busy_timeout;
    for (;;) {
      try {
        conn->query("PRAGMA journal_mode=WAL");
        break;
      } catch (const StoreError&) {
        if (std::chrono::steady_clock::now() >= deadline) {
          throw;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
  }
  if (options.synchronous_normal) {
    conn->execute("PRAGMA synchronous=NORMAL");
  }
  conn->query("PRAGMA journal_size_limit=" + std::to_string(options.journal_size_limit));
  // Whatever options.wal says: the file may be in WAL mode already, or put in it later.
  if (options.wal_autocheckpoint > 0 && internal::has_wal_reset_bug()) {
    conn->guard_checkpoints(options.wal_autocheckpoint);
  } else {
    conn->query("PRAGMA wal_autocheckpoint=" + std::to_string(options.wal_autocheckpoint));
  }
  return conn;
}

sqlite3* internal::handle_of(sql::Connection& conn) {
  return static_cast<SqliteConnection&>(conn).handle();
}

void internal::set_busy_wait(sql::Connection& conn, std::chrono::milliseconds wait) {
  static_cast<SqliteConnection&>(conn).set_busy_timeout(wait);
}

std::unique_ptr<sql::Connection> wrap(sqlite3* db) {
  if (db == nullptr) {
    throw std::invalid_argument("sqlite::wrap: null handle");
  }
  return std::make_unique<SqliteConnection>(db, false);
}

namespace {

struct CheckpointedPool {
  explicit CheckpointedPool(sql::ConnectionPool::Options pool_options)
      : pool(std::move(pool_options)) {}
  sql::ConnectionPool pool;
  std::unique_ptr<WalCheckpointer> checkpointer;  // destroyed first
};

}  // namespace

std::shared_ptr<sql::ConnectionPool> make_pool(const std::string& given, std::size_t max_size,
                                               const OpenOptions& options) {
  // Every connection, opened at any time, to the same file: a relative name would follow the
  // process's working directory.
  const std::string path = given.empty() || given == ":memory:" || given.rfind("file:", 0) == 0
                               ? given
                               : std::filesystem::absolute(given).string();
  const bool checkpointer = options.wal && options.checkpoint_interval.count() > 0;
  auto gate = std::make_shared<WriteGate>();
  auto commit_checkpoints = std::make_shared<internal::CommitCheckpoints>();
  sql::ConnectionPool::Options pool_options{
      .factory =
          [path, options, gate, commit_checkpoints] {
            auto conn = open(path, options);
            static_cast<SqliteConnection&>(*conn).set_write_gate(gate);
            static_cast<SqliteConnection&>(*conn).set_commit_checkpoints(commit_checkpoints);
            return conn;
          },
      .max_size = max_size,
  };
  if (!checkpointer) {
    return std::make_shared<sql::ConnectionPool>(std::move(pool_options));
  }
  auto holder = std::make_shared<CheckpointedPool>(std::move(pool_options));
  holder->checkpointer = std::make_unique<WalCheckpointer>(path, options, gate, commit_checkpoints);
  return std::shared_ptr<sql::ConnectionPool>(holder, &holder->pool);
}

}  // namespace outbox::sqlite

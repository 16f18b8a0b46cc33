#include "outbox/postgres/driver.hpp"

#include <libpq-fe.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <unordered_map>
#include <utility>

#include "outbox/errors.hpp"
#include "outbox/internal/redact.hpp"
#include "outbox/log.hpp"
#include "outbox/postgres/internal/native_connect.hpp"

namespace outbox::postgres {
namespace {

// Type OIDs of the result columns decoded natively (pg_type.h).
constexpr Oid kInt8 = 20;
constexpr Oid kInt2 = 21;
constexpr Oid kInt4 = 23;
constexpr Oid kBytea = 17;
constexpr std::size_t kMaxStatements = 128;

using ResultPtr = std::unique_ptr<PGresult, decltype(&PQclear)>;

int hex_value(char c) {
  if (c >= '0' && c <= '9') {
    return c - '0';
  }
  if (c >= 'a' && c <= 'f') {
    return c - 'a' + 10;
  }
  if (c >= 'A' && c <= 'F') {
    return c - 'A' + 10;
  }
  return -1;
}

class PgConnection final : public sql::Connection {
 public:
  PgConnection(PGconn* conn, bool owned) : conn_(conn), owned_(owned), instance_(++instances) {}
  ~PgConnection() override {
    if (owned_) {
      PQfinish(conn_);
    }
  }
  PgConnection(const PgConnection&) = delete;
  PgConnection& operator=(const PgConnection&) = delete;

  using sql::Connection::execute;
  using sql::Connection::query;

  std::int64_t execute(std::string_view sql, std::span<const sql::Value> params) override {
    track_statement(sql);
    auto res = run(sql, params);
    const char* n = PQcmdTuples(res.get());
    std::int64_t count = 0;
    if (n != nullptr && *n != '\0') {
      std::from_chars(n, n + std::char_traits<char>::length(n), count);
    }
    return count;
  }

  std::vector<sql::Row> query(std::string_view sql, std::span<const sql::Value> params) override {
    track_statement(sql);
    auto res = run(sql, params);
    const int rows = PQntuples(res.get());
    const int cols = PQnfields(res.get());
    std::vector<sql::Row> out;
    out.reserve(static_cast<std::size_t>(rows));
    for (int r = 0; r < rows; ++r) {
      std::vector<sql::Value> values;
      values.reserve(static_cast<std::size_t>(cols));
      for (int c = 0; c < cols; ++c) {
        values.push_back(value(res.get(), r, c));
      }
      out.emplace_back(std::move(values));
    }
    return out;
  }

  void begin() override {
    reset_suspect();
    run("BEGIN", {});
    begun_ = true;
  }
  void commit() override {
    const bool begun = std::exchange(begun_, false);
    const auto state = PQtransactionStatus(conn_);
    if (begun && state == PQTRANS_INERROR) {
      run("ROLLBACK", {});
      throw StoreError(
          "postgres: COMMIT refused: an earlier statement failed and aborted the transaction; "
          "it was rolled back, nothing was committed [SQLSTATE 25P02]",
          "25P02");
    }
    if (begun && state == PQTRANS_IDLE) {
      throw StoreError(
          "postgres: COMMIT refused: the transaction had already ended (a COMMIT or ROLLBACK "
          "ran through the connection); statements after it were autocommitted [SQLSTATE 25000]",
          "25000");
    }
    // A session already lost never receives the COMMIT (run throws ConnectionLostError): its
    // server rolled the transaction back. Lost while the COMMIT is on its way, nobody can tell.
    const bool sent = PQstatus(conn_) != CONNECTION_BAD;
    ResultPtr res(nullptr, &PQclear);
    try {
      res = run("COMMIT", {});
    } catch (const ConnectionLostError& e) {
      if (!sent) {
        throw;
      }
      throw CommitOutcomeUnknownError(
          std::string("postgres: the connection was lost during COMMIT: the transaction may or may "
                      "not have committed; ") +
              e.what(),
          e.sqlstate());
    }
    // An aborted transaction answers COMMIT with success and the tag ROLLBACK.
    if (std::string_view(PQcmdStatus(res.get())) == "ROLLBACK") {
      throw StoreError(
          "postgres: COMMIT rolled back: the transaction was aborted by an earlier error; "
          "nothing was committed [SQLSTATE 25P02]",
          "25P02");
    }
  }
  void rollback() override {
    begun_ = false;
    run("ROLLBACK", {});
  }
  bool in_transaction() const override {
    const auto s = PQtransactionStatus(conn_);
    return s == PQTRANS_INTRANS || s == PQTRANS_INERROR || s == PQTRANS_ACTIVE;
  }
  std::string_view dialect() const override { return "postgres"; }

  // Server notices (IF NOT EXISTS skips, a terminating backend's FATAL) go to our log, not
  // straight to the process's stderr; a FATAL one marks the session as ending. Our own
  // connections only: a caller's handle keeps the caller's processor.
  void take_notices() {
    PQsetNoticeProcessor(
        conn_,
        [](void* self, const char* message) {
          std::string text(message);
          while (!text.empty() && text.back() == '\n') {
            text.pop_back();
          }
          if (text.rfind("FATAL:", 0) == 0) {
            static_cast<PgConnection*>(self)->terminated_ = true;
          }
          log(LogLevel::Debug, "postgres: " + text);
        },
        this);
  }
  bool is_broken() const override { return PQstatus(conn_) == CONNECTION_BAD || terminated_; }
  bool alive(std::chrono::milliseconds) noexcept override {
    // Non-blocking: takes in what a restarted or stopping server sent (its FATAL termination
    // notice, which may come before the end of the stream does), then looks for that end.
    if (PQstatus(conn_) == CONNECTION_BAD || PQconsumeInput(conn_) == 0) {
      return false;
    }
    PQisBusy(conn_);  // parses what was read: a FATAL notice reaches take_notices()
    if (PQstatus(conn_) == CONNECTION_BAD || terminated_) {
      return false;
    }
    char byte;
    const ssize_t n = recv(PQsocket(conn_), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    return n > 0 || (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK));
  }

 private:
  [[noreturn]] void fail(const PGresult* res, std::string_view sql) const {
    std::string sqlstate;
    std::string message;
    if (res != nullptr) {
      if (const char* s = PQresultErrorField(res, PG_DIAG_SQLSTATE)) {
        sqlstate = s;
      }
      message = PQresultErrorMessage(res);
    }
    if (message.empty()) {
      message = PQerrorMessage(conn_);
    }
    while (!message.empty() && (message.back() == '\n' || message.back() == ' ')) {
      message.pop_back();
    }
    // Class 08 is a broken link; 57P01…57P05 are the FATAL errors a server ends a session with
    // (pg_terminate_backend, shutdown, crash, dropped database, idle timeout).
    const bool lost = PQstatus(conn_) == CONNECTION_BAD || terminated_ ||
                      sqlstate.starts_with("08") || sqlstate.starts_with("57P");
    if (lost && sqlstate.empty()) {
      sqlstate = "08006";  // connection_failure
    }
    const std::string text = "postgres: " + message +
                             (sqlstate.empty() ? "" : " [SQLSTATE " + sqlstate + "]") + " [" +
                             std::string(sql.substr(0, 200)) + "]";
    // Any error aborts PostgreSQL's transaction: none is left usable.
    if (lost) {
      throw ConnectionLostError(text, sqlstate);
    }
    if (sqlstate == "23505") {
      throw UniqueViolationError(text, sqlstate);
    }
    throw StoreError(text, sqlstate);
  }

  ResultPtr check(PGresult* raw, std::string_view sql) {
    ResultPtr res(raw, &PQclear);
    const auto status = res ? PQresultStatus(res.get()) : PGRES_FATAL_ERROR;
    if (status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK) {
      fail(res.get(), sql);
    }
    return res;
  }

  ResultPtr run(std::string_view sql, std::span<const sql::Value> params) {
    if (PQstatus(conn_) == CONNECTION_BAD) {
      fail(nullptr, sql);
    }
    if (begun_ && PQtransactionStatus(conn_) == PQTRANS_IDLE) {
      // Run now, it would autocommit: an outbox row could then outlive a rollback of the rest.
      throw StoreError(
          "postgres: the transaction begun on this connection has already ended (a "
          "COMMIT or ROLLBACK ran through it); roll back and begin again [" +
              std::string(sql.substr(0, 200)) + "]",
          "25000");
    }
    if (params.empty()) {
      // Simple protocol: allows several statements (schema scripts) and needs no preparation.
      return check(PQexec(conn_, std::string(sql).c_str()), sql);
    }
    // A generic plan assumes LIMIT $n returns a tenth of the table and may then sort the whole
    // backlog on every claim; such statements are planned per execution with the real limit.
    // A caller-owned session is the caller's: its pool may DISCARD ALL or PQreset it (and
    // PgBouncer may move it between backends), dropping named statements behind our back, so
    // wrapped connections never keep any.
    const bool plan_each_time = !owned_ || sql.find("LIMIT $") != std::string_view::npos;
    const std::string* name =
        plan_each_time ? nullptr : &prepare(sql, static_cast<int>(params.size()));
    // Text parameters must be NUL-terminated: keep owned copies alive for the call.
    std::vector<std::string> text(params.size());
    std::vector<const char*> values(params.size(), nullptr);
    std::vector<int> lengths(params.size(), 0);
    std::vector<int> formats(params.size(), 0);
    for (std::size_t i = 0; i < params.size(); ++i) {
      std::visit(
          [&](const auto& x) {
            using T = std::decay_t<decltype(x)>;
            if constexpr (std::is_same_v<T, std::monostate>) {
              values[i] = nullptr;
            } else if constexpr (std::is_same_v<T, std::int64_t> || std::is_same_v<T, double>) {
              text[i] = std::to_string(x);
              values[i] = text[i].c_str();
            } else if constexpr (std::is_same_v<T, std::string>) {
              values[i] = x.c_str();
            } else if constexpr (std::is_same_v<T, sql::TextRef>) {
              text[i] = std::string(x.text);
              values[i] = text[i].c_str();
            } else {
              // Blob / BlobRef: binary format, no copy.
              static const char kEmpty = 0;
              values[i] = x.bytes.empty() ? &kEmpty : reinterpret_cast<const char*>(x.bytes.data());
              lengths[i] = static_cast<int>(x.bytes.size());
              formats[i] = 1;
            }
          },
          params[i]);
    }
    if (plan_each_time) {
      return check(PQexecParams(conn_, std::string(sql).c_str(), static_cast<int>(params.size()),
                                nullptr, values.data(), lengths.data(), formats.data(), 0),
                   sql);
    }
    ResultPtr res(PQexecPrepared(conn_, name->c_str(), static_cast<int>(params.size()),
                                 values.data(), lengths.data(), formats.data(), 0),
                  &PQclear);
    if (statement_missing(res.get())) {
      // The session lost its prepared statements (DISCARD ALL, DEALLOCATE ALL): forget ours. In
      // a transaction the error has aborted it, so it is reported; otherwise run it again.
      statements_.clear();
      if (PQtransactionStatus(conn_) == PQTRANS_IDLE) {
        name = &prepare(sql, static_cast<int>(params.size()));
        return check(PQexecPrepared(conn_, name->c_str(), static_cast<int>(params.size()),
                                    values.data(), lengths.data(), formats.data(), 0),
                     sql);
      }
    }
    return check(res.release(), sql);
  }

  static bool statement_missing(const PGresult* res) {
    const char* state = res != nullptr ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : nullptr;
    return state != nullptr && std::string_view(state) == "26000";
  }

  const std::string& prepare(std::string_view sql, int nparams) {
    // A reset connection (PQreset) is a new server session without our statements.
    if (const int pid = PQbackendPID(conn_); pid != backend_pid_) {
      statements_.clear();
      backend_pid_ = pid;
    }
    auto it = statements_.find(sql);
    if (it != statements_.end()) {
      return it->second;
    }
    if (statements_.size() >= kMaxStatements) {
      // Multi-row inserts of varying sizes would grow the cache without bound.
      for (const auto& [text, statement] : statements_) {
        PGresult* r = PQexec(conn_, ("DEALLOCATE " + statement).c_str());
        PQclear(r);
      }
      statements_.clear();
    }
    // Unique per wrapper too: two wrappers of one caller-owned PGconn must not collide.
    std::string name =
        "outbox_" + std::to_string(instance_) + "_" + std::to_string(++statement_counter_);
    check(PQprepare(conn_, name.c_str(), std::string(sql).c_str(), nparams, nullptr), sql);
    return statements_.emplace(std::string(sql), std::move(name)).first->second;
  }

  static sql::Value value(const PGresult* res, int r, int c) {
    if (PQgetisnull(res, r, c)) {
      return std::monostate{};
    }
    const char* v = PQgetvalue(res, r, c);
    const auto len = static_cast<std::size_t>(PQgetlength(res, r, c));
    switch (PQftype(res, c)) {
      case kInt8:
      case kInt4:
      case kInt2: {
        std::int64_t n = 0;
        std::from_chars(v, v + len, n);
        return n;
      }
      case kBytea: {
        // Text-format bytea is hex: \x0a1b…
        sql::Blob blob;
        if (len >= 2 && v[0] == '\\' && v[1] == 'x') {
          blob.bytes.reserve((len - 2) / 2);
          for (std::size_t i = 2; i + 1 < len; i += 2) {
            blob.bytes.push_back(
                static_cast<std::uint8_t>(hex_value(v[i]) * 16 + hex_value(v[i + 1])));
          }
        }
        return blob;
      }
      default:
        return std::string(v, len);
    }
  }

  struct SqlHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };

  static inline std::atomic<std::uint64_t> instances{0};
  PGconn* conn_;
  bool owned_;
  bool begun_ = false;       // between begin() and commit()/rollback()
  bool terminated_ = false;  // the server announced the end of the session (FATAL notice)
  std::uint64_t instance_;
  std::uint64_t statement_counter_ = 0;  // names are never reused, even after DEALLOCATE
  int backend_pid_ = 0;                  // the server session statements_ belong to
  std::unordered_map<std::string, std::string, SqlHash, std::equal_to<>> statements_;
};

}  // namespace

namespace internal {

namespace {

// Calls `connect(keys, values)` with the driver's settings. Defaults first: the connection
// string, expanded after them, overrides any of them.
template <typename Connect>
PGconn* with_settings(const std::string& conninfo, const sql::NetworkTimeouts& timeouts,
                      const std::string& application_name, Connect connect) {
  const std::string connect_s =
      std::to_string(std::max<std::int64_t>(1, (timeouts.connect.count() + 999) / 1000));
  const std::string idle_s =
      std::to_string(std::max<std::int64_t>(1, (timeouts.keepalive_idle.count() + 999) / 1000));
  const std::string io_ms = std::to_string(timeouts.io.count());
  const char* keys[] = {"connect_timeout",
                        "keepalives",
                        "keepalives_idle",
                        "keepalives_interval",
                        "keepalives_count",
                        "tcp_user_timeout",
                        "dbname",
                        nullptr,
                        nullptr};
  const char* values[] = {connect_s.c_str(), "1",     idle_s.c_str(), "10", "3", io_ms.c_str(),
                          conninfo.c_str(),  nullptr, nullptr};
  if (!application_name.empty()) {  // before dbname, so the connection string overrides it
    keys[7] = keys[6];
    values[7] = values[6];
    keys[6] = "application_name";
    values[6] = application_name.c_str();
  }
  return connect(keys, values);
}

}  // namespace

pg_conn* start_native(const std::string& conninfo, const sql::NetworkTimeouts& timeouts,
                      const std::string& application_name) {
  return with_settings(conninfo, timeouts, application_name,
                       [](const char* const* keys, const char* const* values) {
                         return PQconnectStartParams(keys, values, 1);
                       });
}

pg_conn* open_native(const std::string& conninfo, const sql::NetworkTimeouts& timeouts,
                     const std::string& application_name) {
  PGconn* conn = with_settings(conninfo, timeouts, application_name,
                               [](const char* const* keys, const char* const* values) {
                                 return PQconnectdbParams(keys, values, 1);
                               });
  if (conn == nullptr) {
    throw StoreError("postgres: out of memory creating a connection");
  }
  if (PQstatus(conn) != CONNECTION_OK) {
    std::string msg = outbox::internal::redact_secrets(PQerrorMessage(conn), conninfo);
    PQfinish(conn);
    while (!msg.empty() && msg.back() == '\n') {
      msg.pop_back();
    }
    throw ConnectionLostError("postgres: cannot connect: " + msg, "08001");
  }
  return conn;
}

}  // namespace internal

std::unique_ptr<sql::Connection> connect(const std::string& conninfo,
                                         const sql::NetworkTimeouts& timeouts) {
  auto wrapped = std::make_unique<PgConnection>(internal::open_native(conninfo, timeouts), true);
  wrapped->take_notices();
  // The library's statements are short index reads and writes. A claim's 64-arm scan could still
  // pass jit_above_cost on the planner's estimates, and compiling it took longer than running it:
  // up to a fifth of the server's CPU in a grouped drain (docs/performance.md).
  wrapped->execute("SET jit = off");
  return wrapped;
}

std::unique_ptr<sql::Connection> wrap(pg_conn* conn) {
  if (conn == nullptr) {
    throw std::invalid_argument("postgres::wrap: null connection");
  }
  return std::make_unique<PgConnection>(conn, false);
}

std::shared_ptr<sql::ConnectionPool> make_pool(const std::string& conninfo, std::size_t max_size,
                                               const sql::NetworkTimeouts& timeouts) {
  return std::make_shared<sql::ConnectionPool>(sql::ConnectionPool::Options{
      .factory = [conninfo, timeouts] { return connect(conninfo, timeouts); },
      .max_size = max_size,
  });
}

}  // namespace outbox::postgres
